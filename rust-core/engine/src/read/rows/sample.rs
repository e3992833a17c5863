//! The per-sample layout: one row per sample, a column per tensor, from batch-mode shards
//! (samples cut out of the batch dimension) and KV shards (a tensor per sample).

use super::*;

/// Real and padding rows of a batch-mode shard: `(samples, padded)`.
///
/// Read from the reserved `__metadata__` keys `safetensors_spark.samples` and
/// `safetensors_spark.padded_samples` (padding 0 when absent). Without `samples` (files from
/// other writers) every row of the leading dimension is a sample. Every tensor must have a
/// leading dimension equal to `samples + padded`; a KV shard (`safetensors_spark.layout` = `kv`)
/// has no rows and is an error. A file without tensors has `(0, 0)`.
pub fn batch_samples(file: &str, header: &Header) -> Result<(u64, u64), ReadError> {
    let meta = header.metadata.as_ref();
    let get = |key| meta.and_then(|m| m.get(key));
    let number = |key: &'static str| -> Result<Option<u64>, ReadError> {
        get(key)
            .map(|v| {
                v.parse::<u64>().map_err(|_| {
                    ReadErrorKind::ReservedMetadata {
                        key,
                        value: v.clone(),
                        problem: "not a non-negative decimal integer",
                    }
                    .in_file(file)
                })
            })
            .transpose()
    };
    if let Some(mode) = get(LAYOUT_METADATA_KEY).filter(|l| *l == "kv") {
        return Err(ReadErrorKind::ReservedMetadata {
            key: LAYOUT_METADATA_KEY,
            value: mode.clone(),
            problem: "a KV shard has no sample rows; read it per tensor",
        }
        .in_file(file));
    }
    let padded = number(PADDED_SAMPLES_METADATA_KEY)?.unwrap_or(0);
    let samples = number(SAMPLES_METADATA_KEY)?;
    let ragged = ragged_columns(file, header)?;
    let offsets: Vec<String> = ragged.iter().map(|c| ragged_offsets_name(c)).collect();
    for (c, o) in ragged.iter().zip(&offsets) {
        for name in [c, o] {
            if header.tensor(name).is_none() {
                return Err(ReadErrorKind::RaggedOffsets(format!(
                    "`{RAGGED_METADATA_KEY}` names it ragged, but the file has no tensor `{name}`"
                ))
                .at(file, c));
            }
        }
    }
    let lead = |t: &TensorInfo| {
        t.shape
            .first()
            .copied()
            .ok_or_else(|| ReadErrorKind::NoRowDimension.at(file, &t.name))
    };
    // A ragged column's values tensor has one entry per element, its offsets one per row + 1.
    let fixed = || header.tensors.iter().filter(|t| !ragged.contains(&t.name));
    let rows = match samples {
        Some(s) => s.checked_add(padded).ok_or_else(|| {
            ReadErrorKind::ReservedMetadata {
                key: PADDED_SAMPLES_METADATA_KEY,
                value: padded.to_string(),
                problem: "samples + padded samples overflows",
            }
            .in_file(file)
        })?,
        None => match fixed().next() {
            None => return Ok((0, padded)),
            Some(t) if offsets.contains(&t.name) => lead(t)?.saturating_sub(1),
            Some(t) => lead(t)?,
        },
    };
    for t in fixed() {
        if let Some(i) = offsets.iter().position(|o| *o == t.name) {
            let column = ragged.get(i).map_or("", String::as_str);
            if t.dtype != Dtype::I64
                || t.shape.len() != 1
                || Some(t.shape[0]) != rows.checked_add(1)
            {
                return Err(ReadErrorKind::RaggedOffsets(format!(
                    "`{}` is {} {:?}; the row boundaries of {rows} rows are I64 [{}]",
                    t.name,
                    t.dtype,
                    t.shape,
                    rows.saturating_add(1)
                ))
                .at(file, column));
            }
            continue;
        }
        let r = lead(t)?;
        if r != rows {
            return Err(ReadErrorKind::RowCount {
                rows: r,
                expected: rows,
            }
            .at(file, &t.name));
        }
    }
    let samples = samples.map_or_else(
        || {
            rows.checked_sub(padded).ok_or_else(|| {
                ReadErrorKind::ReservedMetadata {
                    key: PADDED_SAMPLES_METADATA_KEY,
                    value: padded.to_string(),
                    problem: "more padding rows than rows",
                }
                .in_file(file)
            })
        },
        Ok,
    )?;
    Ok((samples, padded))
}

