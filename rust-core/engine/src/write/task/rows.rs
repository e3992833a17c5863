//! Arrow → per-row tensors: validates the rows of one wire-format column and appends their
//! converted bytes to a buffer.
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

fn extract_numeric(
    col: &mut ColumnState,
    array: &ArrayRef,
    element: SparkNumeric,
    depth: u32,
    rows: Range<usize>,
    row_base: u64,
    out: &mut Vec<u8>,
) -> Result<Vec<RowTensor>, WriteError> {
    let (levels, leaf_array, leaf) = list_levels(col, array, element, depth)?;
    let dtype = col.numeric_target();
    let mut ranges = Vec::with_capacity(rows.len());
    let mut shapes = Vec::with_capacity(rows.len());
    let mut numbers = Vec::with_capacity(rows.len());
    let mut pending: Option<WriteError> = None;
    'rows: for i in rows {
        let row = row_base + i as u64;
        let mut shape = vec![0u64; depth as usize];
        let (mut lo, mut hi) = (i, i + 1);
        for (d, list) in levels.iter().enumerate() {
            if list.null_count() > 0 {
                if let Some(j) = (lo..hi).find(|&j| list.is_null(j)) {
                    pending = Some(col.err(
                        row,
                        if d == 0 {
                            "null value".to_string()
                        } else {
                            format!("null inner array at index {} of dimension {d}", j - lo)
                        },
                    ));
                    break 'rows;
                }
            }
            let offsets = list.value_offsets();
            let (Some(&o_lo), Some(&o_hi)) = (offsets.get(lo), offsets.get(hi)) else {
                pending = Some(malformed(col, "list offsets out of bounds"));
                break 'rows;
            };
            if hi > lo {
                let len_of =
                    |j: usize| usize_of(offsets[j + 1]).saturating_sub(usize_of(offsets[j]));
                let first = len_of(lo);
                if let Some(other) = (lo + 1..hi).map(len_of).find(|&l| l != first) {
                    pending = Some(col.err(
                        row,
                        format!(
                            "ragged nested array: inner lengths {first} and {other}{}",
                            col.ragged_hint()
                        ),
                    ));
                    break 'rows;
                }
                shape[d] = first as u64;
            }
            lo = usize_of(o_lo);
            hi = usize_of(o_hi);
        }
        if hi > leaf.len() || lo > hi {
            pending = Some(malformed(col, "list offsets out of bounds"));
            break;
        }
        if leaf_array.null_count() > 0 {
            if let Some(j) = (lo..hi).find(|&j| leaf_array.is_null(j)) {
                pending = Some(col.err(row, format!("null element at index {}", j - lo)));
                break;
            }
        }
        if element == SparkNumeric::Boolean {
            if let Some((j, b)) = bad_bool(&leaf, lo..hi) {
                pending = Some(col.err(
                    row,
                    format!("boolean element at index {j} has byte value {b} (expected 0 or 1)"),
                ));
                break;
            }
        }
        let shape = match col.reshape(row, shape, (hi - lo) as u64) {
            Ok(s) => s,
            Err(e) => {
                pending = Some(e);
                break;
            }
        };
        if let Err(e) = col.accept(row, &shape, dtype) {
            pending = Some(e);
            break;
        }
        ranges.push(lo..hi);
        shapes.push(shape);
        numbers.push(row);
    }
    // Rows before the first failing one are converted first, so a conversion error in an
    // earlier row is the one reported.
    let tensors = convert_run(col, &leaf, &ranges, shapes, dtype, &numbers, out)?;
    match pending {
        Some(e) => Err(e),
        None => Ok(tensors),
    }
}

