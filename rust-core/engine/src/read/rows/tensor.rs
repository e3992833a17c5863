//! The per-tensor layout: one row per tensor (file, key, dtype, shape, data), decoded or raw.

use super::*;

/// Optional columns of the per-tensor layout.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TensorRowOptions {
    /// Include the `data` column (the tensor's raw bytes). Without it no data byte is read.
    pub data: bool,
    /// Include a `decoded` column: `List<element>` of the tensor's values, flattened in C
    /// order (the `shape` column gives the shape), widened exactly to `element` (see
    /// [`widen`]; [`crate::read::decode::common_element`] picks one for a set of dtypes). Null for dtypes
    /// without a Spark type; an error for a tensor that cannot be widened to `element`.
    pub decoded: Option<DataType>,
}

/// One column of the per-tensor layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TensorColumn {
    /// `file` (Utf8): the source's name.
    File,
    /// `key` (Utf8): the tensor name.
    Key,
    /// `dtype` (Utf8): the exact header dtype name.
    Dtype,
    /// `shape` (`List<Int64>`).
    Shape,
    /// `byte_size` (Int64).
    ByteSize,
    /// `data` (Binary): the tensor's raw bytes.
    Data,
    /// `decoded` (`List<element>`, nullable): see [`TensorRowOptions::decoded`].
    Decoded(DataType),
    /// `metadata`: the file's `__metadata__`.
    Metadata,
    /// `flags`: the file's forensic flags, cut to these fields (see [`crate::read::forensic_columns`]).
    Flags(Vec<String>),
    /// `model_info`: the file's model information, cut to these fields.
    ModelInfo(Vec<String>),
    /// `sha256` (Utf8): lower-case hex SHA-256 of the tensor's data bytes (as the report's).
    Sha256,
}

impl TensorColumn {
    /// The column's default name.
    pub fn name(&self) -> &'static str {
        match self {
            TensorColumn::File => "file",
            TensorColumn::Key => "key",
            TensorColumn::Dtype => "dtype",
            TensorColumn::Shape => "shape",
            TensorColumn::ByteSize => "byte_size",
            TensorColumn::Data => "data",
            TensorColumn::Decoded(_) => "decoded",
            TensorColumn::Metadata => "metadata",
            TensorColumn::Flags(_) => "flags",
            TensorColumn::ModelInfo(_) => "model_info",
            TensorColumn::Sha256 => "sha256",
        }
    }

    /// The column's Arrow field, named [`Self::name`].
    pub fn field(&self) -> Field {
        match self {
            TensorColumn::File | TensorColumn::Key | TensorColumn::Dtype | TensorColumn::Sha256 => {
                Field::new(self.name(), DataType::Utf8, false)
            }
            TensorColumn::Shape => Field::new(self.name(), shape_type(), false),
            TensorColumn::ByteSize => Field::new(self.name(), DataType::Int64, false),
            TensorColumn::Data => Field::new(self.name(), DataType::Binary, false),
            TensorColumn::Decoded(element) => {
                Field::new(self.name(), list_of(element.clone()), true)
            }
            TensorColumn::Metadata => metadata_field(),
            TensorColumn::Flags(fields) => Field::new(self.name(), flags_type(fields), false),
            TensorColumn::ModelInfo(fields) => {
                Field::new(self.name(), model_info_type(fields), false)
            }
        }
    }

    /// Whether building this column reads the data bytes of a tensor of `dtype`.
    pub fn reads_data(&self, dtype: Dtype) -> bool {
        match self {
            TensorColumn::Data | TensorColumn::Sha256 => true,
            TensorColumn::Decoded(_) => spark_element(dtype).is_some(),
            _ => false,
        }
    }
}

