//! The scan's input partitions: output columns, pushed predicates, units of work packed into
//! partitions, and [`plan`].

use super::*;

pub(super) fn layout_name(layout: RowLayout) -> &'static str {
    match layout {
        RowLayout::Sample => "sample",
        RowLayout::Tensor => "tensor",
        RowLayout::File => "file",
    }
}

/// The per-file layout's own columns: a tensor of one of these names takes the column's place,
/// and the column becomes the hidden metadata column `_<name>`.
pub(super) const FILE_LAYOUT_COLUMNS: [&str; 5] =
    ["file", "metadata", "flags", "model_info", "sha256"];

/// The forensic report's columns of the per-tensor and per-file layouts, every field.
pub(super) fn forensic_columns() -> [OutputColumn; 3] {
    [
        OutputColumn {
            name: "flags".to_owned(),
            source: ColumnSource::Flags {
                fields: forensic_columns::all_fields(&forensic_columns::FLAG_FIELDS),
            },
        },
        OutputColumn {
            name: "model_info".to_owned(),
            source: ColumnSource::ModelInfo {
                fields: forensic_columns::all_fields(&forensic_columns::MODEL_INFO_FIELDS),
            },
        },
        OutputColumn {
            name: "sha256".to_owned(),
            source: ColumnSource::Sha256,
        },
    ]
}

pub(super) fn output_column(
    layout: RowLayout,
    all: &[OutputColumn],
    by_name: &HashMap<&str, &OutputColumn>,
    rc: &RequiredColumn,
) -> Result<OutputColumn, ReadError> {
    let Some(&found) = by_name.get(rc.name.as_str()) else {
        let names: Vec<&str> = all.iter().map(|c| c.name.as_str()).collect();
        return Err(ReadErrorKind::UnknownColumn {
            column: rc.name.clone(),
            layout: layout_name(layout),
            available: names.join(", "),
        }
        .in_scan());
    };
    let mut out = found.clone();
    if let (ColumnSource::Tensor { fields, .. }, Some(wanted)) = (&mut out.source, &rc.fields) {
        *fields = wanted
            .iter()
            .map(|f| {
                TensorField::from_name(f).ok_or_else(|| {
                    ReadError::new(
                        "",
                        Some(&rc.name),
                        ReadErrorKind::Invalid(format!(
                            "no field `{f}` in a Tensor Struct (data, shape, dtype)"
                        )),
                    )
                })
            })
            .collect::<Result<_, _>>()?;
    }
    let struct_fields = match &mut out.source {
        ColumnSource::Flags { fields } => Some((fields, &forensic_columns::FLAG_FIELDS[..])),
        ColumnSource::ModelInfo { fields } => {
            Some((fields, &forensic_columns::MODEL_INFO_FIELDS[..]))
        }
        _ => None,
    };
    if let (Some((fields, all)), Some(wanted)) = (struct_fields, &rc.fields) {
        forensic_columns::check_fields(&rc.name, wanted, all)
            .map_err(|m| ReadError::new("", Some(&rc.name), ReadErrorKind::Invalid(m)))?;
        *fields = wanted.clone();
    }
    Ok(out)
}

/// The pushed predicates, grouped by what they test.
#[derive(Default)]
pub(super) struct Filters<'a> {
    pub(super) file: Vec<&'a PredicateTest>,
    pub(super) key: Vec<&'a PredicateTest>,
    pub(super) dtype: Vec<&'a PredicateTest>,
}

impl PredicateTest {
    /// Whether `value` passes.
    pub fn test(&self, value: &str) -> bool {
        match self {
            PredicateTest::In(values) => values.iter().any(|v| v == value),
            PredicateTest::Prefix(prefixes) => {
                prefixes.iter().any(|p| value.starts_with(p.as_str()))
            }
        }
    }
}

