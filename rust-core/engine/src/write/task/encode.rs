//! Arrow → tensor bytes (the write side's encoding; `read::decode` is the way back): validates the rows
//! of one wire-format column and appends their converted bytes to a buffer.
//!
//! Numeric arrays and scalars are converted in bulk over a whole run of rows (the values of
//! consecutive rows are contiguous in the leaf array); binary, Tensor Struct and ML vector values
//! are handled row by row.

use super::WriteError;
use crate::write::{ColumnPlan, InputKind, SparkNumeric};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type};
use arrow_array::{Array, ArrayRef, BinaryArray, ListArray, StructArray};
use arrow_schema::DataType;
use safetensors_spark_format::convert::{self, ConvertError, Source};
use safetensors_spark_format::header;
use safetensors_spark_format::Dtype;
use std::ops::Range;

mod binary;
mod numeric;
mod ragged;
mod tensor_struct;
mod vector;

use binary::*;
use numeric::*;
pub(crate) use ragged::*;
use tensor_struct::*;
use vector::*;

/// One row's tensor: its shape, dtype and bytes (`bytes` is a range of the output buffer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RowTensor {
    pub shape: Vec<u64>,
    pub dtype: Dtype,
    pub bytes: Range<usize>,
}

/// What a task has learnt about a column so far.
#[derive(Debug, Clone)]
pub(crate) struct ColumnState {
    pub plan: ColumnPlan,
    /// The column's dtype: the plan's, or fixed by the first row (Tensor Struct without dtype).
    pub dtype: Option<Dtype>,
    /// Batch mode: the sample shape fixed by the first row.
    pub shape: Option<Vec<u64>>,
    /// Whether every row must have the same sample shape (batch mode).
    pub fix_shape: bool,
    /// A ragged column (batch mode): its inner shape as far as known (`None`: a dimension no
    /// row has shown yet).
    pub inner: Option<Vec<Option<u64>>>,
}

impl ColumnState {
    pub fn new(plan: ColumnPlan, fix_shape: bool) -> Self {
        let inner = plan
            .ragged
            .as_ref()
            .map(|r| match (&r.inner_shape, &plan.input) {
                (Some(known), _) => known.iter().map(|&d| Some(d)).collect(),
                (None, InputKind::NumericArray { depth, .. }) => {
                    vec![None; (*depth as usize).saturating_sub(1)]
                }
                (None, _) => Vec::new(),
            });
        ColumnState {
            dtype: None,
            shape: None,
            plan,
            fix_shape,
            inner,
        }
    }

    /// A ragged column's inner shape for a shard's values tensor: a dimension no row has shown
    /// (the rows so far hold no element there) is 0.
    pub fn inner_shape_or_zero(&self) -> Vec<u64> {
        self.inner
            .as_ref()
            .map(|v| v.iter().map(|d| d.unwrap_or(0)).collect())
            .unwrap_or_default()
    }

