//! The three row layouts as Arrow record batches.
//!
//! Common column types: `file`, `key`, `dtype` are Utf8; `shape` is `List<Int64>` (non-null
//! elements); `metadata` is `Map<Utf8, Utf8>` with Spark's field names (`entries`, `key`,
//! `value`), null when the file has no `__metadata__`. List child fields are named `element` and
//! are non-nullable (tensors have no nulls).

use super::arrow_types::{metadata_type, string_map_builder, MAX_OFFSET};
use super::decode::{decode_values, spark_element, widen};
use super::error::{ReadError, ReadErrorKind};
use super::forensic_columns::{
    flags_column, flags_of, flags_type, model_info_column, model_info_of, model_info_type,
};
use super::{tensor_bytes, TensorSource};
use arrow_array::builder::{BinaryBuilder, Int64Builder, ListBuilder, StringBuilder};
use arrow_array::cast::AsArray;
use arrow_array::{
    make_array, new_null_array, Array, ArrayRef, BinaryArray, Int64Array, ListArray, RecordBatch,
    StringArray, StructArray,
};
use arrow_buffer::{NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_data::transform::MutableArrayData;
use arrow_schema::{DataType, Field, FieldRef, Fields, Schema, SchemaRef};
use safetensors_spark_dataset::manifest::ragged_offsets_name;
use safetensors_spark_format::dtype::Dtype;
use safetensors_spark_format::forensics::flags::Flag;
use safetensors_spark_format::forensics::hash;
use safetensors_spark_format::forensics::metadata::ModelInfo;
use safetensors_spark_format::header::{Header, TensorInfo};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

/// Shard `__metadata__` key: real rows in a batch-mode shard.
pub const SAMPLES_KEY: &str = "safetensors_spark.samples";
/// Shard `__metadata__` key: zero rows appended by `tail_strategy=pad`.
pub const PADDED_SAMPLES_KEY: &str = "safetensors_spark.padded_samples";
/// Shard `__metadata__` key of the dataset mode (`DatasetMode`): `batch` or `kv`.
pub const MODE_KEY: &str = "safetensors_spark.layout";
/// Shard `__metadata__` key: the ragged columns (a JSON array of names, spec/dataset.md §2.1).
pub const RAGGED_KEY: &str = "safetensors_spark.ragged";

fn element_field(data_type: DataType) -> FieldRef {
    Arc::new(Field::new("element", data_type, false))
}

fn list_of(data_type: DataType) -> DataType {
    DataType::List(element_field(data_type))
}

/// The `shape` column's type: `List<Int64>` (non-null elements).
pub fn shape_type() -> DataType {
    list_of(DataType::Int64)
}

fn metadata_field() -> Field {
    Field::new("metadata", metadata_type(), true)
}

fn too_large(what: &'static str, count: u64) -> ReadErrorKind {
    ReadErrorKind::TooLarge {
        what,
        count,
        limit: MAX_OFFSET,
    }
}

// ---------------------------------------------------------------------------------------------
// Per sample
// ---------------------------------------------------------------------------------------------

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
    if let Some(mode) = get(MODE_KEY).filter(|l| *l == "kv") {
        return Err(ReadErrorKind::ReservedMetadata {
            key: MODE_KEY,
            value: mode.clone(),
            problem: "a KV shard has no sample rows; read it per tensor",
        }
        .in_file(file));
    }
    let padded = number(PADDED_SAMPLES_KEY)?.unwrap_or(0);
    let samples = number(SAMPLES_KEY)?;
    let ragged = ragged_columns(file, header)?;
    let offsets: Vec<String> = ragged.iter().map(|c| ragged_offsets_name(c)).collect();
    for (c, o) in ragged.iter().zip(&offsets) {
        for name in [c, o] {
            if header.tensor(name).is_none() {
                return Err(ReadErrorKind::RaggedOffsets(format!(
                    "`{RAGGED_KEY}` names it ragged, but the file has no tensor `{name}`"
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
                key: PADDED_SAMPLES_KEY,
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
                    key: PADDED_SAMPLES_KEY,
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

fn checked_product(dims: &[u64]) -> Option<u64> {
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

/// The ragged columns a shard's `__metadata__` names ([`RAGGED_KEY`], a JSON array of column
/// names), in column order; empty when the key is absent.
pub fn ragged_columns(file: &str, header: &Header) -> Result<Vec<String>, ReadError> {
    let Some(v) = header.metadata.as_ref().and_then(|m| m.get(RAGGED_KEY)) else {
        return Ok(Vec::new());
    };
    serde_json::from_str::<Vec<String>>(v).map_err(|_| {
        ReadErrorKind::ReservedMetadata {
            key: RAGGED_KEY,
            value: v.clone(),
            problem: "not a JSON array of column names",
        }
        .in_file(file)
    })
}

/// One I64 entry of an offsets tensor.
fn offset_entries(
    src: &dyn TensorSource,
    offsets: &TensorInfo,
    entries: Range<u64>,
) -> Result<Vec<i64>, ReadError> {
    let bytes = src.read(offsets, entries.start * 8..entries.end * 8)?;
    Ok(bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect())
}

/// Absolute byte ranges (relative to each tensor's first byte) of the offsets entries
/// [`ragged_offsets`] reads for `rows`: entries `rows.start ..= rows.end`, the first and the
/// last.
pub fn ragged_offsets_ranges(offsets: &TensorInfo, rows: &Range<u64>) -> [Range<u64>; 3] {
    let last = offsets
        .shape
        .first()
        .copied()
        .unwrap_or(1)
        .saturating_sub(1);
    [
        rows.start * 8..rows.end.saturating_add(1).saturating_mul(8),
        0..8,
        last * 8..last * 8 + 8,
    ]
}

/// The row boundaries of rows `rows` of ragged column `column` of `src`: `rows.len() + 1`
/// element offsets into the values tensor `column`, read from `column.offsets`. Reads only
/// the entries `rows.start ..= rows.end` plus the first and last entry, and validates them:
/// the first entry is 0, the last equals the values' first dimension, every entry read lies in
/// `[0, elements]` and none is smaller than the one before. Errors name the file and column.
pub fn ragged_offsets(
    src: &dyn TensorSource,
    column: &str,
    rows: Range<u64>,
) -> Result<Vec<u64>, ReadError> {
    let file = src.name();
    let bad = |m: String| ReadErrorKind::RaggedOffsets(m).at(&file, column);
    let h = src.header();
    let name = ragged_offsets_name(column);
    let values = h
        .tensor(column)
        .ok_or_else(|| ReadErrorKind::MissingTensor.at(&file, column))?;
    let offsets = h
        .tensor(&name)
        .ok_or_else(|| bad(format!("the offsets tensor `{name}` is missing")))?;
    let elements = values
        .shape
        .first()
        .copied()
        .ok_or_else(|| ReadErrorKind::NoRowDimension.at(&file, column))?;
    let entries = offsets.shape.first().copied().unwrap_or(0);
    if offsets.dtype != Dtype::I64 || offsets.shape.len() != 1 || entries == 0 {
        return Err(bad(format!(
            "`{name}` is {} {:?}; row boundaries are I64 [rows + 1]",
            offsets.dtype, offsets.shape
        )));
    }
    if rows.start > rows.end || rows.end >= entries {
        return Err(ReadErrorKind::RowRange {
            start: rows.start,
            end: rows.end,
            rows: entries - 1,
        }
        .at(&file, column));
    }
    let first = offset_entries(src, offsets, 0..1)?;
    if first.first() != Some(&0) {
        return Err(bad(format!(
            "`{name}` starts at {}, not 0",
            first.first().copied().unwrap_or_default()
        )));
    }
    let last = offset_entries(src, offsets, entries - 1..entries)?;
    if last.first().map(|&v| v as u64) != Some(elements) || last.first() < Some(&0) {
        return Err(bad(format!(
            "`{name}` ends at {} (entry {}), but `{column}` has {elements} elements",
            last.first().copied().unwrap_or_default(),
            entries - 1
        )));
    }
    let read = offset_entries(src, offsets, rows.start..rows.end + 1)?;
    let mut out = Vec::with_capacity(read.len());
    let mut before: Option<u64> = None;
    for (i, &v) in read.iter().enumerate() {
        let entry = rows.start + i as u64;
        if v < 0 || v as u64 > elements {
            return Err(bad(format!(
                "`{name}` entry {entry} is {v}, outside [0, {elements}] (`{column}` has {elements} elements)"
            )));
        }
        let v = v as u64;
        if let Some(p) = before.filter(|&p| v < p) {
            return Err(bad(format!(
                "`{name}` entry {entry} is {v}, smaller than entry {} ({p}): row {} would have a negative length",
                entry - 1,
                entry - 1
            )));
        }
        before = Some(v);
        out.push(v);
    }
    Ok(out)
}

/// Bytes of `elements` elements of a ragged column's values tensor `values`.
fn ragged_bytes(values: &TensorInfo, elements: u64) -> Option<u64> {
    checked_product(values.shape.get(1..).unwrap_or_default())
        .and_then(|p| p.checked_mul(elements))
        .and_then(|e| values.dtype.checked_byte_len(e))
}

/// Byte range (relative to the values tensor's first byte) of the elements
/// `offsets[0]..offsets[last]` of ragged column `values`.
pub fn ragged_values_range(values: &TensorInfo, offsets: &[u64]) -> Option<Range<u64>> {
    let (first, last) = (offsets.first()?, offsets.last()?);
    Some(ragged_bytes(values, *first)?..ragged_bytes(values, *last)?)
}

/// Rows `rows` of ragged column `column` of `src` (spec/dataset.md §2.1) as a per-sample column
/// of type [`sample_target_type`]`(target, sample_rank)`: each row is its slice of the values
/// tensor, `List`-nested once for the row and once per inner dimension
/// ([`SampleTarget::Values`], `sample_rank` = 1 + inner rank), or its bytes
/// ([`SampleTarget::Bytes`]) or UTF-8 text ([`SampleTarget::Text`], rank 0). All null rows
/// when the file has no such column. Reads only the offsets [`ragged_offsets`] needs and the
/// values those rows span.
pub fn ragged_column(
    src: &dyn TensorSource,
    column: &str,
    rows: Range<u64>,
    sample_rank: usize,
    target: &SampleTarget,
) -> Result<ArrayRef, ReadError> {
    let file = src.name();
    let n = rows.end.saturating_sub(rows.start);
    let Some(values) = src.header().tensor(column) else {
        return Ok(new_null_array(
            &sample_target_type(target, sample_rank),
            n as usize,
        ));
    };
    let at = |e: ReadErrorKind| e.at(&file, column);
    let off = ragged_offsets(src, column, rows.clone())?;
    let range = ragged_values_range(values, &off).ok_or_else(|| {
        at(ReadErrorKind::Invalid(format!(
            "rows of {} {:?} are not a whole number of bytes",
            values.dtype, values.shape
        )))
    })?;
    let first = off.first().copied().unwrap_or(0);
    let count = off.last().copied().unwrap_or(0) - first;
    match target {
        SampleTarget::Values(element) => {
            let inner = values.shape.get(1..).unwrap_or_default();
            if sample_rank != inner.len() + 1 {
                return Err(at(ReadErrorKind::Invalid(format!(
                    "expected rows of rank {sample_rank}, the values tensor has shape {:?}",
                    values.shape
                ))));
            }
            if count > MAX_OFFSET {
                return Err(at(too_large("list elements", count)));
            }
            let bytes = src.read(values, range)?;
            let items = sample_array(values.dtype, inner, count, &bytes).map_err(|e| {
                at(match e {
                    ReadErrorKind::U64Overflow { index, value } => ReadErrorKind::U64Overflow {
                        index: index + first * checked_product(inner).unwrap_or(0),
                        value,
                    },
                    e => e,
                })
            })?;
            // every offset is ≤ count ≤ i32::MAX
            let offsets: Vec<i32> = off.iter().map(|&o| (o - first) as i32).collect();
            let list = ListArray::try_new(
                element_field(items.data_type().clone()),
                OffsetBuffer::new(ScalarBuffer::from(offsets)),
                items,
                None,
            )
            .map_err(|e| at(e.into()))?;
            widen_nested(Arc::new(list), element).map_err(at)
        }
        SampleTarget::Bytes | SampleTarget::Text => {
            let total = range.end - range.start;
            if total > MAX_OFFSET {
                return Err(at(too_large("data bytes", total)));
            }
            let bytes = src.read(values, range)?;
            let mut offsets: Vec<i32> = Vec::with_capacity(off.len());
            for &o in &off {
                let b = ragged_bytes(values, o - first).unwrap_or(u64::MAX);
                if b > total {
                    return Err(at(ReadErrorKind::Invalid(format!(
                        "a row of {} elements of shape {:?} is not a whole number of bytes",
                        values.dtype,
                        values.shape.get(1..).unwrap_or_default()
                    ))));
                }
                offsets.push(b as i32);
            }
            if *target == SampleTarget::Text {
                for (i, w) in offsets.windows(2).enumerate() {
                    let row = bytes.get(w[0] as usize..w[1] as usize).unwrap_or_default();
                    if let Err(e) = std::str::from_utf8(row) {
                        return Err(at(ReadErrorKind::NotUtf8 {
                            row: rows.start + i as u64,
                            detail: e.to_string(),
                        }));
                    }
                }
                let array = StringArray::try_new(
                    OffsetBuffer::new(ScalarBuffer::from(offsets)),
                    arrow_buffer::Buffer::from_slice_ref(&bytes),
                    None,
                )
                .map_err(|e| at(e.into()))?;
                return Ok(Arc::new(array));
            }
            let array = BinaryArray::try_new(
                OffsetBuffer::new(ScalarBuffer::from(offsets)),
                arrow_buffer::Buffer::from_slice_ref(&bytes),
                None,
            )
            .map_err(|e| at(e.into()))?;
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

fn batch(
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

// ---------------------------------------------------------------------------------------------
// Per tensor
// ---------------------------------------------------------------------------------------------

/// Optional columns of the per-tensor layout.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TensorRowOptions {
    /// Include the `data` column (the tensor's raw bytes). Without it no data byte is read.
    pub data: bool,
    /// Include a `decoded` column: `List<element>` of the tensor's values, flattened in C
    /// order (the `shape` column gives the shape), widened exactly to `element` (see
    /// [`widen`]; [`super::common_element`] picks one for a set of dtypes). Null for dtypes
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
    /// `flags`: the file's forensic flags, cut to these fields (see [`super::forensic_columns`]).
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

fn tensor_row_columns(opts: &TensorRowOptions) -> Vec<TensorColumn> {
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
fn per_file<T>(rows: &[(&dyn TensorSource, &TensorInfo)], of: fn(&Header) -> T) -> Vec<Arc<T>> {
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

fn shape_column<'a>(shapes: impl Iterator<Item = Option<&'a [u64]>>) -> ArrayRef {
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

fn decoded_column(
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

// ---------------------------------------------------------------------------------------------
// Per file
// ---------------------------------------------------------------------------------------------

/// A field of the Tensor Struct.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TensorField {
    /// `data` (Binary): the raw bytes; the only field that reads data bytes.
    Data,
    /// `shape` (`List<Int64>`).
    Shape,
    /// `dtype` (Utf8).
    Dtype,
}

impl TensorField {
    /// Every field, in the Tensor Struct's order.
    pub const ALL: [TensorField; 3] = [TensorField::Data, TensorField::Shape, TensorField::Dtype];

    pub fn name(self) -> &'static str {
        match self {
            TensorField::Data => "data",
            TensorField::Shape => "shape",
            TensorField::Dtype => "dtype",
        }
    }

    /// Parses a field name (`data`, `shape`, `dtype`).
    pub fn from_name(name: &str) -> Option<TensorField> {
        TensorField::ALL.into_iter().find(|f| f.name() == name)
    }

    pub fn field(self) -> Field {
        match self {
            TensorField::Data => Field::new("data", DataType::Binary, false),
            TensorField::Shape => Field::new("shape", shape_type(), false),
            TensorField::Dtype => Field::new("dtype", DataType::Utf8, false),
        }
    }
}

/// The Tensor Struct type: `{data: Binary, shape: List<Int64>, dtype: Utf8}` (the type the
/// writer accepts back).
pub fn tensor_struct_type() -> DataType {
    DataType::Struct(tensor_struct_fields())
}

fn tensor_struct_fields() -> Fields {
    tensor_struct_fields_of(&TensorField::ALL)
}

/// The Tensor Struct's fields pruned to `fields` (in that order).
pub fn tensor_struct_fields_of(fields: &[TensorField]) -> Fields {
    Fields::from(fields.iter().map(|f| f.field()).collect::<Vec<_>>())
}

/// Schema of [`file_rows`]: `file`, one nullable Tensor Struct column per key (named after
/// it), `metadata`.
pub fn file_rows_schema(keys: &[&str]) -> SchemaRef {
    let mut fields = vec![Field::new("file", DataType::Utf8, false)];
    fields.extend(
        keys.iter()
            .map(|k| Field::new(*k, tensor_struct_type(), true)),
    );
    fields.push(metadata_field());
    Arc::new(Schema::new(fields))
}

/// One column of the per-file layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileColumn<'a> {
    /// `file` (Utf8): the source's name.
    File,
    /// `metadata`: the file's `__metadata__`.
    Metadata,
    /// `flags`: the file's forensic flags, cut to these fields.
    Flags(&'a [String]),
    /// `model_info`: the file's model information, cut to these fields.
    ModelInfo(&'a [String]),
    /// `sha256`: of each whole file, lower-case hex, computed by the caller (one per file:
    /// the bytes are streamed, never held; see `read::task`).
    Sha256(&'a [String]),
    /// A Tensor Struct (nullable: null when the file has no tensor `key`) with `fields`.
    Tensor {
        key: &'a str,
        fields: &'a [TensorField],
    },
}

impl FileColumn<'_> {
    /// The column's Arrow field (a tensor column is named after its key).
    pub fn field(&self) -> Field {
        match self {
            FileColumn::File => Field::new("file", DataType::Utf8, false),
            FileColumn::Metadata => metadata_field(),
            FileColumn::Flags(fields) => Field::new("flags", flags_type(fields), false),
            FileColumn::ModelInfo(fields) => {
                Field::new("model_info", model_info_type(fields), false)
            }
            FileColumn::Sha256(_) => Field::new("sha256", DataType::Utf8, false),
            FileColumn::Tensor { key, fields } => Field::new(
                *key,
                DataType::Struct(tensor_struct_fields_of(fields)),
                true,
            ),
        }
    }
}

/// One row per file: for each key a Tensor Struct (null when the file has no such tensor).
/// The `data` bytes of one key column over the batch must stay within `i32::MAX`.
pub fn file_rows(files: &[&dyn TensorSource], keys: &[&str]) -> Result<RecordBatch, ReadError> {
    let schema = file_rows_schema(keys);
    let mut columns = vec![FileColumn::File];
    columns.extend(keys.iter().map(|key| FileColumn::Tensor {
        key,
        fields: &TensorField::ALL,
    }));
    columns.push(FileColumn::Metadata);
    let arrays = file_columns(files, &columns)?;
    let first = files.first().map(|s| s.name()).unwrap_or_default();
    RecordBatch::try_new(schema, arrays).map_err(|e| ReadErrorKind::from(e).in_file(&first))
}

/// The arrays of the per-file `columns` (typed as [`FileColumn::field`]), one row per file.
/// Only the `data` field reads data bytes; its bytes over the batch must stay within
/// `i32::MAX` per column.
pub fn file_columns(
    files: &[&dyn TensorSource],
    columns: &[FileColumn<'_>],
) -> Result<Vec<ArrayRef>, ReadError> {
    let names: Vec<_> = files.iter().map(|s| s.name()).collect();
    let first = names.first().map_or("", |n| n.as_ref()).to_owned();
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(columns.len());
    for column in columns {
        let array: ArrayRef = match column {
            FileColumn::File => Arc::new(StringArray::from_iter_values(
                names.iter().map(|n| n.as_ref()),
            )),
            FileColumn::Metadata => {
                metadata_column(files.iter().map(|s| s.header().metadata.as_ref()))
                    .map_err(|e| e.in_file(&first))?
            }
            FileColumn::Flags(fields) => {
                let all: Vec<Vec<Flag>> = files.iter().map(|s| flags_of(s.header())).collect();
                let refs: Vec<&[Flag]> = all.iter().map(Vec::as_slice).collect();
                flags_column(&refs, fields).map_err(|e| e.in_file(&first))?
            }
            FileColumn::ModelInfo(fields) => {
                let all: Vec<ModelInfo> = files.iter().map(|s| model_info_of(s.header())).collect();
                let refs: Vec<&ModelInfo> = all.iter().collect();
                model_info_column(&refs, fields).map_err(|e| e.in_file(&first))?
            }
            FileColumn::Sha256(digests) => {
                if digests.len() != files.len() {
                    return Err(ReadErrorKind::Invalid(format!(
                        "{} file digests for {} files",
                        digests.len(),
                        files.len()
                    ))
                    .in_file(&first));
                }
                Arc::new(StringArray::from_iter_values(digests.iter()))
            }
            FileColumn::Tensor { key, fields } => {
                let infos: Vec<Option<&TensorInfo>> =
                    files.iter().map(|s| s.header().tensor(key)).collect();
                let mut children: Vec<ArrayRef> = Vec::with_capacity(fields.len());
                for field in *fields {
                    children.push(match field {
                        TensorField::Data => {
                            let total: u64 = infos.iter().flatten().map(|t| t.byte_len()).sum();
                            if total > MAX_OFFSET {
                                return Err(too_large("data bytes", total).at(&first, key));
                            }
                            let mut data =
                                BinaryBuilder::with_capacity(files.len(), total as usize);
                            for (src, info) in files.iter().zip(&infos) {
                                match info {
                                    Some(t) => data.append_value(tensor_bytes(*src, t)?),
                                    None => data.append_value([]),
                                }
                            }
                            Arc::new(data.finish())
                        }
                        TensorField::Shape => {
                            shape_column(infos.iter().map(|i| i.map(|t| t.shape.as_slice())))
                        }
                        TensorField::Dtype => Arc::new(StringArray::from_iter_values(
                            infos.iter().map(|i| i.map_or("", |t| t.dtype.name())),
                        )),
                    });
                }
                let nulls = NullBuffer::from(infos.iter().map(Option::is_some).collect::<Vec<_>>());
                let s = if fields.is_empty() {
                    StructArray::new_empty_fields(files.len(), Some(nulls))
                } else {
                    StructArray::try_new(tensor_struct_fields_of(fields), children, Some(nulls))
                        .map_err(|e| ReadErrorKind::from(e).at(&first, key))?
                };
                Arc::new(s)
            }
        };
        arrays.push(array);
    }
    Ok(arrays)
}