fn extract_scalar(
    col: &mut ColumnState,
    array: &ArrayRef,
    element: SparkNumeric,
    rows: Range<usize>,
    row_base: u64,
    out: &mut Vec<u8>,
) -> Result<Vec<RowTensor>, WriteError> {
    let leaf = leaf_values(array.as_ref())
        .filter(|_| *array.data_type() == primitive_type(element))
        .ok_or_else(|| {
            malformed(
                col,
                format!(
                    "expected Arrow type {}, found {:?}",
                    expected_type(&col.plan.input),
                    array.data_type()
                ),
            )
        })?;
    let dtype = col.numeric_target();
    let mut ranges = Vec::with_capacity(rows.len());
    let mut shapes = Vec::with_capacity(rows.len());
    let mut numbers = Vec::with_capacity(rows.len());
    let mut pending = None;
    for i in rows {
        let row = row_base + i as u64;
        if array.is_null(i) {
            pending = Some(col.err(row, "null value"));
            break;
        }
        if element == SparkNumeric::Boolean {
            if let Some((_, b)) = bad_bool(&leaf, i..i + 1) {
                pending = Some(col.err(
                    row,
                    format!("boolean value has byte value {b} (expected 0 or 1)"),
                ));
                break;
            }
        }
        let shape = match col
            .reshape(row, Vec::new(), 1)
            .and_then(|s| col.accept(row, &s, dtype).map(|()| s))
        {
            Ok(s) => s,
            Err(e) => {
                pending = Some(e);
                break;
            }
        };
        ranges.push(i..i + 1);
        shapes.push(shape);
        numbers.push(row);
    }
    let tensors = convert_run(col, &leaf, &ranges, shapes, dtype, &numbers, out)?;
    match pending {
        Some(e) => Err(e),
        None => Ok(tensors),
    }
}

fn extract_binary(
    col: &mut ColumnState,
    array: &ArrayRef,
    rows: Range<usize>,
    row_base: u64,
    out: &mut Vec<u8>,
) -> Result<Vec<RowTensor>, WriteError> {
    let bin: &BinaryArray = array.as_binary_opt::<i32>().ok_or_else(|| {
        malformed(
            col,
            format!("expected Arrow type Binary, found {:?}", array.data_type()),
        )
    })?;
    let Some(dtype) = col.plan.dtype else {
        return Err(malformed(col, "a binary column needs the `dtype` option"));
    };
    let size = dtype.byte_size().unwrap_or(1) as u64;
    let mut result = Vec::with_capacity(rows.len());
    for i in rows {
        let row = row_base + i as u64;
        if bin.is_null(i) {
            return Err(col.err(row, "null value"));
        }
        let bytes = bin.value(i);
        let len = bytes.len() as u64;
        let shape = match &col.plan.sample_shape {
            Some(s) => s.clone(),
            None if len.is_multiple_of(size) => vec![len / size],
            None => {
                return Err(col.err(
                    row,
                    format!("binary value of {len} bytes is not a whole number of {dtype} elements ({size} bytes each)"),
                ))
            }
        };
        let needed = header::tensor_byte_len(&col.plan.name, dtype, &shape).ok();
        if needed != Some(len) {
            let needed =
                needed.map_or_else(|| "an overflowing number of".into(), |n| n.to_string());
            return Err(col.err(
                row,
                format!(
                    "binary value has {len} bytes but shape {} of {dtype} needs {needed} bytes",
                    fmt_shape(&shape)
                ),
            ));
        }
        col.accept(row, &shape, dtype)?;
        let start = out.len();
        out.extend_from_slice(bytes);
        result.push(RowTensor {
            shape,
            dtype,
            bytes: start..out.len(),
        });
    }
    Ok(result)
}

fn field<'a>(s: &'a StructArray, name: &str) -> Option<&'a ArrayRef> {
    s.column_by_name(name)
}