    /// The hint added to a shape error of an array column written fixed-shape.
    fn ragged_hint(&self) -> &'static str {
        match self.plan.input {
            InputKind::NumericArray { .. } => {
                "; name the column in option ragged to store rows of different lengths"
            }
            _ => "",
        }
    }

    /// The dtype a numeric (non-struct) value of this column is written as.
    fn numeric_target(&self) -> Dtype {
        match (&self.plan.dtype, &self.plan.input) {
            (Some(d), _) => *d,
            (None, InputKind::NumericArray { element, .. } | InputKind::Scalar { element }) => {
                element.natural_dtype()
            }
            (None, _) => Dtype::F64,
        }
    }

    fn err(&self, row: u64, message: impl Into<String>) -> WriteError {
        WriteError::Row {
            column: self.plan.name.clone(),
            row,
            message: message.into(),
        }
    }

    fn conv_err(&self, row: u64, source: ConvertError) -> WriteError {
        WriteError::Convert {
            column: self.plan.name.clone(),
            row,
            source,
        }
    }

    /// Applies the `shapes` option to a value of `elements` elements whose own shape is `own`.
    fn reshape(&self, row: u64, own: Vec<u64>, elements: u64) -> Result<Vec<u64>, WriteError> {
        match &self.plan.sample_shape {
            None => Ok(own),
            Some(target) => {
                let wanted = target.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
                if wanted == Some(elements) {
                    Ok(target.clone())
                } else {
                    let wanted =
                        wanted.map_or_else(|| "overflowing".to_string(), |w| w.to_string());
                    Err(self.err(
                        row,
                        format!(
                            "{elements} elements cannot be reshaped to {} ({wanted} elements)",
                            fmt_shape(target)
                        ),
                    ))
                }
            }
        }
    }

    /// Checks a row's dtype and shape against the earlier rows (and fixes them on the first).
    fn accept(&mut self, row: u64, shape: &[u64], dtype: Dtype) -> Result<(), WriteError> {
        match self.dtype {
            None => self.dtype = Some(dtype),
            Some(d) if d != dtype => {
                return Err(self.err(
                    row,
                    format!("dtype {dtype} differs from {d} of earlier rows"),
                ))
            }
            Some(_) => {}
        }
        if self.fix_shape {
            match &self.shape {
                None => self.shape = Some(shape.to_vec()),
                Some(s) if s.as_slice() != shape => {
                    return Err(self.err(
                        row,
                        format!(
                            "sample shape {} differs from {} of earlier rows{}",
                            fmt_shape(shape),
                            fmt_shape(s),
                            self.ragged_hint()
                        ),
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

/// `[3,2,3]`.
pub(crate) fn fmt_shape(shape: &[u64]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(","))
}

fn primitive_type(e: SparkNumeric) -> DataType {
    match e {
        SparkNumeric::Boolean | SparkNumeric::Byte => DataType::Int8,
        SparkNumeric::Short => DataType::Int16,
        SparkNumeric::Int => DataType::Int32,
        SparkNumeric::Long => DataType::Int64,
        SparkNumeric::Float => DataType::Float32,
        SparkNumeric::Double => DataType::Float64,
    }
}

/// The Arrow type the wire format uses for a column, for error messages.
pub(crate) fn expected_type(input: &InputKind) -> String {
    match input {
        InputKind::NumericArray { element, depth } => {
            let mut s = format!("{:?}", primitive_type(*element));
            for _ in 0..*depth {
                s = format!("List<{s}>");
            }
            s
        }
        InputKind::Scalar { element } => format!("{:?}", primitive_type(*element)),
        InputKind::Binary => "Binary".into(),
        InputKind::TensorStruct => "Struct{data: Binary, shape: List<Int64>, dtype: Utf8}".into(),
        InputKind::MlVector => {
            "Struct{type: Int8, size: Int32, indices: List<Int32>, values: List<Float64>}".into()
        }
        InputKind::String => "Utf8".into(),
    }
}

fn list_item(dt: &DataType) -> Option<&DataType> {
    match dt {
        DataType::List(f) => Some(f.data_type()),
        _ => None,
    }
}

fn struct_field<'a>(dt: &'a DataType, name: &str) -> Option<&'a DataType> {
    match dt {
        DataType::Struct(fields) => fields
            .iter()
            .find(|f| f.name() == name)
            .map(|f| f.data_type()),
        _ => None,
    }
}

/// Whether an Arrow type is the wire type of a column.
pub(crate) fn type_matches(input: &InputKind, dt: &DataType) -> bool {
    match input {
        InputKind::NumericArray { element, depth } => {
            let mut t = dt;
            for _ in 0..*depth {
                match list_item(t) {
                    Some(inner) => t = inner,
                    None => return false,
                }
            }
            *t == primitive_type(*element)
        }
        InputKind::Scalar { element } => *dt == primitive_type(*element),
        InputKind::Binary => *dt == DataType::Binary,
        InputKind::String => *dt == DataType::Utf8,
        InputKind::TensorStruct => {
            struct_field(dt, "data") == Some(&DataType::Binary)
                && struct_field(dt, "dtype") == Some(&DataType::Utf8)
                && matches!(
                    struct_field(dt, "shape").and_then(list_item),
                    Some(DataType::Int64 | DataType::Int32)
                )
        }
        InputKind::MlVector => {
            struct_field(dt, "type") == Some(&DataType::Int8)
                && struct_field(dt, "size") == Some(&DataType::Int32)
                && struct_field(dt, "indices").and_then(list_item) == Some(&DataType::Int32)
                && struct_field(dt, "values").and_then(list_item) == Some(&DataType::Float64)
        }
    }
}

/// The leaf values of a numeric column, as the conversions take them (never `Bool`: Spark's
/// booleans reach the writer as `Int8`).
fn leaf_values(array: &dyn Array) -> Option<Source<'_>> {
    Some(match array.data_type() {
        DataType::Int8 => Source::I8(array.as_primitive_opt::<Int8Type>()?.values()),
        DataType::Int16 => Source::I16(array.as_primitive_opt::<Int16Type>()?.values()),
        DataType::Int32 => Source::I32(array.as_primitive_opt::<Int32Type>()?.values()),
        DataType::Int64 => Source::I64(array.as_primitive_opt::<Int64Type>()?.values()),
        DataType::Float32 => Source::F32(array.as_primitive_opt::<Float32Type>()?.values()),
        DataType::Float64 => Source::F64(array.as_primitive_opt::<Float64Type>()?.values()),
        _ => return None,
    })
}

/// A conversion error with its element index replaced (to make it relative to a row).
fn reindex(e: ConvertError, new_index: usize) -> ConvertError {
    match e {
        ConvertError::OutOfRange {
            value,
            from,
            to,
            range,
            ..
        } => ConvertError::OutOfRange {
            value,
            index: new_index,
            from,
            to,
            range,
        },
        ConvertError::NotWhole {
            value, from, to, ..
        } => ConvertError::NotWhole {
            value,
            index: new_index,
            from,
            to,
        },
        ConvertError::NotFinite {
            value, from, to, ..
        } => ConvertError::NotFinite {
            value,
            index: new_index,
            from,
            to,
        },
        ConvertError::NotBool { value, from, .. } => ConvertError::NotBool {
            value,
            index: new_index,
            from,
        },
        other => other,
    }
}

fn error_index(e: &ConvertError) -> Option<usize> {
    match e {
        ConvertError::OutOfRange { index, .. }
        | ConvertError::NotWhole { index, .. }
        | ConvertError::NotFinite { index, .. }
        | ConvertError::NotBool { index, .. } => Some(*index),
        _ => None,
    }
}

fn usize_of(v: i32) -> usize {
    // Offsets of a validated Arrow array are non-negative.
    usize::try_from(v).unwrap_or(0)
}

fn malformed(col: &ColumnState, what: impl Into<String>) -> WriteError {
    WriteError::Malformed {
        column: col.plan.name.clone(),
        message: what.into(),
    }
}

/// Validates rows `rows` of `array` (the column's wire child), appends their converted bytes to
/// `out` and returns one [`RowTensor`] per row. `row_base` is the partition row number of the
/// array's row 0.
pub(crate) fn extract(
    col: &mut ColumnState,
    array: &ArrayRef,
    rows: Range<usize>,
    row_base: u64,
    out: &mut Vec<u8>,
) -> Result<Vec<RowTensor>, WriteError> {
    if rows.end > array.len() || rows.start > rows.end {
        return Err(malformed(
            col,
            format!("rows {rows:?} out of an array of {} rows", array.len()),
        ));
    }
    match col.plan.input.clone() {
        InputKind::NumericArray { element, depth } => {
            extract_numeric(col, array, element, depth, rows, row_base, out)
        }
        InputKind::Scalar { element } => extract_scalar(col, array, element, rows, row_base, out),
        InputKind::Binary => extract_binary(col, array, rows, row_base, out),
        InputKind::TensorStruct => extract_struct(col, array, rows, row_base, out),
        InputKind::MlVector => extract_vector(col, array, rows, row_base, out),
        InputKind::String => Err(malformed(col, "a string column is written ragged only")),
    }
}

/// Checks that the bytes of a boolean column are 0 or 1; returns the first bad (index, value).
fn bad_bool(leaf: &Source<'_>, r: Range<usize>) -> Option<(usize, i8)> {
    match leaf {
        Source::I8(s) => s
            .get(r)
            .and_then(|v| v.iter().enumerate().find(|(_, &b)| b != 0 && b != 1))
            .map(|(i, &b)| (i, b)),
        _ => None,
    }
}

/// Converts the rows whose leaf ranges are `ranges` (contiguous) in one call and builds their
/// [`RowTensor`]s; a conversion error is attributed to its row.
#[allow(clippy::too_many_arguments)]
fn convert_run(
    col: &ColumnState,
    leaf: &Source<'_>,
    ranges: &[Range<usize>],
    shapes: Vec<Vec<u64>>,
    dtype: Dtype,
    row_numbers: &[u64],
    out: &mut Vec<u8>,
) -> Result<Vec<RowTensor>, WriteError> {
    let (Some(first), Some(last)) = (ranges.first(), ranges.last()) else {
        return Ok(Vec::new());
    };
    let all = first.start..last.end;
    let size = dtype.byte_size().unwrap_or(1);
    let src = leaf
        .slice(all.clone())
        .ok_or_else(|| malformed(col, format!("leaf values {all:?} out of bounds")))?;
    let start = out.len();
    if let Err(e) = convert::append_converted(src, dtype, out) {
        let at = error_index(&e).map(|i| i + all.start);
        let row = at.and_then(|at| ranges.iter().position(|r| r.start <= at && at < r.end));
        return Err(match (row, at) {
            (Some(i), Some(at)) => {
                let local = at - ranges[i].start;
                col.conv_err(row_numbers[i], reindex(e, local))
            }
            _ => col.conv_err(row_numbers.first().copied().unwrap_or(0), e),
        });
    }
    Ok(ranges
        .iter()
        .zip(shapes)
        .map(|(r, shape)| RowTensor {
            shape,
            dtype,
            bytes: start + (r.start - all.start) * size..start + (r.end - all.start) * size,
        })
        .collect())
}

/// The `depth` list levels of an array column and its leaf values, checked against the plan's
/// element type (fixed-shape and ragged columns alike).
fn list_levels<'a>(
    col: &ColumnState,
    array: &'a ArrayRef,
    element: SparkNumeric,
    depth: u32,
) -> Result<(Vec<&'a ListArray>, &'a dyn Array, Source<'a>), WriteError> {
    let found = || {
        format!(
            "expected Arrow type {}, found {:?}",
            expected_type(&col.plan.input),
            array.data_type()
        )
    };
    let mut levels: Vec<&ListArray> = Vec::with_capacity(depth as usize);
    let mut current: &dyn Array = array.as_ref();
    for _ in 0..depth {
        let list = current
            .as_list_opt::<i32>()
            .ok_or_else(|| malformed(col, found()))?;
        levels.push(list);
        current = list.values().as_ref();
    }
    let leaf_array = current;
    let leaf = leaf_values(leaf_array).ok_or_else(|| malformed(col, found()))?;
    if primitive_type(element) != *leaf_array.data_type() {
        return Err(malformed(col, found()));
    }
    Ok((levels, leaf_array, leaf))
}

fn field<'a>(s: &'a StructArray, name: &str) -> Option<&'a ArrayRef> {
    s.column_by_name(name)
}