/// The Arrow type of one sample of a tensor of `dtype` whose samples have rank `sample_rank`:
/// the element type nested in `List` `sample_rank` times; `None` for bytes-only dtypes.
pub fn sample_data_type(dtype: Dtype, sample_rank: usize) -> Option<DataType> {
    let mut t = spark_element(dtype)?;
    for _ in 0..sample_rank {
        t = list_of(t);
    }
    Some(t)
}

pub(super) fn checked_product(dims: &[u64]) -> Option<u64> {
    dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

/// Bytes (relative to the tensor's first byte) holding rows `rows` of a tensor whose first
/// dimension is its rows.
pub fn row_byte_range(info: &TensorInfo, rows: Range<u64>) -> Result<Range<u64>, ReadErrorKind> {
    let (&total, sample_shape) = info
        .shape
        .split_first()
        .ok_or(ReadErrorKind::NoRowDimension)?;
    if rows.start > rows.end || rows.end > total {
        return Err(ReadErrorKind::RowRange {
            start: rows.start,
            end: rows.end,
            rows: total,
        });
    }
    // The header validated the whole tensor's byte length, so these products cannot overflow
    // for in-range rows (checked anyway).
    let row_elems = checked_product(sample_shape).unwrap_or(u64::MAX);
    let byte = |r: u64| {
        r.checked_mul(row_elems)
            .and_then(|e| info.dtype.checked_byte_len(e))
            .ok_or(ReadErrorKind::DataLength {
                expected: info.byte_len(),
                actual: u64::MAX,
            })
    };
    Ok(byte(rows.start)?..byte(rows.end)?)
}

/// Builds the per-sample array of `rows` rows of `dtype` with per-row shape `sample_shape`
/// from `bytes` (exactly those rows' bytes): the decoded values themselves when `sample_shape`
/// is empty, else `List` nested `sample_shape.len()` times, offsets computed from the shape.
///
/// A U64 overflow error gives the element index within `bytes`.
pub fn sample_array(
    dtype: Dtype,
    sample_shape: &[u64],
    rows: u64,
    bytes: &[u8],
) -> Result<ArrayRef, ReadErrorKind> {
    let mut array = decode_values(dtype, bytes)?;
    let total = checked_product(sample_shape).and_then(|p| p.checked_mul(rows));
    if total != Some(array.len() as u64) {
        return Err(ReadErrorKind::DataLength {
            expected: total
                .and_then(|t| dtype.checked_byte_len(t))
                .unwrap_or(u64::MAX),
            actual: bytes.len() as u64,
        });
    }
    // Innermost level first: level j has `rows · s1 · … · s(j-1)` lists of `s_j` entries each.
    for j in (0..sample_shape.len()).rev() {
        let step = sample_shape[j];
        let lists = checked_product(&sample_shape[..j])
            .and_then(|p| p.checked_mul(rows))
            .ok_or(too_large("lists", u64::MAX))?;
        let child_len = array.len() as u64; // = lists · step
        if child_len > MAX_OFFSET {
            return Err(too_large("list elements", child_len));
        }
        // Every offset is ≤ child_len ≤ i32::MAX, so the casts are exact.
        let offsets: Vec<i32> = (0..=lists).map(|i| (i * step) as i32).collect();
        let field = element_field(array.data_type().clone());
        array = Arc::new(ListArray::try_new(
            field,
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            array,
            None,
        )?);
    }
    Ok(array)
}

/// Rows `rows` of tensor `tensor` of `src`, one array entry per row (see [`sample_array`]).
/// Fetches only those rows' bytes. Errors name the file and tensor; a U64 overflow gives the
/// element's index within the whole tensor.
pub fn sample_column(
    src: &dyn TensorSource,
    tensor: &str,
    rows: Range<u64>,
) -> Result<ArrayRef, ReadError> {
    let file = src.name();
    let info = src
        .header()
        .tensor(tensor)
        .ok_or_else(|| ReadErrorKind::MissingTensor.at(&file, tensor))?;
    let bytes_range = row_byte_range(info, rows.clone()).map_err(|e| e.at(&file, tensor))?;
    let bytes = src.read(info, bytes_range)?;
    let sample_shape = &info.shape[1..];
    sample_array(info.dtype, sample_shape, rows.end - rows.start, &bytes).map_err(|e| {
        let e = match e {
            ReadErrorKind::U64Overflow { index, value } => ReadErrorKind::U64Overflow {
                index: index + rows.start * checked_product(sample_shape).unwrap_or(0),
                value,
            },
            e => e,
        };
        e.at(&file, tensor)
    })
}

/// What a per-sample column holds, whatever the dtype of the tensor in one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SampleTarget {
    /// Decoded values widened (see [`widen`]) to this element type, nested in `List` once per
    /// sample dimension.
    Values(DataType),
    /// Each sample's raw bytes (Binary), for dtypes without a Spark element type.
    Bytes,
    /// Each row's bytes as UTF-8 text (Utf8): ragged `string` columns only.
    Text,
}