/// The shape list of a Tensor Struct row as u64 dims.
fn struct_shape(
    col: &ColumnState,
    row: u64,
    shapes: &ListArray,
    i: usize,
) -> Result<Vec<u64>, WriteError> {
    let offsets = shapes.value_offsets();
    let (Some(&lo), Some(&hi)) = (offsets.get(i), offsets.get(i + 1)) else {
        return Err(malformed(col, "shape offsets out of bounds"));
    };
    let (lo, hi) = (usize_of(lo), usize_of(hi));
    let values = shapes.values();
    if values.null_count() > 0 {
        if let Some(j) = (lo..hi).find(|&j| values.is_null(j)) {
            return Err(col.err(row, format!("null dimension at index {} of shape", j - lo)));
        }
    }
    let dims: Vec<i64> = if let Some(v) = values.as_primitive_opt::<Int64Type>() {
        v.values()
            .get(lo..hi)
            .ok_or_else(|| malformed(col, "shape values out of bounds"))?
            .to_vec()
    } else if let Some(v) = values.as_primitive_opt::<Int32Type>() {
        v.values()
            .get(lo..hi)
            .ok_or_else(|| malformed(col, "shape values out of bounds"))?
            .iter()
            .map(|&d| i64::from(d))
            .collect()
    } else {
        return Err(malformed(
            col,
            format!(
                "expected shape of Arrow type List<Int64>, found List<{:?}>",
                values.data_type()
            ),
        ));
    };
    dims.iter()
        .map(|&d| {
            u64::try_from(d)
                .map_err(|_| col.err(row, format!("negative dimension {d} in shape {dims:?}")))
        })
        .collect()
}

fn le_vec<const N: usize, T>(bytes: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(N)
        .map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            f(a)
        })
        .collect()
}

/// Decoded source values of a Tensor Struct's `data`, ready for `convert`.
enum Decoded {
    F64(Vec<f64>),
    F32(Vec<f32>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    I16(Vec<i16>),
    I8(Vec<i8>),
    Bool(Vec<bool>),
}

impl Decoded {
    fn source(&self) -> Source<'_> {
        match self {
            Decoded::F64(v) => Source::F64(v),
            Decoded::F32(v) => Source::F32(v),
            Decoded::I64(v) => Source::I64(v),
            Decoded::I32(v) => Source::I32(v),
            Decoded::I16(v) => Source::I16(v),
            Decoded::I8(v) => Source::I8(v),
            Decoded::Bool(v) => Source::Bool(v),
        }
    }
}

/// Decodes little-endian `bytes` of `dtype` into a [`Source`]-compatible vector: signed and float
/// types directly, unsigned types widened (U64 → i64 when it fits), F16/BF16 to f32 (exact).
/// `Err` carries a message for a value or a dtype that cannot be decoded.
fn decode(dtype: Dtype, bytes: &[u8]) -> Result<Decoded, String> {
    Ok(match dtype {
        Dtype::F64 => Decoded::F64(le_vec(bytes, f64::from_le_bytes)),
        Dtype::F32 => Decoded::F32(le_vec(bytes, f32::from_le_bytes)),
        Dtype::F16 => Decoded::F32(le_vec(bytes, |b| {
            half::f16::from_bits(u16::from_le_bytes(b)).to_f32()
        })),
        Dtype::Bf16 => Decoded::F32(le_vec(bytes, |b| {
            half::bf16::from_bits(u16::from_le_bytes(b)).to_f32()
        })),
        Dtype::I64 => Decoded::I64(le_vec(bytes, i64::from_le_bytes)),
        Dtype::I32 => Decoded::I32(le_vec(bytes, i32::from_le_bytes)),
        Dtype::I16 => Decoded::I16(le_vec(bytes, i16::from_le_bytes)),
        Dtype::I8 => Decoded::I8(bytes.iter().map(|&b| b as i8).collect()),
        Dtype::U8 => Decoded::I16(bytes.iter().map(|&b| i16::from(b)).collect()),
        Dtype::U16 => Decoded::I32(le_vec(bytes, |b| i32::from(u16::from_le_bytes(b)))),
        Dtype::U32 => Decoded::I64(le_vec(bytes, |b| i64::from(u32::from_le_bytes(b)))),
        Dtype::U64 => {
            let wide: Vec<u64> = le_vec(bytes, u64::from_le_bytes);
            let mut v = Vec::with_capacity(wide.len());
            for (i, &x) in wide.iter().enumerate() {
                v.push(i64::try_from(x).map_err(|_| {
                    format!(
                        "U64 value {x} at element {i} is above {} and cannot be converted",
                        i64::MAX
                    )
                })?);
            }
            Decoded::I64(v)
        }
        Dtype::Bool => {
            let mut v = Vec::with_capacity(bytes.len());
            for (i, &b) in bytes.iter().enumerate() {
                match b {
                    0 => v.push(false),
                    1 => v.push(true),
                    _ => {
                        return Err(format!(
                            "BOOL element at index {i} has byte value {b} (expected 0 or 1)"
                        ))
                    }
                }
            }
            Decoded::Bool(v)
        }
        other => return Err(format!("values of dtype {other} cannot be converted")),
    })
}

