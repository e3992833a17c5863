//! Tensor Struct columns (`{data, shape, dtype}`): each value decoded and checked against its column.

use super::*;
use crate::read::decode::decode_values;
use crate::read::error::ReadErrorKind;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type};
use arrow_schema::DataType;

/// The shape list of a Tensor Struct row as u64 dims.
pub(super) fn struct_shape(
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

/// Decoded source values of a Tensor Struct's `data`, ready for `convert`.
pub(super) enum Decoded {
    F64(Vec<f64>),
    F32(Vec<f32>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    I16(Vec<i16>),
    I8(Vec<i8>),
    Bool(Vec<bool>),
}

impl Decoded {
    pub(super) fn source(&self) -> Source<'_> {
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

/// Decodes little-endian `bytes` of `dtype` into a [`Source`]-compatible vector with the read
/// path's decoder ([`decode_values`]: the one rule for a tensor's bytes, BOOL any non-zero byte
/// `true`, unsigned types widened, U64 above `i64::MAX` an error, F16/BF16 to f32 exactly).
/// `Err` carries a message for a value or a dtype that cannot be decoded.
pub(super) fn decode(dtype: Dtype, bytes: &[u8]) -> Result<Decoded, String> {
    let array = decode_values(dtype, bytes).map_err(|e| match e {
        ReadErrorKind::U64Overflow { index, value } => format!(
            "U64 value {value} at element {index} is above {} and cannot be converted",
            i64::MAX
        ),
        ReadErrorKind::NotDecodable { dtype } => {
            format!("values of dtype {dtype} cannot be converted")
        }
        other => other.to_string(),
    })?;
    Ok(match array.data_type() {
        DataType::Float64 => Decoded::F64(array.as_primitive::<Float64Type>().values().to_vec()),
        DataType::Float32 => Decoded::F32(array.as_primitive::<Float32Type>().values().to_vec()),
        DataType::Int64 => Decoded::I64(array.as_primitive::<Int64Type>().values().to_vec()),
        DataType::Int32 => Decoded::I32(array.as_primitive::<Int32Type>().values().to_vec()),
        DataType::Int16 => Decoded::I16(array.as_primitive::<Int16Type>().values().to_vec()),
        DataType::Int8 => Decoded::I8(array.as_primitive::<Int8Type>().values().to_vec()),
        DataType::Boolean => Decoded::Bool(array.as_boolean().values().iter().collect()),
        _ => return Err(format!("values of dtype {dtype} cannot be converted")),
    })
}

pub(super) fn extract_struct(
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