pub(super) fn filters(
    layout: RowLayout,
    predicates: &[Predicate],
) -> Result<Filters<'_>, ReadError> {
    let mut f = Filters::default();
    for p in predicates {
        match (p.column.as_str(), layout) {
            ("file" | "_file", _) => f.file.push(&p.test),
            ("key", RowLayout::Tensor) => f.key.push(&p.test),
            ("dtype", RowLayout::Tensor) => f.dtype.push(&p.test),
            (other, _) => {
                return Err(ReadError::new(
                    "",
                    Some(other),
                    ReadErrorKind::Invalid(format!(
                    "a predicate on `{other}` cannot be pushed to the {} layout (only `file`{})",
                    layout_name(layout),
                    if layout == RowLayout::Tensor {
                        ", `key`, `dtype`"
                    } else {
                        ""
                    }
                )),
                ))
            }
        }
    }
    Ok(f)
}

pub(super) fn passes(tests: &[&PredicateTest], value: &str) -> bool {
    tests.iter().all(|t| t.test(value))
}

pub(super) fn assumption(t: &safetensors_spark_format::header::TensorInfo) -> TensorAssumption {
    TensorAssumption {
        name: t.name.clone(),
        dtype: t.dtype,
        shape: t.shape.clone(),
        ragged: None,
    }
}

/// Data bytes of one sample of `t` (whole tensor bytes / rows).
pub(super) fn sample_bytes(t: &TensorAssumption) -> u64 {
    let elements = t
        .shape
        .iter()
        .skip(1)
        .try_fold(1u64, |a, &d| a.checked_mul(d));
    elements
        .and_then(|e| t.dtype.checked_byte_len(e))
        .unwrap_or(u64::MAX)
}

