//! The scan's schema: the layouts' Spark columns from manifests and headers, and [`describe`].

use super::*;
/// What the per-sample layout needs of one shard.
pub(super) struct SampleFile<'a> {
    pub(super) entry: &'a Entry<'a>,
    pub(super) samples: u64,
    pub(super) padded: u64,
    /// In the file's column order (manifest `tensors` order, else header order); a ragged
    /// column once (its offsets tensor is no column).
    pub(super) tensors: Vec<TensorAssumption>,
    /// Estimated data bytes of one row of each ragged column (values and offsets).
    pub(super) ragged_row_bytes: HashMap<String, u64>,
}

impl SampleFile<'_> {
    pub(super) fn tensor(&self, name: &str) -> Option<&TensorAssumption> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

pub(super) struct SampleColumn {
    pub(super) name: String,
    pub(super) element: ElementType,
    pub(super) rank: usize,
    pub(super) ragged: bool,
}

pub(super) enum ScanSchema<'a> {
    Sample {
        columns: Vec<SampleColumn>,
        files: Vec<SampleFile<'a>>,
    },
    /// The files and tensors come from [`tensor_files`] (planning only).
    Tensor { decoded: Option<DataType> },
    File {
        keys: Vec<String>,
        files: Vec<(&'a Entry<'a>, &'a Header)>,
    },
}

pub(super) fn describe_tensor(t: &TensorAssumption) -> String {
    match t.ragged {
        None => format!("{} {:?}", t.dtype, t.shape),
        Some(e) => format!(
            "a ragged {} column of {} with inner shape {:?}",
            ragged_element_name(e),
            t.dtype,
            t.shape.get(1..).unwrap_or_default()
        ),
    }
}

pub(super) fn ragged_element_name(e: RaggedElement) -> &'static str {
    match e {
        RaggedElement::Array => "array",
        RaggedElement::Binary => "binary",
        RaggedElement::String => "string",
    }
}

/// The error names the later file (in URI order) and quotes the earlier one.
pub(super) fn conflict(
    column: &str,
    x: (&str, &TensorAssumption),
    y: (&str, &TensorAssumption),
    problem: &'static str,
) -> ReadError {
    let ((file_a, a), (file_b, b)) = if x.0 <= y.0 { (x, y) } else { (y, x) };
    ReadErrorKind::ColumnConflict(format!(
        "column `{column}`: file `{file_a}` has {} but this file has {}; {problem}",
        describe_tensor(a),
        describe_tensor(b)
    ))
    .at(file_b, column)
}

pub(super) fn sample_file<'a>(
    cat: &'a Catalog<'a>,
    e: &'a Entry<'a>,
) -> Result<Option<SampleFile<'a>>, ReadError> {
    let uri = e.input.file.as_str();
    if let Some((m, si)) = cat.manifest_of(e) {
        if m.mode() == Some(DatasetMode::Kv) {
            return Err(ReadErrorKind::ReservedMetadata {
                key: LAYOUT_METADATA_KEY,
                value: "kv".into(),
                problem: "a KV shard has no sample rows; read it per tensor",
            }
            .in_file(uri));
        }
        let Some(shard) = m.shards.get(si) else {
            return Ok(None);
        };
        let rows = shard.samples_count.saturating_add(shard.padded());
        let mut tensors = Vec::with_capacity(m.schema.len());
        let mut ragged_row_bytes = HashMap::new();
        for (name, t) in &m.schema.0 {
            let mut shape = vec![rows];
            match &t.ragged {
                Some(r) => {
                    shape.extend(&r.inner_shape);
                    // the values' size is in the shard's header only: the shard's bytes per row
                    // bound it
                    ragged_row_bytes.insert(
                        name.clone(),
                        shard.bytes.checked_div(rows).unwrap_or(0).saturating_add(8),
                    );
                }
                None => shape.extend(m.sample_shape(name).into_iter().flatten()),
            }
            tensors.push(TensorAssumption {
                name: name.clone(),
                dtype: t.dtype,
                shape,
                ragged: t.ragged.as_ref().map(|r| r.element),
            });
        }
        return Ok(Some(SampleFile {
            entry: e,
            samples: shard.samples_count,
            padded: shard.padded(),
            tensors,
            ragged_row_bytes,
        }));
    }
    let Some(h) = &e.header else {
        return Ok(None);
    };
    let (samples, padded) = batch_samples(uri, h)?;
    let ragged = ragged_columns(uri, h)?;
    let offsets: HashSet<String> = ragged.iter().map(|c| ragged_offsets_name(c)).collect();
    let rows = samples.saturating_add(padded);
    let mut ragged_row_bytes = HashMap::new();
    let tensors = h
        .tensors
        .iter()
        .filter(|t| !offsets.contains(&t.name))
        .map(|t| {
            if !ragged.contains(&t.name) {
                return assumption(t);
            }
            ragged_row_bytes.insert(
                t.name.clone(),
                (t.byte_len() / rows.max(1)).saturating_add(8),
            );
            let mut shape = vec![rows];
            shape.extend(t.shape.iter().skip(1));
            // A shard alone does not say what its rows were written from: bytes (U8 rows of
            // scalars) read back as binary, the rest as arrays.
            let element = if t.dtype == Dtype::U8 && t.shape.len() == 1 {
                RaggedElement::Binary
            } else {
                RaggedElement::Array
            };
            TensorAssumption {
                name: t.name.clone(),
                dtype: t.dtype,
                shape,
                ragged: Some(element),
            }
        })
        .collect();
    Ok(Some(SampleFile {
        entry: e,
        samples,
        padded,
        tensors,
        ragged_row_bytes,
    }))
}

