//! Decoding tensor bytes into Arrow arrays of Spark element types.
//!
//! Input bytes are little-endian and may start at any address (the format guarantees no
//! alignment), so every decoder reads fixed-size byte chunks with `from_le_bytes` in one bulk
//! loop into a freshly allocated, aligned buffer; no pointer casts, no per-element allocation.
//!
//! | dtype | Arrow / Spark element | note |
//! |---|---|---|
//! | BOOL | Boolean / boolean | any non-zero byte is `true` |
//! | I8, I16, I32, I64 | Int8/16/32/64 / byte, short, int, long | |
//! | U8 | Int16 / short | widened: Spark has no unsigned types |
//! | U16 | Int32 / int | widened |
//! | U32 | Int64 / long | widened |
//! | U64 | Int64 / long | values > `i64::MAX` are an error ([`ReadErrorKind::U64Overflow`]) naming the element and value, never wrapped |
//! | F16, BF16 | Float32 / float | exact widening (subnormals, ±0, ±Inf exact; NaN payload kept) |
//! | F32 | Float32 / float | bits kept |
//! | F64 | Float64 / double | bits kept |
//! | F8_*, F4, F6_*, C64 | — | no Spark type: bytes only |

use super::error::ReadErrorKind;
use arrow_array::types::{Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type};
use arrow_array::{Array, ArrayRef, BooleanArray, PrimitiveArray};
use arrow_buffer::{BooleanBuffer, ScalarBuffer};
use arrow_schema::DataType;
use safetensors_spark_format::dtype::Dtype;
use std::sync::Arc;

/// The Arrow type (= Spark element type) a dtype decodes to, or `None` for the dtypes Spark has
/// no type for (F8_*, F4, F6_*, C64), which are read as bytes only.
pub fn spark_element(dtype: Dtype) -> Option<DataType> {
    Some(match dtype {
        Dtype::Bool => DataType::Boolean,
        Dtype::I8 => DataType::Int8,
        Dtype::I16 | Dtype::U8 => DataType::Int16,
        Dtype::I32 | Dtype::U16 => DataType::Int32,
        Dtype::I64 | Dtype::U32 | Dtype::U64 => DataType::Int64,
        Dtype::F16 | Dtype::Bf16 | Dtype::F32 => DataType::Float32,
        Dtype::F64 => DataType::Float64,
        Dtype::F4
        | Dtype::F6E2M3
        | Dtype::F6E3M2
        | Dtype::F8E5M2
        | Dtype::F8E4M3
        | Dtype::F8E8M0
        | Dtype::F8E4M3Fnuz
        | Dtype::F8E5M2Fnuz
        | Dtype::C64 => return None,
    })
}

/// Decodes `bytes` (little-endian elements of `dtype`, any alignment) into a non-null array of
/// [`spark_element`]`(dtype)`, one entry per element.
///
/// Errors: the dtype has no Spark type, the length is not a whole number of elements, or a U64
/// value exceeds `i64::MAX` (the error gives its element index within `bytes`).
pub fn decode_values(dtype: Dtype, bytes: &[u8]) -> Result<ArrayRef, ReadErrorKind> {
    let size = match (spark_element(dtype), dtype.byte_size()) {
        (Some(_), Some(size)) => size,
        _ => return Err(ReadErrorKind::NotDecodable { dtype }),
    };
    if !bytes.len().is_multiple_of(size) {
        return Err(ReadErrorKind::ByteLength {
            dtype,
            len: bytes.len(),
        });
    }
    Ok(match dtype {
        Dtype::Bool => {
            let bits = BooleanBuffer::collect_bool(bytes.len(), |i| bytes[i] != 0);
            Arc::new(BooleanArray::new(bits, None))
        }
        Dtype::I8 => prim::<Int8Type, 1>(bytes, i8::from_le_bytes),
        Dtype::U8 => prim::<Int16Type, 1>(bytes, |b| i16::from(b[0])),
        Dtype::I16 => prim::<Int16Type, 2>(bytes, i16::from_le_bytes),
        Dtype::U16 => prim::<Int32Type, 2>(bytes, |b| i32::from(u16::from_le_bytes(b))),
        Dtype::I32 => prim::<Int32Type, 4>(bytes, i32::from_le_bytes),
        Dtype::U32 => prim::<Int64Type, 4>(bytes, |b| i64::from(u32::from_le_bytes(b))),
        Dtype::I64 => prim::<Int64Type, 8>(bytes, i64::from_le_bytes),
        Dtype::U64 => {
            // Reinterpret, then find any value with the sign bit set (bulk, vectorisable).
            let values: Vec<i64> = chunks::<8>(bytes).map(i64::from_le_bytes).collect();
            if let Some(index) = values.iter().position(|&v| v < 0) {
                return Err(ReadErrorKind::U64Overflow {
                    index: index as u64,
                    value: values[index] as u64,
                });
            }
            Arc::new(PrimitiveArray::<Int64Type>::new(
                ScalarBuffer::from(values),
                None,
            ))
        }
        Dtype::F16 => prim::<Float32Type, 2>(bytes, |b| f16_to_f32(u16::from_le_bytes(b))),
        Dtype::Bf16 => prim::<Float32Type, 2>(bytes, |b| bf16_to_f32(u16::from_le_bytes(b))),
        Dtype::F32 => prim::<Float32Type, 4>(bytes, f32::from_le_bytes),
        Dtype::F64 => prim::<Float64Type, 8>(bytes, f64::from_le_bytes),
        // spark_element returned None for every other dtype above.
        _ => return Err(ReadErrorKind::NotDecodable { dtype }),
    })
}