/// `[3,?]`: an inner shape as far as known.
fn fmt_inner(shape: &[Option<u64>]) -> String {
    let parts: Vec<String> = shape
        .iter()
        .map(|d| d.map_or_else(|| "?".to_string(), |d| d.to_string()))
        .collect();
    format!("[{}]", parts.join(","))
}

/// Appends the next offset of a ragged column: `len` more elements after the last.
fn push_offset(
    col: &ColumnState,
    row: u64,
    offsets: &mut Vec<i64>,
    len: usize,
) -> Result<(), WriteError> {
    let last = offsets.last().copied().unwrap_or(0);
    let next = i64::try_from(len)
        .ok()
        .and_then(|l| last.checked_add(l))
        .ok_or_else(|| {
            col.err(
                row,
                format!(
                    "the shard's rows of this ragged column would hold more than {} elements (its offsets are I64)",
                    i64::MAX
                ),
            )
        })?;
    offsets.push(next);
    Ok(())
}

/// Reserves `more` bytes of a ragged column's shard buffer, or fails naming column and row.
fn reserve(col: &ColumnState, row: u64, out: &mut Vec<u8>, more: usize) -> Result<(), WriteError> {
    out.try_reserve(more).map_err(|_| {
        col.err(
            row,
            format!(
                "the shard's values of this ragged column would take more than the {} bytes already held plus {more}: the shard does not fit in memory (lower batch_size)",
                out.len()
            ),
        )
    })
}