/// The per-sample layout's hidden metadata columns (spec/reading.md §2.1): a tensor may not
/// have one of these names.
pub const SAMPLE_HIDDEN_COLUMNS: [&str; 4] = ["_file", "_metadata", "_row_index", "_added_version"];

pub(super) fn sample_columns(files: &[SampleFile]) -> Result<Vec<SampleColumn>, ReadError> {
    let mut order: Vec<&str> = Vec::new();
    let mut seen: HashMap<&str, Vec<(&str, &TensorAssumption)>> = HashMap::new();
    for f in files {
        for t in &f.tensors {
            let list = seen.entry(t.name.as_str()).or_default();
            if list.is_empty() {
                order.push(&t.name);
            }
            list.push((f.entry.input.file.as_str(), t));
        }
    }
    let mut columns = Vec::with_capacity(order.len());
    for name in order {
        let all = seen.get(name).map(Vec::as_slice).unwrap_or_default();
        let Some(&first) = all.first() else { continue };
        if SAMPLE_HIDDEN_COLUMNS.contains(&name) {
            return Err(ReadErrorKind::Invalid(format!(
                "tensor `{name}` has the name of a hidden metadata column"
            ))
            .at(first.0, name));
        }
        let rank = first.1.shape.len().saturating_sub(1);
        if let Some(&other) = all
            .iter()
            .find(|(_, t)| t.ragged.is_some() != first.1.ragged.is_some())
        {
            return Err(conflict(
                name,
                first,
                other,
                "a ragged column cannot share a column with a fixed-shape one",
            ));
        }
        if let Some(&other) = all
            .iter()
            .find(|(_, t)| t.shape.len() != first.1.shape.len())
        {
            return Err(conflict(name, first, other, "the samples' ranks differ"));
        }
        let ragged = first.1.ragged;
        if let Some(&other) = all.iter().find(|(_, t)| t.ragged != ragged) {
            return Err(conflict(
                name,
                first,
                other,
                "the rows are read back as different Spark types",
            ));
        }
        if let Some(e @ (RaggedElement::Binary | RaggedElement::String)) = ragged {
            if let Some(&other) = all
                .iter()
                .find(|(_, t)| t.dtype != Dtype::U8 || t.shape.len() != 1)
            {
                return Err(conflict(
                    name,
                    first,
                    other,
                    "a ragged binary or string column holds U8 bytes (inner shape [])",
                ));
            }
            columns.push(SampleColumn {
                name: name.to_owned(),
                element: if e == RaggedElement::String {
                    ElementType::String
                } else {
                    ElementType::Binary
                },
                rank: 0,
                ragged: true,
            });
            continue;
        }
        let bytes_only: Vec<_> = all
            .iter()
            .filter(|(_, t)| spark_element(t.dtype).is_none())
            .collect();
        let element = if let Some(&&b) = bytes_only.first() {
            if let Some(&d) = all.iter().find(|(_, t)| spark_element(t.dtype).is_some()) {
                return Err(conflict(
                    name,
                    d,
                    b,
                    "a dtype without a Spark type (read as bytes) cannot share a column with decodable dtypes",
                ));
            }
            if let Some(&&o) = bytes_only.iter().find(|(_, t)| t.dtype != b.1.dtype) {
                return Err(conflict(
                    name,
                    b,
                    o,
                    "different dtypes without a Spark type cannot share a column",
                ));
            }
            for (file, t) in all {
                let elements = t
                    .shape
                    .iter()
                    .skip(1)
                    .try_fold(1u64, |a, &d| a.checked_mul(d));
                if elements.and_then(|e| t.dtype.checked_byte_len(e)).is_none() {
                    return Err(ReadErrorKind::Invalid(format!(
                        "a sample of {} is not a whole number of bytes, so it cannot be read as binary",
                        describe_tensor(t)
                    ))
                    .at(file, name));
                }
            }
            ElementType::Binary
        } else {
            match common_element(all.iter().map(|(_, t)| t.dtype))
                .as_ref()
                .and_then(ElementType::from_arrow)
            {
                Some(e) => e,
                None => {
                    let mut pair = (first, all.last().copied().unwrap_or(first));
                    'outer: for (i, a) in all.iter().enumerate() {
                        for b in &all[i + 1..] {
                            if common_element([a.1.dtype, b.1.dtype]).is_none() {
                                pair = (*a, *b);
                                break 'outer;
                            }
                        }
                    }
                    return Err(conflict(
                        name,
                        pair.0,
                        pair.1,
                        "the dtypes have no common Spark type they all widen to exactly",
                    ));
                }
            }
        };
        // A ragged array's rows are nested once more than its elements; bytes-only dtypes give
        // each row's bytes.
        let rank = match (ragged, element) {
            (None, _) => rank,
            (Some(_), ElementType::Binary) => 0,
            (Some(_), _) => rank + 1,
        };
        columns.push(SampleColumn {
            name: name.to_owned(),
            element,
            rank,
            ragged: ragged.is_some(),
        });
    }
    Ok(columns)
}