pub(super) fn units(
    schema: &ScanSchema<'_>,
    tensor_files: &[TensorFile<'_>],
    columns: &[OutputColumn],
    filters: &Filters<'_>,
    max_bytes: u64,
) -> Vec<Unit> {
    let max_bytes = max_bytes.max(1);
    let mut out = Vec::new();
    match schema {
        ScanSchema::Sample { files, .. } => {
            let wanted: Vec<&str> = columns
                .iter()
                .filter_map(|c| c.source.sample_target().map(|(t, _, _)| t))
                .collect();
            for f in files {
                let uri = &f.entry.input.file;
                if f.samples == 0 || !passes(&filters.file, uri) {
                    continue;
                }
                let tensors: Vec<TensorAssumption> =
                    wanted.iter().filter_map(|n| f.tensor(n)).cloned().collect();
                let row_bytes = tensors.iter().fold(0u64, |a, t| {
                    a.saturating_add(match t.ragged {
                        Some(_) => f.ragged_row_bytes.get(&t.name).copied().unwrap_or(8),
                        None => sample_bytes(t),
                    })
                });
                let per_unit = max_bytes
                    .checked_div(row_bytes)
                    .map_or(f.samples, |n| n.max(1));
                let mut start = 0;
                while start < f.samples {
                    let end = start.saturating_add(per_unit).min(f.samples);
                    out.push(Unit {
                        file: uri.clone(),
                        length: f.entry.input.length,
                        part: UnitPart::Sample {
                            start,
                            end,
                            samples: f.samples,
                            padded_samples: f.padded,
                            tensors: tensors.clone(),
                        },
                        bytes: row_bytes.saturating_mul(end - start),
                    });
                    start = end;
                }
            }
        }
        ScanSchema::Tensor { .. } => {
            let reads = |dtype: Dtype| {
                columns
                    .iter()
                    .filter_map(|c| c.source.tensor_column())
                    .any(|c| c.reads_data(dtype))
            };
            for f in tensor_files {
                let uri = &f.entry.input.file;
                let mut group: Vec<TensorAssumption> = Vec::new();
                let mut group_bytes = 0u64;
                let mut flush = |group: &mut Vec<TensorAssumption>, bytes: &mut u64| {
                    if !group.is_empty() {
                        out.push(Unit {
                            file: uri.clone(),
                            length: f.entry.input.length,
                            part: UnitPart::Tensors {
                                tensors: std::mem::take(group),
                            },
                            bytes: *bytes,
                        });
                    }
                    *bytes = 0;
                };
                for (t, len) in &f.tensors {
                    let b = if reads(t.dtype) { *len } else { 0 };
                    if !group.is_empty() && b > 0 && group_bytes.saturating_add(b) > max_bytes {
                        flush(&mut group, &mut group_bytes);
                    }
                    group.push(t.clone());
                    group_bytes = group_bytes.saturating_add(b);
                }
                flush(&mut group, &mut group_bytes);
            }
        }
        ScanSchema::File { files, .. } => {
            for (e, h) in files {
                let uri = &e.input.file;
                if !passes(&filters.file, uri) {
                    continue;
                }
                let mut tensors = Vec::new();
                // the file's digest reads every byte of it
                let mut bytes = if columns.iter().any(|c| c.source == ColumnSource::Sha256) {
                    e.input.length
                } else {
                    0
                };
                for c in columns {
                    if let ColumnSource::Tensor { key, fields } = &c.source {
                        if let Some(t) = h.tensor(key) {
                            if fields.contains(&TensorField::Data) {
                                bytes = bytes.saturating_add(t.byte_len());
                            }
                            tensors.push(assumption(t));
                        }
                    }
                }
                out.push(Unit {
                    file: uri.clone(),
                    length: e.input.length,
                    part: UnitPart::File { tensors },
                    bytes,
                });
            }
        }
    }
    out
}

/// Spark's `FilePartition.maxSplitBytes`: `min(max_bytes, max(open_cost, total / min_partitions))`,
/// `total` being the selected bytes of every file plus `open_cost` per file. Below
/// `max_bytes` only for scans smaller than `min_partitions × max_bytes`, which would otherwise
/// fill a few partitions and leave cores idle.
pub(super) fn max_split_bytes(
    units: &[Unit],
    max_bytes: u64,
    open_cost: u64,
    min_partitions: u64,
) -> u64 {
    let mut files = HashSet::new();
    let total = units.iter().fold(0u64, |a, u| {
        let open = if files.insert(u.file.as_str()) {
            open_cost
        } else {
            0
        };
        a.saturating_add(u.bytes).saturating_add(open)
    });
    max_bytes.min(open_cost.max(total / min_partitions.max(1)))
}

/// Spark's `FilePartition.getFilePartitions`: largest first, a partition is closed when the
/// next unit would take it beyond `max_bytes`; every unit also costs `open_cost`.
pub(super) fn pack(mut units: Vec<Unit>, max_bytes: u64, open_cost: u64) -> Vec<Vec<Unit>> {
    units.sort_by_key(|u| std::cmp::Reverse(u.bytes.saturating_add(open_cost)));
    let mut parts = Vec::new();
    let mut current: Vec<Unit> = Vec::new();
    let mut size = 0u64;
    for u in units {
        if !current.is_empty() && size.saturating_add(u.bytes) > max_bytes {
            parts.push(std::mem::take(&mut current));
            size = 0;
        }
        size = size.saturating_add(u.bytes).saturating_add(open_cost);
        current.push(u);
    }
    if !current.is_empty() {
        parts.push(current);
    }
    parts
}

/// Plans the partitions.
///
/// Needs the headers [`describe`] needs (the column types are the whole scan's, whatever the
/// predicates) and those of the files it plans, or, for a key lookup, the index summaries
/// ([`Answer::NeedIndex`], module docs); validates `required` and `predicates` against the
/// layout, and drops files and tensors the predicates exclude: they appear in no unit and are
/// never opened.
pub fn plan(req: &PlanRequest) -> Result<Answer<Vec<PartitionSpec>>, ReadError> {
    let cat = catalog(&req.input, req.layout == RowLayout::File)?;
    let filters = filters(req.layout, &req.predicates)?;
    let mut files = Vec::new();
    if req.layout == RowLayout::Tensor {
        let indexed = match indexed_manifests(&cat, &filters).ready() {
            Ok(i) => i,
            Err(ask) => return Ok(ask),
        };
        files = match tensor_files(&cat, &filters, &indexed) {
            Answer::Ready(f) => f,
            Answer::NeedHeaders(mut need) => {
                // Ask in one round for the schema's headers too (files the predicates exclude).
                if let Answer::NeedHeaders(more) = scan_schema(&cat, req.layout)? {
                    need.extend(more);
                    need.sort();
                    need.dedup();
                }
                return Ok(Answer::NeedHeaders(need));
            }
            Answer::NeedIndex(dirs) => return Ok(Answer::NeedIndex(dirs)),
        };
    }
    let schema = match scan_schema(&cat, req.layout)?.ready() {
        Ok(s) => s,
        Err(ask) => return Ok(ask),
    };
    let all = schema.columns();
    if let Some(p) = req.predicates.iter().find(|p| {
        p.column == "file"
            && all
                .iter()
                .any(|c| c.name == "file" && c.source != ColumnSource::File)
    }) {
        return Err(ReadError::new(
            "",
            Some(&p.column),
            ReadErrorKind::Invalid(
                "`file` is a tensor column here; a predicate on the file's URI names `_file`"
                    .into(),
            ),
        ));
    }
    // by name: the per-file layout may have thousands of columns, all of them required
    let by_name: HashMap<&str, &OutputColumn> =
        all.iter().rev().map(|c| (c.name.as_str(), c)).collect();
    let columns = req
        .required
        .iter()
        .map(|rc| output_column(req.layout, &all, &by_name, rc))
        .collect::<Result<Vec<_>, _>>()?;
    let mut planned = units(&schema, &files, &columns, &filters, req.max_partition_bytes);
    let split = max_split_bytes(
        &planned,
        req.max_partition_bytes,
        req.open_cost_bytes,
        req.min_partitions,
    );
    if split < req.max_partition_bytes {
        // A file's selected bytes do not depend on how it is split: `total` stays the same.
        planned = units(&schema, &files, &columns, &filters, split);
    }
    // the files of datasets whose manifest records their CRC-32C (others: no check)
    let mut recorded: HashMap<String, ShardChecksum> = HashMap::new();
    if req.verify_checksums {
        for m in &cat.manifests {
            for s in &m.manifest.shards {
                if let Some(crc) = &s.crc32c {
                    recorded.insert(
                        format!("{}/{}", m.dir, s.shard_path),
                        ShardChecksum {
                            crc32c: crc.clone(),
                            bytes: s.bytes,
                        },
                    );
                }
            }
        }
    }
    // row provenance: the version that added each shard, where its manifest records it
    let mut added: HashMap<String, u64> = HashMap::new();
    if columns
        .iter()
        .any(|c| c.source == ColumnSource::AddedVersion)
    {
        for m in &cat.manifests {
            for s in &m.manifest.shards {
                if let Some(v) = s.added_version {
                    added.insert(format!("{}/{}", m.dir, s.shard_path), v);
                }
            }
        }
    }
    let specs = pack(planned, split, req.open_cost_bytes)
        .into_iter()
        .map(|units| PartitionSpec {
            added_versions: units
                .iter()
                .filter_map(|u| added.get(&u.file).map(|v| (u.file.clone(), *v)))
                .collect(),
            checksums: units
                .iter()
                .filter_map(|u| recorded.get(&u.file).map(|c| (u.file.clone(), c.clone())))
                .collect(),
            layout: req.layout,
            columns: columns.clone(),
            bytes: units.iter().fold(0u64, |a, u| a.saturating_add(u.bytes)),
            units,
            batch_rows: req.batch_rows,
            batch_bytes: req.batch_bytes,
            ignore_corrupt: req.input.ignore_corrupt,
        })
        .collect();
    Ok(Answer::Ready(specs))
}