pub(super) fn tensor_row_columns(opts: &TensorRowOptions) -> Vec<TensorColumn> {
    let mut columns = vec![
        TensorColumn::File,
        TensorColumn::Key,
        TensorColumn::Dtype,
        TensorColumn::Shape,
        TensorColumn::ByteSize,
    ];
    if opts.data {
        columns.push(TensorColumn::Data);
    }
    if let Some(element) = &opts.decoded {
        columns.push(TensorColumn::Decoded(element.clone()));
    }
    columns.push(TensorColumn::Metadata);
    columns
}

/// Schema of [`tensor_rows`]: `file`, `key`, `dtype`, `shape`, `byte_size` (Int64), then `data`
/// (Binary) and `decoded` when requested, then `metadata`.
pub fn tensor_rows_schema(opts: &TensorRowOptions) -> SchemaRef {
    let fields: Vec<Field> = tensor_row_columns(opts).iter().map(|c| c.field()).collect();
    Arc::new(Schema::new(fields))
}

/// One row per `(file, tensor)` pair, in the order given (see [`tensor_rows_schema`]).
///
/// Only the requested columns touch data bytes. The sum of `data` bytes and of `decoded`
/// elements in one batch must each stay within `i32::MAX`; the caller picks the tensors of a
/// batch (e.g. by `byte_len`) accordingly.
pub fn tensor_rows(
    rows: &[(&dyn TensorSource, &TensorInfo)],
    opts: &TensorRowOptions,
) -> Result<RecordBatch, ReadError> {
    let schema = tensor_rows_schema(opts);
    let arrays = tensor_columns(rows, &tensor_row_columns(opts))?;
    let first = rows.first().map(|(s, _)| s.name()).unwrap_or_default();
    RecordBatch::try_new(schema, arrays).map_err(|e| ReadErrorKind::from(e).in_file(&first))
}

/// The arrays of the per-tensor `columns` (in that order, typed as [`TensorColumn::field`]) for
/// one row per `(file, tensor)` pair. Only [`TensorColumn::Data`] and
/// [`TensorColumn::Decoded`] read data bytes; the same `i32::MAX` limits as [`tensor_rows`].
pub fn tensor_columns(
    rows: &[(&dyn TensorSource, &TensorInfo)],
    columns: &[TensorColumn],
) -> Result<Vec<ArrayRef>, ReadError> {
    let names: Vec<_> = rows.iter().map(|(s, _)| s.name()).collect();
    let batch_err = |e: ReadErrorKind| e.in_file(names.first().map_or("", |n| n.as_ref()));
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(columns.len());
    for column in columns {
        let array: ArrayRef = match column {
            TensorColumn::File => Arc::new(StringArray::from_iter_values(
                names.iter().map(|n| n.as_ref()),
            )),
            TensorColumn::Key => Arc::new(StringArray::from_iter_values(
                rows.iter().map(|(_, t)| t.name.as_str()),
            )),
            TensorColumn::Dtype => Arc::new(StringArray::from_iter_values(
                rows.iter().map(|(_, t)| t.dtype.name()),
            )),
            TensorColumn::Shape => shape_column(rows.iter().map(|(_, t)| Some(t.shape.as_slice()))),
            TensorColumn::ByteSize => Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|(_, t)| t.byte_len() as i64),
            )),
            TensorColumn::Data => {
                let total: u64 = rows.iter().map(|(_, t)| t.byte_len()).sum();
                if total > MAX_OFFSET {
                    return Err(batch_err(too_large("data bytes", total)));
                }
                let mut b = BinaryBuilder::with_capacity(rows.len(), total as usize);
                for (src, t) in rows {
                    b.append_value(tensor_bytes(*src, t)?);
                }
                Arc::new(b.finish())
            }
            TensorColumn::Decoded(element) => decoded_column(rows, &names, element)?,
            TensorColumn::Metadata => {
                metadata_column(rows.iter().map(|(s, _)| s.header().metadata.as_ref()))
                    .map_err(batch_err)?
            }
            TensorColumn::Flags(fields) => {
                let per_file = per_file(rows, flags_of);
                let refs: Vec<&[Flag]> = per_file.iter().map(|f| f.as_slice()).collect();
                flags_column(&refs, fields).map_err(batch_err)?
            }
            TensorColumn::ModelInfo(fields) => {
                let per_file = per_file(rows, model_info_of);
                let refs: Vec<&ModelInfo> = per_file.iter().map(|m| &**m).collect();
                model_info_column(&refs, fields).map_err(batch_err)?
            }
            TensorColumn::Sha256 => {
                let mut b = StringBuilder::with_capacity(rows.len(), rows.len() * 64);
                for (src, t) in rows {
                    b.append_value(hash::hex(&Sha256::digest(tensor_bytes(*src, t)?)));
                }
                Arc::new(b.finish())
            }
        };
        arrays.push(array);
    }
    Ok(arrays)
}