pub(super) fn scan_schema<'a>(
    cat: &'a Catalog<'a>,
    layout: RowLayout,
) -> Result<Answer<ScanSchema<'a>>, ReadError> {
    Ok(Answer::Ready(match layout {
        RowLayout::Sample => {
            let mut files = Vec::with_capacity(cat.files.len());
            let mut need = Vec::new();
            for e in &cat.files {
                match sample_file(cat, e)? {
                    Some(f) => files.push(f),
                    None => need.push(e.input.file.clone()),
                }
            }
            if !need.is_empty() {
                return Ok(Answer::NeedHeaders(need));
            }
            let columns = sample_columns(&files)?;
            ScanSchema::Sample { columns, files }
        }
        RowLayout::Tensor => {
            // A consistent manifest's column dtypes are its shards' dtypes (every shard holds
            // every column), so only files outside one need their header.
            let mut dtypes = Vec::new();
            let mut manifests = HashSet::new();
            let mut need = Vec::new();
            for e in &cat.files {
                if let Some((mi, _)) = e.shard {
                    if manifests.insert(mi) {
                        if let Some(m) = cat.manifests.get(mi) {
                            dtypes.extend(m.manifest.schema.0.iter().map(|(_, t)| t.dtype));
                            // a ragged column's offsets tensor is I64 (not in the schema)
                            if m.manifest.schema.0.iter().any(|(_, t)| t.ragged.is_some()) {
                                dtypes.push(Dtype::I64);
                            }
                        }
                    }
                    continue;
                }
                match &e.header {
                    Some(h) => dtypes.extend(h.tensors.iter().map(|t| t.dtype)),
                    None => need.push(e.input.file.clone()),
                }
            }
            if !need.is_empty() {
                return Ok(Answer::NeedHeaders(need));
            }
            ScanSchema::Tensor {
                decoded: common_element(dtypes),
            }
        }
        RowLayout::File => {
            let files = match cat.headers() {
                Ok(f) => f,
                Err(need) => return Ok(Answer::NeedHeaders(need)),
            };
            let mut keys: Vec<String> = Vec::new();
            let mut seen = std::collections::HashSet::new();
            for (e, h) in &files {
                for t in &h.tensors {
                    if seen.insert(t.name.as_str()) {
                        keys.push(t.name.clone());
                        let limit = cat.file_layout_max_tensors;
                        if keys.len() as u64 > limit {
                            return Err(ReadErrorKind::TooManyColumns {
                                what: " named differently over the files read (this file adds the one beyond the limit)",
                                count: keys.len() as u64,
                                limit,
                            }
                            .in_file(&e.input.file));
                        }
                    }
                }
            }
            // A tensor named like one of the layout's own columns takes its place; that column
            // is then the hidden `_<name>`, which must not be a tensor's name too.
            for fixed in FILE_LAYOUT_COLUMNS {
                let hidden = format!("_{fixed}");
                let holder = files.iter().find(|(_, h)| h.tensor(&hidden).is_some());
                if let (true, Some((e, _))) = (seen.contains(fixed), holder) {
                    return Err(ReadErrorKind::Invalid(format!(
                        "tensors `{fixed}` and `{hidden}`: a tensor named `{fixed}` moves the \
                         per-file layout's `{fixed}` column to the hidden column `{hidden}`, \
                         which a tensor has the name of"
                    ))
                    .at(&e.input.file, &hidden));
                }
            }
            ScanSchema::File { keys, files }
        }
    }))
}

