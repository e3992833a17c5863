//! Opening a unit: its header read and validated, and checked against what the plan assumed.

use super::*;

impl ReadTask {
    /// Opens unit `i` on a local file (read with positioned reads, batch by batch).
    pub fn open_local(&mut self, i: usize, path: &Path) -> Result<(), ReadError> {
        self.open = None;
        if self.verify_needed(i)? {
            self.verify_local(i, path)?;
        }
        let uri = self.unit(i)?.file.clone();
        let opened =
            SafetensorsFile::open(path).map_err(|e| ReadErrorKind::Format(e).in_file(&uri));
        self.finish_open(
            i,
            opened.map(|file| {
                Source::Local(Local {
                    file,
                    segments: BTreeMap::new(),
                })
            }),
        )
    }

    /// Opens unit `i` from its file's first `8 + N` bytes (prefix and header JSON).
    pub fn open_remote(&mut self, i: usize, prefix_and_header: &[u8]) -> Result<(), ReadError> {
        self.open = None;
        let unit = self.unit(i)?;
        let (uri, length) = (unit.file.clone(), unit.length);
        let fmt = |e| ReadErrorKind::Format(e).in_file(&uri);
        let parsed = header::check_prefix(prefix_and_header, length)
            .map_err(fmt)
            .and_then(|n| {
                let json = prefix_and_header
                    .get(PREFIX_LEN as usize..(PREFIX_LEN + n) as usize)
                    .ok_or_else(|| {
                        ReadErrorKind::Invalid(format!(
                            "{} bytes given, but the prefix and header are {} bytes",
                            prefix_and_header.len(),
                            PREFIX_LEN + n
                        ))
                        .in_file(&uri)
                    })?;
                header::parse_header(json, length).map_err(fmt)
            });
        self.finish_open(
            i,
            parsed.map(|header| {
                Source::Remote(Remote {
                    header,
                    length,
                    segments: BTreeMap::new(),
                    whole: None,
                })
            }),
        )
    }

    pub(super) fn finish_open(
        &mut self,
        i: usize,
        source: Result<Source, ReadError>,
    ) -> Result<(), ReadError> {
        let source = match source {
            Ok(s) => s,
            Err(e) if self.spec.ignore_corrupt && matches!(e.kind, ReadErrorKind::Format(_)) => {
                self.skipped.push(Excluded {
                    file: e.file.clone(),
                    reason: e.to_string(),
                });
                self.open = Some(Open {
                    unit: i,
                    source: None,
                    cursor: 0,
                    end: 0,
                    pending: None,
                });
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let h = source.header();
        self.bytes_read += PREFIX_LEN + h.header_len;
        let (cursor, end) = self.check(self.unit(i)?, h)?;
        self.open = Some(Open {
            unit: i,
            source: Some(source),
            cursor,
            end,
            pending: None,
        });
        Ok(())
    }

    /// Compares the header with the plan's assumptions; returns the unit's cursor range.
    pub(super) fn check(&self, unit: &Unit, h: &Header) -> Result<(u64, u64), ReadError> {
        let uri = unit.file.as_str();
        let changed = |msg: String| ReadErrorKind::Changed(msg).in_file(uri);
        if h.file_len() != unit.length {
            return Err(changed(format!(
                "it is {} bytes long, the plan listed {}",
                h.file_len(),
                unit.length
            )));
        }
        let ragged = ragged_columns(uri, h)?;
        let same = |t: &TensorAssumption| -> Result<(), ReadError> {
            if t.ragged.is_some() {
                // the values' length is the file's own; its offsets were checked with the rows
                let listed = ragged.contains(&t.name);
                return match h.tensor(&t.name) {
                    Some(a)
                        if listed && a.dtype == t.dtype && a.shape.get(1..) == t.shape.get(1..) =>
                    {
                        Ok(())
                    }
                    None => {
                        Err(ReadErrorKind::Changed("the tensor is missing".into()).at(uri, &t.name))
                    }
                    Some(a) => Err(ReadErrorKind::Changed(format!(
                        "the tensor is {} {:?}{}, the plan assumed a ragged column of {} with \
                         inner shape {:?}",
                        a.dtype,
                        a.shape,
                        if listed { "" } else { " and not ragged" },
                        t.dtype,
                        t.shape.get(1..).unwrap_or_default()
                    ))
                    .at(uri, &t.name)),
                };
            }
            match h.tensor(&t.name) {
                None => {
                    Err(ReadErrorKind::Changed("the tensor is missing".into()).at(uri, &t.name))
                }
                Some(a) if a.dtype != t.dtype || a.shape != t.shape => {
                    Err(ReadErrorKind::Changed(format!(
                        "the tensor is {} {:?}, the plan assumed {} {:?}",
                        a.dtype, a.shape, t.dtype, t.shape
                    ))
                    .at(uri, &t.name))
                }
                Some(_) => Ok(()),
            }
        };
        // Required tensors the plan assumed absent must still be absent.
        let absent = |tensors: &[TensorAssumption], names: &mut dyn Iterator<Item = &str>| {
            for name in names {
                if !tensors.iter().any(|t| t.name == name) && h.tensor(name).is_some() {
                    return Err(ReadErrorKind::Changed(
                        "the tensor exists but the plan found the file without it".into(),
                    )
                    .at(uri, name));
                }
            }
            Ok(())
        };
        let mismatch = || {
            invalid(format!(
                "unit of {uri} does not match the partition's {:?} layout",
                self.spec.layout
            ))
        };
        match (&unit.part, self.spec.layout) {
            (
                UnitPart::Sample {
                    start,
                    end,
                    samples,
                    padded_samples,
                    tensors,
                },
                RowLayout::Sample,
            ) => {
                let (s, p) = batch_samples(uri, h)?;
                if (s, p) != (*samples, *padded_samples) {
                    return Err(changed(format!(
                        "it has {s} samples and {p} padding rows, the plan assumed {samples} and {padded_samples}"
                    )));
                }
                if start > end || *end > s {
                    return Err(invalid(format!(
                        "unit rows [{start}, {end}) of {uri} are not within its {s} samples"
                    )));
                }
                tensors.iter().try_for_each(same)?;
                absent(
                    tensors,
                    &mut self
                        .spec
                        .columns
                        .iter()
                        .filter_map(|c| c.source.sample_target().map(|(t, _, _)| t)),
                )?;
                Ok((*start, *end))
            }
            (UnitPart::Tensors { tensors }, RowLayout::Tensor) => {
                tensors.iter().try_for_each(same)?;
                Ok((0, tensors.len() as u64))
            }
            (UnitPart::File { tensors }, RowLayout::File) => {
                tensors.iter().try_for_each(same)?;
                absent(
                    tensors,
                    &mut self.spec.columns.iter().filter_map(|c| match &c.source {
                        ColumnSource::Tensor { key, .. } => Some(key.as_str()),
                        _ => None,
                    }),
                )?;
                Ok((0, 1))
            }
            _ => Err(mismatch()),
        }
    }
}