/// `of` of each row's file header, computed once per run of rows from the same header.
pub(super) fn per_file<T>(
    rows: &[(&dyn TensorSource, &TensorInfo)],
    of: fn(&Header) -> T,
) -> Vec<Arc<T>> {
    let mut out: Vec<Arc<T>> = Vec::with_capacity(rows.len());
    let mut last: Option<(*const Header, Arc<T>)> = None;
    for (src, _) in rows {
        let h = src.header();
        let value = match &last {
            Some((p, v)) if std::ptr::eq(*p, h) => v.clone(),
            _ => {
                let v = Arc::new(of(h));
                last = Some((h as *const Header, v.clone()));
                v
            }
        };
        out.push(value);
    }
    out
}

pub(super) fn shape_column<'a>(shapes: impl Iterator<Item = Option<&'a [u64]>>) -> ArrayRef {
    let mut b = ListBuilder::new(Int64Builder::new()).with_field(element_field(DataType::Int64));
    for shape in shapes {
        if let Some(shape) = shape {
            // Dimensions beyond i64::MAX cannot describe a readable tensor; they saturate.
            for &d in shape {
                b.values()
                    .append_value(i64::try_from(d).unwrap_or(i64::MAX));
            }
        }
        // Null rows get an empty list; the parent struct's validity says null.
        b.append(true);
    }
    Arc::new(b.finish())
}

pub(super) fn decoded_column(
    rows: &[(&dyn TensorSource, &TensorInfo)],
    names: &[std::borrow::Cow<'_, str>],
    element: &DataType,
) -> Result<ArrayRef, ReadError> {
    let mut parts = Vec::with_capacity(rows.len());
    let mut offsets = Vec::with_capacity(rows.len() + 1);
    let mut valid = Vec::with_capacity(rows.len());
    let mut total = 0u64;
    offsets.push(0i32);
    for ((src, t), file) in rows.iter().zip(names) {
        if spark_element(t.dtype).is_some() {
            let at = |e: ReadErrorKind| e.at(file, &t.name);
            let values = decode_values(t.dtype, &tensor_bytes(*src, t)?).map_err(at)?;
            let values = widen(values, element).map_err(at)?;
            total += values.len() as u64;
            if total > MAX_OFFSET {
                return Err(at(too_large("decoded elements", total)));
            }
            parts.push(values.to_data());
            valid.push(true);
        } else {
            valid.push(false);
        }
        offsets.push(total as i32);
    }
    let file = names.first().map_or("", |n| n.as_ref());
    // MutableArrayData needs at least one source array.
    let values = if parts.is_empty() {
        arrow_array::new_empty_array(element)
    } else {
        let mut all = MutableArrayData::new(parts.iter().collect(), false, total as usize);
        for (i, p) in parts.iter().enumerate() {
            all.try_extend(i, 0, p.len())
                .map_err(|e| ReadErrorKind::from(e).in_file(file))?;
        }
        make_array(all.freeze())
    };
    let list = ListArray::try_new(
        element_field(element.clone()),
        OffsetBuffer::new(ScalarBuffer::from(offsets)),
        values,
        Some(NullBuffer::from(valid)),
    )
    .map_err(|e| ReadErrorKind::from(e).in_file(file))?;
    Ok(Arc::new(list))
}