impl ScanSchema<'_> {
    /// Every column (name, source) of the scan, metadata columns last.
    pub(super) fn columns(&self) -> Vec<OutputColumn> {
        let col = |name: &str, source| OutputColumn {
            name: name.to_owned(),
            source,
        };
        match self {
            ScanSchema::Sample { columns, .. } => {
                let mut out: Vec<OutputColumn> = columns
                    .iter()
                    .map(|c| {
                        col(
                            &c.name,
                            ColumnSource::Sample {
                                tensor: c.name.clone(),
                                element: c.element,
                                rank: c.rank,
                                ragged: c.ragged,
                            },
                        )
                    })
                    .collect();
                out.push(col("_file", ColumnSource::File));
                out.push(col("_metadata", ColumnSource::Metadata));
                out.push(col("_row_index", ColumnSource::RowIndex));
                out.push(col("_added_version", ColumnSource::AddedVersion));
                out
            }
            ScanSchema::Tensor { decoded, .. } => {
                let mut out = vec![
                    col("file", ColumnSource::File),
                    col("key", ColumnSource::Key),
                    col("dtype", ColumnSource::Dtype),
                    col("shape", ColumnSource::Shape),
                    col("byte_size", ColumnSource::ByteSize),
                    col("data", ColumnSource::Data),
                ];
                if let Some(e) = decoded.as_ref().and_then(ElementType::from_arrow) {
                    out.push(col("decoded", ColumnSource::Decoded { element: e }));
                }
                out.push(col("metadata", ColumnSource::Metadata));
                out.extend(forensic_columns());
                out
            }
            ScanSchema::File { keys, .. } => {
                // The layout's own columns keep their names unless a tensor has one: then the
                // tensor is that column and the layout's is the hidden `_<name>` (as a data
                // column named `_metadata` hides Spark file sources' `_metadata`).
                let own = |c: OutputColumn| {
                    if keys.contains(&c.name) {
                        OutputColumn {
                            name: format!("_{}", c.name),
                            ..c
                        }
                    } else {
                        c
                    }
                };
                let mut out = vec![own(col("file", ColumnSource::File))];
                out.extend(keys.iter().map(|k| {
                    col(
                        k,
                        ColumnSource::Tensor {
                            key: k.clone(),
                            fields: TensorField::ALL.to_vec(),
                        },
                    )
                }));
                out.push(own(col("metadata", ColumnSource::Metadata)));
                out.extend(forensic_columns().map(own));
                out
            }
        }
    }

    /// Visible columns and hidden metadata columns as Spark struct JSON.
    pub(super) fn spark_json(&self) -> (serde_json::Value, serde_json::Value) {
        let all = self.columns();
        let hidden = |c: &OutputColumn| c.is_hidden();
        let visible: Vec<Field> = all
            .iter()
            .filter(|c| !hidden(c))
            .map(OutputColumn::arrow_field)
            .collect();
        let meta: Vec<Field> = all
            .iter()
            .filter(|c| hidden(c))
            .map(OutputColumn::arrow_field)
            .collect();
        (
            spark_type_json(&DataType::Struct(Fields::from(visible))),
            spark_type_json(&DataType::Struct(Fields::from(meta))),
        )
    }
}

/// Resolves the layout and the schema.
pub fn describe(req: &DescribeRequest) -> Result<Answer<ScanDescription>, ReadError> {
    let cat = catalog(&req.input, req.layout == RowLayoutOption::File)?;
    let layout = match cat.resolve(req.layout).ready() {
        Ok(l) => l,
        Err(ask) => return Ok(ask),
    };
    let schema = match scan_schema(&cat, layout)?.ready() {
        Ok(s) => s,
        Err(ask) => return Ok(ask),
    };
    let (schema_json, metadata_columns) = schema.spark_json();
    Ok(Answer::Ready(ScanDescription {
        layout,
        schema: schema_json,
        metadata_columns,
        excluded: cat.excluded.clone(),
    }))
}