fn extract_struct(
    col: &mut ColumnState,
    array: &ArrayRef,
    rows: Range<usize>,
    row_base: u64,
    out: &mut Vec<u8>,
) -> Result<Vec<RowTensor>, WriteError> {
    let wrong = || {
        malformed(
            col,
            format!(
                "expected Arrow type {}, found {:?}",
                expected_type(&InputKind::TensorStruct),
                array.data_type()
            ),
        )
    };
    let s = array.as_struct_opt().ok_or_else(wrong)?;
    let data = field(s, "data")
        .and_then(|a| a.as_binary_opt::<i32>())
        .ok_or_else(wrong)?;
    let shapes = field(s, "shape")
        .and_then(|a| a.as_list_opt::<i32>())
        .ok_or_else(wrong)?;
    let dtypes = field(s, "dtype")
        .and_then(|a| a.as_string_opt::<i32>())
        .ok_or_else(wrong)?;
    let mut result = Vec::with_capacity(rows.len());
    for i in rows {
        let row = row_base + i as u64;
        if s.is_null(i) {
            return Err(col.err(row, "null value"));
        }
        for (name, a) in [
            ("data", data as &dyn Array),
            ("shape", shapes as &dyn Array),
            ("dtype", dtypes as &dyn Array),
        ] {
            if a.is_null(i) {
                return Err(col.err(row, format!("null field '{name}' of the tensor struct")));
            }
        }
        let dtype_name = dtypes.value(i);
        let src_dtype = Dtype::from_name(dtype_name).ok_or_else(|| {
            col.err(
                row,
                format!("unknown dtype '{dtype_name}' (dtype names are exact and case-sensitive)"),
            )
        })?;
        let own_shape = struct_shape(col, row, shapes, i)?;
        let bytes = data.value(i);
        let needed = header::tensor_byte_len(&col.plan.name, src_dtype, &own_shape).map_err(|_| {
            col.err(
                row,
                format!(
                    "shape {} of {src_dtype} does not describe a whole number of bytes or overflows",
                    fmt_shape(&own_shape)
                ),
            )
        })?;
        if needed != bytes.len() as u64 {
            return Err(col.err(
                row,
                format!(
                    "data has {} bytes but shape {} of {src_dtype} needs {needed}",
                    bytes.len(),
                    fmt_shape(&own_shape)
                ),
            ));
        }
        let elements: u64 = own_shape.iter().product();
        let shape = col.reshape(row, own_shape, elements)?;
        let target = col.plan.dtype.unwrap_or(src_dtype);
        if !target.is_writable() {
            return Err(col.err(
                row,
                format!(
                    "dtype {target} cannot be written; writable dtypes are {}",
                    Dtype::writable_names().join(", ")
                ),
            ));
        }
        col.accept(row, &shape, target)?;
        let start = out.len();
        if target == src_dtype {
            out.extend_from_slice(bytes);
        } else {
            let decoded = decode(src_dtype, bytes).map_err(|m| {
                col.err(row, format!("cannot convert {src_dtype} to {target}: {m}"))
            })?;
            convert::append_converted(decoded.source(), target, out)
                .map_err(|e| col.conv_err(row, e))?;
        }
        result.push(RowTensor {
            shape,
            dtype: target,
            bytes: start..out.len(),
        });
    }
    Ok(result)
}

