//! The byte ranges of the next batch: the step planned from the unit, coalesced ranges (gaps read
//! through within a budget), bytes supplied by the JVM for a remote file.

use super::*;

/// Sorted, merged (overlapping or adjacent), non-empty ranges.
pub(super) fn coalesce(mut ranges: Vec<Range<u64>>) -> Vec<Range<u64>> {
    ranges.retain(|r| r.start < r.end);
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// Largest gap between two needed ranges of a remote file that is read through rather than
/// skipped: one request of up to 1 MiB more costs less than a second request on an object store
/// (a GET's latency is that of transferring about 1 MiB on one connection), the distance other
/// engines merge at too (e.g. Trino's ORC/Parquet readers).
pub const REMOTE_GAP: u64 = 1 << 20;

/// Sorted, disjoint `ranges` with the gaps of at most `gap` bytes between neighbours read
/// through, smallest gaps first, as long as the bytes read through stay at most the bytes the
/// ranges hold: a batch never fetches more than twice what it needs (memory stays about one
/// batch), and a wide layout of small tensors is not read whole.
pub(super) fn read_through_gaps(ranges: Vec<Range<u64>>, gap: u64) -> Vec<Range<u64>> {
    let mut budget = total(&ranges);
    let mut gaps: Vec<(u64, usize)> = ranges
        .windows(2)
        .enumerate()
        .map(|(i, w)| (w[1].start.saturating_sub(w[0].end), i))
        .filter(|&(g, _)| g <= gap)
        .collect();
    gaps.sort_unstable();
    let mut join = vec![false; ranges.len()];
    for (g, i) in gaps {
        if g > budget {
            break;
        }
        budget -= g;
        join[i] = true;
    }
    let mut out: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for (i, r) in ranges.into_iter().enumerate() {
        match out.last_mut() {
            Some(last) if i > 0 && join[i - 1] => last.end = r.end,
            _ => out.push(r),
        }
    }
    out
}

pub(super) fn total(ranges: &[Range<u64>]) -> u64 {
    ranges.iter().map(|r| r.end - r.start).sum()
}

/// Per-row (or per-item) cost against the 32-bit offset limit: lowers `*max` to the items
/// that fit; an error when one item alone does not fit.
pub(super) fn fit(
    max: &mut u64,
    per_item: u64,
    what: &'static str,
    err: impl Fn(ReadErrorKind) -> ReadError,
) -> Result<(), ReadError> {
    if per_item > MAX_OFFSET {
        return Err(err(ReadErrorKind::TooLarge {
            what,
            count: per_item,
            limit: MAX_OFFSET,
        }));
    }
    if let Some(n) = MAX_OFFSET.checked_div(per_item) {
        *max = (*max).min(n);
    }
    Ok(())
}

impl ReadTask {
    /// The next batch's extent and byte ranges (`None` when the unit is done).
    pub(super) fn next_step(&self) -> Result<Option<Step>, ReadError> {
        let Some(open) = &self.open else {
            return Err(invalid("no unit is open".into()));
        };
        let Some(source) = &open.source else {
            return Ok(None);
        };
        if open.cursor >= open.end {
            return Ok(None);
        }
        let unit = self.unit(open.unit)?;
        let uri = unit.file.as_str();
        let h = source.header();
        let from = open.cursor;
        let batch_rows = self.spec.batch_rows.max(1);
        let mut ranges = Vec::new();
        let mut whole_file_digest = false;
        let mut offsets_only = false;
        let to = match self.spec.layout {
            RowLayout::Sample => {
                let mut max = batch_rows;
                let mut row_bytes = 0u64;
                let mut present = Vec::new();
                let mut ragged = Vec::new();
                for c in &self.spec.columns {
                    match &c.source {
                        ColumnSource::Sample { tensor, .. } => {
                            let Some(info) = h.tensor(tensor) else {
                                continue;
                            };
                            let at = |e: ReadErrorKind| e.at(uri, tensor);
                            if c.source.is_ragged() {
                                let name = ragged_offsets_name(tensor);
                                let offsets = h.tensor(&name).ok_or_else(|| {
                                    at(ReadErrorKind::RaggedOffsets(format!(
                                        "the offsets tensor `{name}` is missing"
                                    )))
                                })?;
                                ragged.push(offsets);
                                continue;
                            }
                            let rows = info.shape.first().copied().unwrap_or(0);
                            let one = row_byte_range(info, 0..rows.min(1)).map_err(at)?;
                            let bytes = one.end - one.start;
                            row_bytes = row_bytes.saturating_add(bytes);
                            let (_, target, _) = c
                                .source
                                .sample_target()
                                .ok_or_else(|| invalid(String::new()))?;
                            let per_row = match target {
                                SampleTarget::Bytes | SampleTarget::Text => bytes,
                                // The largest list level: rows · s1 · … · sj.
                                SampleTarget::Values(_) => {
                                    let mut p = 1u64;
                                    let mut m = 0u64;
                                    for &d in info.shape.iter().skip(1) {
                                        p = p.saturating_mul(d);
                                        m = m.max(p);
                                    }
                                    m
                                }
                            };
                            fit(&mut max, per_row, "list elements or bytes per sample", at)?;
                            present.push(info);
                        }
                        ColumnSource::File => {
                            fit(&mut max, uri.len() as u64, "file name bytes", |e| {
                                e.in_file(uri)
                            })?
                        }
                        ColumnSource::Metadata => {
                            fit(&mut max, metadata_size(h), "metadata bytes", |e| {
                                e.in_file(uri)
                            })?
                        }
                        _ => {}
                    }
                }
                if let Some(n) = self.spec.batch_bytes.checked_div(row_bytes) {
                    max = max.min(n.max(1));
                }
                let to = from.saturating_add(max).min(open.end);
                if ragged.is_empty() {
                    for info in present {
                        let r =
                            row_byte_range(info, from..to).map_err(|e| e.at(uri, &info.name))?;
                        ranges.push(absolute(h, info, &r));
                    }
                } else {
                    offsets_only = true;
                    for info in ragged {
                        for r in ragged_offsets_ranges(info, &(from..to)) {
                            ranges.push(absolute(h, info, &r));
                        }
                    }
                }
                to
            }
            RowLayout::Tensor => {
                let UnitPart::Tensors { tensors } = &unit.part else {
                    return Err(invalid(format!("unit of {uri} is not a per-tensor unit")));
                };
                let cols: Vec<TensorColumn> = self
                    .spec
                    .columns
                    .iter()
                    .filter_map(|c| c.source.tensor_column())
                    .collect();
                let has = |want: fn(&TensorColumn) -> bool| cols.iter().any(want);
                let (data, decoded) = (
                    has(|c| matches!(c, TensorColumn::Data)),
                    has(|c| matches!(c, TensorColumn::Decoded(_))),
                );
                let (file_col, key_col, dtype_col, meta_col) = (
                    has(|c| matches!(c, TensorColumn::File)),
                    has(|c| matches!(c, TensorColumn::Key)),
                    has(|c| matches!(c, TensorColumn::Dtype)),
                    has(|c| matches!(c, TensorColumn::Metadata)),
                );
                // The file's flags and model information repeat on every row: their text,
                // computed once per batch.
                let forensic_size =
                    if has(|c| matches!(c, TensorColumn::Flags(_) | TensorColumn::ModelInfo(_))) {
                        forensic_columns::text_size(
                            &forensic_columns::flags_of(h),
                            &forensic_columns::model_info_of(h),
                        )
                    } else {
                        0
                    };
                // Totals per 32-bit-offset column: data, decoded, file, key, dtype, shape,
                // metadata, flags and model information.
                let mut totals = [0u64; 8];
                let mut bytes = 0u64;
                let mut to = from;
                while to < open.end && to - from < batch_rows {
                    let name = tensors
                        .get(to as usize)
                        .map(|t| t.name.as_str())
                        .unwrap_or_default();
                    let info = h
                        .tensor(name)
                        .ok_or_else(|| ReadErrorKind::MissingTensor.at(uri, name))?;
                    let reads = cols.iter().any(|c| c.reads_data(info.dtype));
                    let costs = [
                        if data { info.byte_len() } else { 0 },
                        if decoded && crate::read::spark_element(info.dtype).is_some() {
                            info.element_count()
                        } else {
                            0
                        },
                        if file_col { uri.len() as u64 } else { 0 },
                        if key_col { name.len() as u64 } else { 0 },
                        if dtype_col {
                            info.dtype.name().len() as u64
                        } else {
                            0
                        },
                        info.shape.len() as u64,
                        if meta_col { metadata_size(h) } else { 0 },
                        forensic_size,
                    ];
                    let mut one = u64::MAX;
                    for c in costs {
                        fit(&mut one, c, "bytes or elements", |e| e.at(uri, name))?;
                    }
                    let b = if reads { info.byte_len() } else { 0 };
                    let over_offsets = totals.iter().zip(costs).any(|(t, c)| t + c > MAX_OFFSET);
                    if to > from
                        && (over_offsets || bytes.saturating_add(b) > self.spec.batch_bytes)
                    {
                        break;
                    }
                    for (t, c) in totals.iter_mut().zip(costs) {
                        *t += c;
                    }
                    bytes = bytes.saturating_add(b);
                    if reads {
                        ranges.push(absolute(h, info, &(0..info.byte_len())));
                    }
                    to += 1;
                }
                to
            }
            RowLayout::File => {
                whole_file_digest = self
                    .spec
                    .columns
                    .iter()
                    .any(|c| c.source == ColumnSource::Sha256);
                for c in &self.spec.columns {
                    if let ColumnSource::Tensor { key, fields } = &c.source {
                        if let Some(info) = h.tensor(key) {
                            if fields.contains(&TensorField::Data) {
                                let mut one = u64::MAX;
                                fit(&mut one, info.byte_len(), "data bytes", |e| e.at(uri, key))?;
                                ranges.push(absolute(h, info, &(0..info.byte_len())));
                            }
                        }
                    }
                }
                from + 1
            }
        };
        Ok(Some(Step {
            from,
            to,
            ranges: coalesce(ranges),
            whole_file_digest,
            offsets_only,
        }))
    }

    /// Completes a step whose offsets are read ([`Step::offsets_only`]): validates the offsets
    /// of rows `from..to`, lowers `to` so that the batch keeps `batch_bytes` (at least one row)
    /// and Arrow's 32-bit offsets (a row alone beyond them is an error naming it), and adds the
    /// ranges of the fixed columns' rows and of the values those rows span. Returns the ranges
    /// added.
    pub(super) fn resolve(&self, step: &mut Step) -> Result<Vec<Range<u64>>, ReadError> {
        let (Some(open), Ok(unit)) = (
            &self.open,
            self.unit(self.open.as_ref().map_or(0, |o| o.unit)),
        ) else {
            return Err(invalid("no unit is open".into()));
        };
        let Some(source) = &open.source else {
            return Ok(Vec::new());
        };
        let uri = unit.file.as_str();
        let h = source.header();
        let view = View {
            name: uri,
            source,
            reads: RefCell::new(Vec::new()),
        };
        let (from, provisional) = (step.from, step.to);
        let mut fixed = Vec::new();
        let mut fixed_row_bytes = 0u64;
        // per ragged column: values tensor, row offsets, per-row cost against the 32-bit offsets
        let mut ragged = Vec::new();
        for c in &self.spec.columns {
            let Some((tensor, target, _)) = c.source.sample_target() else {
                continue;
            };
            let Some(info) = h.tensor(tensor) else {
                continue;
            };
            if !c.source.is_ragged() {
                let one = row_byte_range(info, 0..1).map_err(|e| e.at(uri, tensor))?;
                fixed_row_bytes = fixed_row_bytes.saturating_add(one.end - one.start);
                fixed.push(info);
                continue;
            }
            let off = ragged_offsets(&view, tensor, from..provisional)?;
            let inner: u64 = info.shape.iter().skip(1).product();
            let element_bytes = info.dtype.checked_byte_len(inner).unwrap_or(0);
            let per_element = match target {
                SampleTarget::Values(_) => inner.max(1),
                SampleTarget::Bytes | SampleTarget::Text => element_bytes.max(1),
            };
            ragged.push((tensor, info, off, element_bytes, per_element, 0u64));
        }
        let mut to = from;
        let mut bytes = 0u64;
        while to < provisional {
            let i = (to - from) as usize;
            let mut row = fixed_row_bytes;
            let mut fits = true;
            for (tensor, _, off, element_bytes, per_element, count) in &ragged {
                let elements = off[i + 1] - off[i];
                row = row.saturating_add(elements.saturating_mul(*element_bytes));
                let items = elements.saturating_mul(*per_element);
                if items > MAX_OFFSET {
                    return Err(ReadErrorKind::TooLarge {
                        what: "list elements or bytes in one row",
                        count: items,
                        limit: MAX_OFFSET,
                    }
                    .at(uri, tensor));
                }
                fits &= count + items <= MAX_OFFSET;
            }
            if to > from && (!fits || bytes.saturating_add(row) > self.spec.batch_bytes) {
                break;
            }
            for (_, _, off, _, per_element, count) in &mut ragged {
                *count += (off[i + 1] - off[i]).saturating_mul(*per_element);
            }
            bytes = bytes.saturating_add(row);
            to += 1;
        }
        let mut added = Vec::new();
        for info in fixed {
            let r = row_byte_range(info, from..to).map_err(|e| e.at(uri, &info.name))?;
            added.push(absolute(h, info, &r));
        }
        for (tensor, info, off, ..) in &ragged {
            let r = ragged_values_range(info, &off[..=(to - from) as usize]).ok_or_else(|| {
                ReadErrorKind::Invalid(format!(
                    "rows of {} {:?} are not a whole number of bytes",
                    info.dtype, info.shape
                ))
                .at(uri, tensor)
            })?;
            added.push(absolute(h, info, &r));
        }
        let added = coalesce(added);
        step.to = to;
        step.offsets_only = false;
        step.ranges = coalesce(step.ranges.iter().cloned().chain(added.clone()).collect());
        Ok(added)
    }

    /// Absolute byte ranges of the current file the next batch needs (empty when none).
    ///
    /// With ragged columns a batch takes two rounds: first the offsets its rows need, then (once
    /// they are supplied) the values they span and the other columns' bytes; callers ask until
    /// the answer is empty.
    pub fn needed_ranges(&mut self) -> Result<Vec<Range<u64>>, ReadError> {
        let mut step = self.next_step_cached()?;
        let pending_offsets = self
            .open
            .as_ref()
            .and_then(|o| o.pending.as_ref())
            .is_some_and(|s| s.offsets_only);
        if let (
            true,
            Some(Open {
                source: Some(Source::Remote(r)),
                ..
            }),
        ) = (pending_offsets, &self.open)
        {
            let missing: Vec<Range<u64>> =
                step.iter().flatten().flat_map(|x| r.uncovered(x)).collect();
            if !missing.is_empty() {
                return Ok(read_through_gaps(missing, REMOTE_GAP));
            }
            let mut pending = self.open.as_mut().and_then(|o| o.pending.take());
            let resolved = match pending.as_mut() {
                Some(p) => self.resolve(p).map(|_| p.ranges.clone()),
                None => Ok(Vec::new()),
            };
            if let Some(open) = self.open.as_mut() {
                open.pending = pending;
            }
            step = Some(resolved?);
        }
        let Some(open) = &self.open else {
            return Ok(Vec::new());
        };
        let whole = open.pending.as_ref().is_some_and(|s| s.whole_file_digest);
        match (&open.source, step) {
            // the file's digest streams every byte once, in order; the batch's other columns
            // keep what they need of them (`supply`)
            (Some(Source::Remote(r)), Some(_)) if whole => Ok(match &r.whole {
                Some(d) if d.digest.is_some() => Vec::new(),
                Some(d) => std::iter::once(d.pos..r.length).collect(),
                None => std::iter::once(0..r.length).collect(),
            }),
            (Some(Source::Remote(r)), Some(ranges)) => Ok(read_through_gaps(
                ranges.iter().flat_map(|x| r.uncovered(x)).collect(),
                REMOTE_GAP,
            )),
            _ => Ok(Vec::new()),
        }
    }

    /// Computes (once) the pending step; returns its ranges.
    pub(super) fn next_step_cached(&mut self) -> Result<Option<Vec<Range<u64>>>, ReadError> {
        let has_pending = self.open.as_ref().is_some_and(|o| o.pending.is_some());
        if !has_pending {
            let step = self.next_step()?;
            if let Some(open) = &mut self.open {
                open.pending = step;
            }
        }
        Ok(self
            .open
            .as_ref()
            .and_then(|o| o.pending.as_ref())
            .map(|s| s.ranges.clone()))
    }

    /// Bytes of the current file starting at absolute offset `start`.
    pub fn supply(&mut self, start: u64, bytes: Vec<u8>) -> Result<(), ReadError> {
        let uri = self
            .open
            .as_ref()
            .and_then(|o| self.spec.units.get(o.unit))
            .map(|u| u.file.clone())
            .unwrap_or_default();
        let Some(Open {
            source: Some(Source::Remote(r)),
            pending,
            ..
        }) = &mut self.open
        else {
            return Err(invalid("supply needs an open remote unit".into()));
        };
        let end = start.checked_add(bytes.len() as u64);
        if end.is_none_or(|e| e > r.length) {
            return Err(ReadErrorKind::Invalid(format!(
                "{} bytes supplied at offset {start} lie beyond the file's {} bytes",
                bytes.len(),
                r.length
            ))
            .in_file(&uri));
        }
        self.bytes_read += bytes.len() as u64;
        let end = start + bytes.len() as u64;
        let mut needed = true;
        if let Some(step) = pending.as_ref().filter(|s| s.whole_file_digest) {
            let d = r.whole.get_or_insert_with(|| StreamedDigest {
                hasher: Sha256::new(),
                pos: 0,
                digest: None,
            });
            if d.digest.is_none() {
                if start != d.pos {
                    return Err(ReadErrorKind::Invalid(format!(
                        "bytes supplied at offset {start}; the file's digest needs offset {} next",
                        d.pos
                    ))
                    .in_file(&uri));
                }
                d.hasher.update(&bytes);
                d.pos = end;
                if d.pos == r.length {
                    d.digest = Some(hash::hex(&std::mem::take(&mut d.hasher).finalize()));
                }
            }
            needed = step.ranges.iter().any(|x| x.start < end && start < x.end);
        }
        let keep = needed
            && r.segments
                .get(&start)
                .is_none_or(|old| old.len() < bytes.len());
        if keep {
            r.segments.insert(start, bytes);
        }
        Ok(())
    }
}