/// The Arrow type of a per-sample column of samples of rank `sample_rank`.
pub fn sample_target_type(target: &SampleTarget, sample_rank: usize) -> DataType {
    match target {
        SampleTarget::Bytes => DataType::Binary,
        SampleTarget::Text => DataType::Utf8,
        SampleTarget::Values(element) => {
            let mut t = element.clone();
            for _ in 0..sample_rank {
                t = list_of(t);
            }
            t
        }
    }
}

/// Widens the innermost values of a (possibly `List`-nested) array to `element` (see
/// [`widen`]); list offsets and validity are kept.
pub fn widen_nested(array: ArrayRef, element: &DataType) -> Result<ArrayRef, ReadErrorKind> {
    if let DataType::List(_) = array.data_type() {
        let list = array.as_list::<i32>();
        let values = widen_nested(list.values().clone(), element)?;
        let field = element_field(values.data_type().clone());
        return Ok(Arc::new(ListArray::try_new(
            field,
            list.offsets().clone(),
            values,
            list.nulls().cloned(),
        )?));
    }
    widen(array, element)
}

/// Rows `rows` of tensor `tensor` of `src` as a per-sample column of type
/// [`sample_target_type`]`(target, sample_rank)`: all null rows when the file has no such
/// tensor; otherwise the tensor must have rank `sample_rank + 1`, and its samples are decoded
/// and widened ([`SampleTarget::Values`]) or copied as bytes ([`SampleTarget::Bytes`]). Only
/// those rows' bytes are read.
pub fn sample_column_as(
    src: &dyn TensorSource,
    tensor: &str,
    rows: Range<u64>,
    sample_rank: usize,
    target: &SampleTarget,
) -> Result<ArrayRef, ReadError> {
    let file = src.name();
    let n = rows.end.saturating_sub(rows.start);
    let Some(info) = src.header().tensor(tensor) else {
        return Ok(new_null_array(
            &sample_target_type(target, sample_rank),
            n as usize,
        ));
    };
    if info.shape.len() != sample_rank + 1 {
        return Err(ReadErrorKind::Invalid(format!(
            "expected samples of rank {sample_rank}, the tensor has shape {:?}",
            info.shape
        ))
        .at(&file, tensor));
    }
    match target {
        SampleTarget::Values(element) => {
            let array = sample_column(src, tensor, rows)?;
            widen_nested(array, element).map_err(|e| e.at(&file, tensor))
        }
        SampleTarget::Text => Err(ReadErrorKind::Invalid(
            "only a ragged column is read as string".into(),
        )
        .at(&file, tensor)),
        SampleTarget::Bytes => {
            let range = row_byte_range(info, rows).map_err(|e| e.at(&file, tensor))?;
            let bytes = src.read(info, range)?;
            let total = bytes.len() as u64;
            if total > MAX_OFFSET {
                return Err(too_large("data bytes", total).at(&file, tensor));
            }
            let per_row = total.checked_div(n).unwrap_or(0);
            if per_row * n != total {
                return Err(ReadErrorKind::DataLength {
                    expected: per_row * n,
                    actual: total,
                }
                .at(&file, tensor));
            }
            // total ≤ i32::MAX, so every offset fits.
            let offsets: Vec<i32> = (0..=n).map(|i| (i * per_row) as i32).collect();
            let array = BinaryArray::try_new(
                OffsetBuffer::new(ScalarBuffer::from(offsets)),
                arrow_buffer::Buffer::from_slice_ref(&bytes),
                None,
            )
            .map_err(|e| ReadErrorKind::from(e).at(&file, tensor))?;
            Ok(Arc::new(array))
        }
    }
}