fn f64_list<'a>(
    col: &ColumnState,
    list: &'a ListArray,
    i: usize,
) -> Result<(&'a [f64], Range<usize>), WriteError> {
    let offsets = list.value_offsets();
    let (Some(&lo), Some(&hi)) = (offsets.get(i), offsets.get(i + 1)) else {
        return Err(malformed(col, "vector offsets out of bounds"));
    };
    let r = usize_of(lo)..usize_of(hi);
    let v = list
        .values()
        .as_primitive_opt::<Float64Type>()
        .and_then(|p| p.values().get(r.clone()))
        .ok_or_else(|| malformed(col, "vector values out of bounds or not Float64"))?;
    Ok((v, r))
}

fn extract_vector(
    col: &mut ColumnState,
    array: &ArrayRef,
    rows: Range<usize>,
    row_base: u64,
    out: &mut Vec<u8>,
) -> Result<Vec<RowTensor>, WriteError> {
    let wrong = || {
        malformed(
            col,
            format!(
                "expected Arrow type {}, found {:?}",
                expected_type(&InputKind::MlVector),
                array.data_type()
            ),
        )
    };
    let s = array.as_struct_opt().ok_or_else(wrong)?;
    let kinds = field(s, "type")
        .and_then(|a| a.as_primitive_opt::<Int8Type>())
        .ok_or_else(wrong)?;
    let sizes = field(s, "size")
        .and_then(|a| a.as_primitive_opt::<Int32Type>())
        .ok_or_else(wrong)?;
    let indices = field(s, "indices")
        .and_then(|a| a.as_list_opt::<i32>())
        .ok_or_else(wrong)?;
    let values = field(s, "values")
        .and_then(|a| a.as_list_opt::<i32>())
        .ok_or_else(wrong)?;
    let index_values = indices
        .values()
        .as_primitive_opt::<Int32Type>()
        .ok_or_else(wrong)?;
    let dtype = col.numeric_target();
    let mut result = Vec::with_capacity(rows.len());
    for i in rows {
        let row = row_base + i as u64;
        if s.is_null(i) || kinds.is_null(i) {
            return Err(col.err(row, "null value"));
        }
        if values.is_null(i) {
            return Err(col.err(row, "null 'values' of the vector"));
        }
        let (vals, vr) = f64_list(col, values, i)?;
        let vnulls = values.values();
        if vnulls.null_count() > 0 {
            if let Some(j) = vr.clone().find(|&j| vnulls.is_null(j)) {
                return Err(col.err(row, format!("null element at index {}", j - vr.start)));
            }
        }
        let start = out.len();
        let n = match kinds.value(i) {
            1 => {
                let shape = col.reshape(row, vec![vals.len() as u64], vals.len() as u64)?;
                col.accept(row, &shape, dtype)?;
                convert::append_converted(Source::F64(vals), dtype, out)
                    .map_err(|e| col.conv_err(row, e))?;
                shape
            }
            0 => {
                if sizes.is_null(i) || indices.is_null(i) {
                    return Err(col.err(row, "sparse vector without size or indices"));
                }
                let size = sizes.value(i);
                let size = usize::try_from(size)
                    .map_err(|_| col.err(row, format!("sparse vector of negative size {size}")))?;
                let offsets = indices.value_offsets();
                let (Some(&lo), Some(&hi)) = (offsets.get(i), offsets.get(i + 1)) else {
                    return Err(malformed(col, "vector offsets out of bounds"));
                };
                let ir = usize_of(lo)..usize_of(hi);
                if index_values.null_count() > 0 {
                    if let Some(j) = ir.clone().find(|&j| index_values.is_null(j)) {
                        return Err(col.err(
                            row,
                            format!("null sparse index at position {}", j - ir.start),
                        ));
                    }
                }
                let idx = index_values
                    .values()
                    .get(ir)
                    .ok_or_else(|| malformed(col, "vector indices out of bounds"))?;
                if idx.len() != vals.len() {
                    return Err(col.err(
                        row,
                        format!(
                            "sparse vector has {} indices but {} values",
                            idx.len(),
                            vals.len()
                        ),
                    ));
                }
                let mut dense = vec![0f64; size];
                let mut prev: Option<i32> = None;
                for (k, (&ix, &v)) in idx.iter().zip(vals).enumerate() {
                    if prev.is_some_and(|p| ix <= p) {
                        return Err(col.err(
                            row,
                            format!(
                                "sparse indices are not strictly increasing: {ix} at position {k} follows {}",
                                prev.unwrap_or(0)
                            ),
                        ));
                    }
                    let slot = usize::try_from(ix)
                        .ok()
                        .and_then(|u| dense.get_mut(u))
                        .ok_or_else(|| {
                            col.err(
                                row,
                                format!("sparse index {ix} at position {k} is outside [0, {size})"),
                            )
                        })?;
                    *slot = v;
                    prev = Some(ix);
                }
                let shape = col.reshape(row, vec![size as u64], size as u64)?;
                col.accept(row, &shape, dtype)?;
                convert::append_converted(Source::F64(&dense), dtype, out)
                    .map_err(|e| col.conv_err(row, e))?;
                shape
            }
            other => {
                return Err(col.err(
                    row,
                    format!("vector type {other} is neither 0 (sparse) nor 1 (dense)"),
                ))
            }
        };
        result.push(RowTensor {
            shape: n,
            dtype,
            bytes: start..out.len(),
        });
    }
    Ok(result)
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

/// A ragged column (spec/dataset.md §2.1): validates rows `rows` of `array`, appends their
/// converted values to `out` (concatenated along the first dimension) and one offset per row to
/// `offsets` (which holds at least the shard's leading 0). Rows before the first bad one are
/// appended; the caller discards the shard on error.
pub(crate) fn extract_ragged(
    col: &mut ColumnState,
    array: &ArrayRef,
    rows: Range<usize>,
    row_base: u64,
    out: &mut Vec<u8>,
    offsets: &mut Vec<i64>,
) -> Result<(), WriteError> {
    if rows.end > array.len() || rows.start > rows.end {
        return Err(malformed(
            col,
            format!("rows {rows:?} out of an array of {} rows", array.len()),
        ));
    }
    if rows.is_empty() {
        return Ok(());
    }
    let Some(dtype) = col.plan.dtype else {
        return Err(malformed(col, "a ragged column needs a dtype"));
    };
    col.dtype = Some(dtype);
    match col.plan.input.clone() {
        InputKind::Binary => {
            let wrong = || format!("expected Arrow type Binary, found {:?}", array.data_type());
            let a = array
                .as_binary_opt::<i32>()
                .ok_or_else(|| malformed(col, wrong()))?;
            ragged_bytes(
                col,
                a,
                a.value_offsets(),
                a.value_data(),
                rows,
                row_base,
                out,
                offsets,
            )
        }
        InputKind::String => {
            let wrong = || format!("expected Arrow type Utf8, found {:?}", array.data_type());
            let a = array
                .as_string_opt::<i32>()
                .ok_or_else(|| malformed(col, wrong()))?;
            ragged_bytes(
                col,
                a,
                a.value_offsets(),
                a.value_data(),
                rows,
                row_base,
                out,
                offsets,
            )
        }
        InputKind::NumericArray { element, depth } => ragged_numeric(
            col, array, element, depth, dtype, rows, row_base, out, offsets,
        ),
        _ => Err(malformed(col, "this column type cannot be ragged")),
    }
}

/// Binary or string rows: their bytes, copied in one run.
#[allow(clippy::too_many_arguments)]
fn ragged_bytes(
    col: &ColumnState,
    array: &dyn Array,
    value_offsets: &[i32],
    data: &[u8],
    rows: Range<usize>,
    row_base: u64,
    out: &mut Vec<u8>,
    offsets: &mut Vec<i64>,
) -> Result<(), WriteError> {
    let vo = value_offsets;
    let (Some(&lo), Some(&hi)) = (vo.get(rows.start), vo.get(rows.end)) else {
        return Err(malformed(col, "value offsets out of bounds"));
    };
    if array.null_count() > 0 {
        if let Some(i) = rows.clone().find(|&i| array.is_null(i)) {
            return Err(col.err(row_base + i as u64, "null value"));
        }
    }
    let bytes = data
        .get(usize_of(lo)..usize_of(hi))
        .ok_or_else(|| malformed(col, "values out of bounds"))?;
    reserve(col, row_base + rows.start as u64, out, bytes.len())?;
    offsets.reserve(rows.len());
    for i in rows {
        let len = usize_of(vo[i + 1]).saturating_sub(usize_of(vo[i]));
        push_offset(col, row_base + i as u64, offsets, len)?;
    }
    out.extend_from_slice(bytes);
    Ok(())
}

/// Numeric array rows: every row's inner shape is checked against the column's, then the leaf
/// values of all the rows (contiguous in the leaf array) are converted in one call.
#[allow(clippy::too_many_arguments)]
fn ragged_numeric(
    col: &mut ColumnState,
    array: &ArrayRef,
    element: SparkNumeric,
    depth: u32,
    dtype: Dtype,
    rows: Range<usize>,
    row_base: u64,
    out: &mut Vec<u8>,
    offsets: &mut Vec<i64>,
) -> Result<(), WriteError> {
    let (levels, leaf_array, leaf) = list_levels(col, array, element, depth)?;
    let mut inner = col.inner.take().unwrap_or_default();
    let result = ragged_rows(
        col, &levels, &leaf, leaf_array, element, &mut inner, rows, row_base, offsets,
    );
    col.inner = Some(inner);
    let (done, leaf_starts, pending) = result?;
    // Convert the rows before the first bad one (a conversion error in an earlier row is the
    // one reported).
    if let (Some(&first), Some(&end)) = (leaf_starts.first(), leaf_starts.last()) {
        let src = leaf
            .slice(first..end)
            .ok_or_else(|| malformed(col, format!("leaf values {first}..{end} out of bounds")))?;
        let row0 = row_base + done.start as u64;
        if let Err(e) = convert::append_converted(src, dtype, out) {
            let at = error_index(&e).map(|i| i + first);
            let r = at.map(|at| leaf_starts.partition_point(|&s| s <= at).saturating_sub(1));
            return Err(match (r, at) {
                (Some(r), Some(at)) => {
                    col.conv_err(row0 + r as u64, reindex(e, at - leaf_starts[r]))
                }
                _ => col.conv_err(row0, e),
            });
        }
    }
    match pending {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Checks rows of a ragged numeric column and pushes their offsets. Returns the rows checked
/// (those before the first bad one), their leaf starts plus the end of the last, and the error
/// of the bad row if any.
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn ragged_rows(
    col: &ColumnState,
    levels: &[&ListArray],
    leaf: &Source<'_>,
    leaf_array: &dyn Array,
    element: SparkNumeric,
    inner: &mut [Option<u64>],
    rows: Range<usize>,
    row_base: u64,
    offsets: &mut Vec<i64>,
) -> Result<(Range<usize>, Vec<usize>, Option<WriteError>), WriteError> {
    let mut leaf_starts = Vec::with_capacity(rows.len() + 1);
    let mut row_inner: Vec<Option<u64>> = vec![None; inner.len()];
    let start = rows.start;
    let mut end = start;
    let mut pending = None;
    let mut leaf_end = 0usize;
    'rows: for i in rows {
        let row = row_base + i as u64;
        let Some(outer) = levels.first() else { break };
        if outer.is_null(i) {
            pending = Some(col.err(row, "null value"));
            break;
        }
        let o = outer.value_offsets();
        let (Some(&a), Some(&b)) = (o.get(i), o.get(i + 1)) else {
            return Err(malformed(col, "list offsets out of bounds"));
        };
        let first_dim = usize_of(b).saturating_sub(usize_of(a));
        let (mut lo, mut hi) = (usize_of(a), usize_of(b));
        row_inner.iter_mut().for_each(|d| *d = None);
        for (k, list) in levels.iter().enumerate().skip(1) {
            if hi == lo {
                // no list at this level: the row shows no more dimensions
                let Some(&x) = list.value_offsets().get(lo) else {
                    return Err(malformed(col, "list offsets out of bounds"));
                };
                lo = usize_of(x);
                hi = lo;
                continue;
            }
            if list.null_count() > 0 {
                if let Some(j) = (lo..hi).find(|&j| list.is_null(j)) {
                    pending = Some(col.err(
                        row,
                        format!("null inner array at index {} of dimension {k}", j - lo),
                    ));
                    break 'rows;
                }
            }
            let lo_ = list.value_offsets();
            let (Some(&x), Some(&y)) = (lo_.get(lo), lo_.get(hi)) else {
                return Err(malformed(col, "list offsets out of bounds"));
            };
            let len_of = |j: usize| usize_of(lo_[j + 1]).saturating_sub(usize_of(lo_[j]));
            let first = len_of(lo);
            if let Some(j) = (lo + 1..hi).find(|&j| len_of(j) != first) {
                let mut a_shape = row_inner[..k - 1].to_vec();
                a_shape.push(Some(first as u64));
                let mut b_shape = row_inner[..k - 1].to_vec();
                b_shape.push(Some(len_of(j) as u64));
                pending = Some(col.err(
                    row,
                    format!(
                        "inner shape differs within the row: dimension {k} has length {first} and {} ({}… and {}…); only the first dimension of a ragged column may vary",
                        len_of(j),
                        fmt_inner(&a_shape),
                        fmt_inner(&b_shape)
                    ),
                ));
                break 'rows;
            }
            row_inner[k - 1] = Some(first as u64);
            lo = usize_of(x);
            hi = usize_of(y);
        }
        // the row's inner shape against the column's
        let clash = inner
            .iter()
            .zip(&row_inner)
            .any(|(c, r)| matches!((c, r), (Some(c), Some(r)) if c != r));
        if clash {
            pending = Some(col.err(
                row,
                format!(
                    "inner shape {} differs from the column's inner shape {} (of earlier rows{}); only the first dimension of a ragged column may vary",
                    fmt_inner(&row_inner),
                    fmt_inner(inner),
                    if col.plan.ragged.as_ref().is_some_and(|r| r.inner_shape.is_some()) {
                        " or the dataset"
                    } else {
                        ""
                    }
                ),
            ));
            break;
        }
        if hi > leaf.len() || lo > hi {
            return Err(malformed(col, "list offsets out of bounds"));
        }
        if leaf_array.null_count() > 0 {
            if let Some(j) = (lo..hi).find(|&j| leaf_array.is_null(j)) {
                pending = Some(col.err(row, format!("null element at index {}", j - lo)));
                break;
            }
        }
        if element == SparkNumeric::Boolean {
            if let Some((j, b)) = bad_bool(leaf, lo..hi) {
                pending = Some(col.err(
                    row,
                    format!("boolean element at index {j} has byte value {b} (expected 0 or 1)"),
                ));
                break;
            }
        }
        for (c, r) in inner.iter_mut().zip(&row_inner) {
            if c.is_none() {
                *c = *r;
            }
        }
        push_offset(col, row, offsets, first_dim)?;
        leaf_starts.push(lo);
        leaf_end = hi;
        end = i + 1;
    }
    if !leaf_starts.is_empty() {
        leaf_starts.push(leaf_end);
    }
    Ok((start..end, leaf_starts, pending))
}