/// The whole `N`-byte chunks of `bytes` (callers check the length first).
fn chunks<const N: usize>(bytes: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    bytes.as_chunks::<N>().0.iter().copied()
}

fn prim<T, const N: usize>(bytes: &[u8], f: impl Fn([u8; N]) -> T::Native) -> ArrayRef
where
    T: arrow_array::ArrowPrimitiveType,
{
    let values: Vec<T::Native> = chunks::<N>(bytes).map(f).collect();
    Arc::new(PrimitiveArray::<T>::new(ScalarBuffer::from(values), None))
}

/// Exact bfloat16 → binary32: bfloat16 is the top half of a binary32.
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Exact IEEE binary16 → binary32, NaN payloads (and signalling-ness) kept bit for bit.
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match exp {
        0x1f => sign | 0x7f80_0000 | (man << 13),
        0 if man == 0 => sign,
        0 => {
            // Subnormal man · 2^-24: normalise so the leading 1 lands on bit 10.
            let shift = man.leading_zeros() - 21;
            sign | ((113 - shift) << 23) | (((man << shift) & 0x3ff) << 13)
        }
        _ => sign | ((exp + 112) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// Widens a decoded array to `target` when every value is exactly representable there:
/// integers to wider integers, Int8/Int16 to Float32, Int8/16/32 and Float32 to Float64; the
/// identity always. Used to give mixed-dtype tensors one common Spark element type.
pub fn widen(array: ArrayRef, target: &DataType) -> Result<ArrayRef, ReadErrorKind> {
    use arrow_array::cast::AsArray;
    macro_rules! from {
        ($src:ty, $($dst_dt:pat => $dst:ty),*) => {{
            let a = array.as_primitive::<$src>();
            match target {
                $($dst_dt => Some(Arc::new(a.unary::<_, $dst>(|v| v.into())) as ArrayRef),)*
                _ => None,
            }
        }};
    }
    if array.data_type() == target {
        return Ok(array);
    }
    let widened = match array.data_type() {
        DataType::Int8 => {
            from!(Int8Type, DataType::Int16 => Int16Type, DataType::Int32 => Int32Type,
            DataType::Int64 => Int64Type, DataType::Float32 => Float32Type, DataType::Float64 => Float64Type)
        }
        DataType::Int16 => {
            from!(Int16Type, DataType::Int32 => Int32Type, DataType::Int64 => Int64Type,
            DataType::Float32 => Float32Type, DataType::Float64 => Float64Type)
        }
        DataType::Int32 => {
            from!(Int32Type, DataType::Int64 => Int64Type, DataType::Float64 => Float64Type)
        }
        DataType::Float32 => from!(Float32Type, DataType::Float64 => Float64Type),
        _ => None,
    };
    widened.ok_or_else(|| ReadErrorKind::NotWidenable {
        from: array.data_type().to_string(),
        to: target.to_string(),
    })
}

/// The narrowest Spark element type every decodable dtype of `dtypes` widens to exactly (see
/// [`widen`]); bytes-only dtypes are ignored. `None` when there is no such type (e.g. BOOL with
/// numbers, or I64 with floats) or no decodable dtype at all.
pub fn common_element(dtypes: impl IntoIterator<Item = Dtype>) -> Option<DataType> {
    let naturals: Vec<DataType> = dtypes.into_iter().filter_map(spark_element).collect();
    if naturals.is_empty() {
        return None;
    }
    let candidates = [
        DataType::Boolean,
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::Float32,
        DataType::Float64,
    ];
    candidates
        .into_iter()
        .find(|c| naturals.iter().all(|n| n == c || widens_to(n, c)))
}

fn widens_to(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    matches!(
        (from, to),
        (Int8, Int16 | Int32 | Int64 | Float32 | Float64)
            | (Int16, Int32 | Int64 | Float32 | Float64)
            | (Int32, Int64 | Float64)
            | (Float32, Float64)
    )
}