/// Extra columns of the per-sample layout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SampleOptions {
    /// Append a `file` column (Utf8).
    pub file: bool,
    /// Append a `metadata` column (the file's `__metadata__`, repeated per row).
    pub metadata: bool,
}

/// Per-sample rows `rows` of a batch-mode shard: one column per name in `columns` (named after
/// it, typed by [`sample_data_type`]), then the optional `file` and `metadata` columns.
///
/// `rows` must lie within the shard's real samples ([`batch_samples`]): pad rows are never
/// returned. Splitting a shard into several row ranges (for parallelism or batch size) is the
/// caller's choice.
pub fn sample_rows(
    src: &dyn TensorSource,
    columns: &[&str],
    rows: Range<u64>,
    opts: SampleOptions,
) -> Result<RecordBatch, ReadError> {
    let file = src.name();
    let (samples, _) = batch_samples(&file, src.header())?;
    if rows.start > rows.end || rows.end > samples {
        return Err(ReadErrorKind::RowRange {
            start: rows.start,
            end: rows.end,
            rows: samples,
        }
        .in_file(&file));
    }
    let n = (rows.end - rows.start) as usize;
    let mut fields = Vec::with_capacity(columns.len() + 2);
    let mut arrays = Vec::with_capacity(columns.len() + 2);
    for name in columns {
        let array = sample_column(src, name, rows.clone())?;
        fields.push(Field::new(*name, array.data_type().clone(), false));
        arrays.push(array);
    }
    if opts.file {
        fields.push(Field::new("file", DataType::Utf8, false));
        arrays.push(Arc::new(StringArray::from(vec![file.as_ref(); n])));
    }
    if opts.metadata {
        fields.push(metadata_field());
        let meta = src.header().metadata.as_ref();
        arrays.push(metadata_column(std::iter::repeat_n(meta, n)).map_err(|e| e.in_file(&file))?);
    }
    batch(fields, arrays, n).map_err(|e| e.in_file(&file))
}

pub(super) fn batch(
    fields: Vec<Field>,
    arrays: Vec<ArrayRef>,
    rows: usize,
) -> Result<RecordBatch, ReadErrorKind> {
    let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(rows));
    Ok(RecordBatch::try_new_with_options(
        Arc::new(Schema::new(fields)),
        arrays,
        &options,
    )?)
}

/// A `metadata` column: one entry per item of `metas` (null for `None`).
pub fn metadata_column<'a>(
    metas: impl Iterator<Item = Option<&'a BTreeMap<String, String>>>,
) -> Result<ArrayRef, ReadErrorKind> {
    let mut b = string_map_builder();
    let (mut entries, mut bytes) = (0u64, 0u64);
    for meta in metas {
        match meta {
            Some(m) => {
                for (k, v) in m {
                    entries += 1;
                    bytes += (k.len() + v.len()) as u64;
                    if entries > MAX_OFFSET || bytes > MAX_OFFSET {
                        return Err(too_large("metadata bytes", bytes.max(entries)));
                    }
                    b.keys().append_value(k);
                    b.values().append_value(v);
                }
                b.append(true)?;
            }
            None => b.append(false)?,
        }
    }
    Ok(Arc::new(b.finish()))
}
