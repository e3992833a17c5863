//! The tensor functions `arr_to_st` and `st_to_array` (spec/functions.md): the value rules
//! behind the Spark SQL expressions, so that they convert exactly as the writer does.
//!
//! * [`encode`] — Spark values (one row's elements, flattened in row-major order) to the
//!   little-endian bytes of a writable dtype, through [`safetensors_spark_format::convert`] (the writer's
//!   conversions: round-to-nearest-even for F16/BF16, checked integer casts), after checking
//!   the shape against the element count.
//! * [`decode`] — a Tensor Struct's bytes back to Spark values, through
//!   [`crate::read::decode`] (the read path's `sample` layout: U8 → short, F16/BF16 → float, …),
//!   widened exactly to the element type the expression returns, or an error when they do not
//!   fit.
//!
//! Values cross the JNI boundary as little-endian bytes of the Spark element type (a `boolean`
//! is one byte, 0 or 1), so one native covers every element type.

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type};
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;

use crate::read::decode::{decode_values, spark_element, widen};
use crate::write::SparkNumeric;
use safetensors_spark_format::convert::{self, Source, SourceType};
use safetensors_spark_format::dtype::Dtype;

/// Spark element types by their schema names, as the functions pass them.
const SPARK_TYPES: [(&str, SparkNumeric); 7] = [
    ("boolean", SparkNumeric::Boolean),
    ("byte", SparkNumeric::Byte),
    ("short", SparkNumeric::Short),
    ("integer", SparkNumeric::Int),
    ("long", SparkNumeric::Long),
    ("float", SparkNumeric::Float),
    ("double", SparkNumeric::Double),
];

/// A Spark element type by its schema name (`"float"`, `"integer"`, …).
pub fn spark_numeric(name: &str) -> Result<SparkNumeric, String> {
    SPARK_TYPES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
        .ok_or_else(|| {
            format!(
                "unsupported element type '{name}'; allowed: {}",
                SPARK_TYPES.map(|(n, _)| n).join(", ")
            )
        })
}

/// A dtype argument: case-insensitive (`bf16` = `BF16`, as the `dtype` write option), writable
/// dtypes only.
pub fn writable_dtype(name: &str) -> Result<Dtype, String> {
    Dtype::from_name(&name.trim().to_ascii_uppercase())
        .filter(|d| d.is_writable())
        .ok_or_else(|| {
            format!(
                "unknown dtype '{name}'; allowed: {}",
                Dtype::writable_names().join(", ")
            )
        })
}

/// The Spark element type (schema name) a dtype reads back as: the read path's `sample`
/// layout (spec/reading.md).
pub fn element_of(dtype: Dtype) -> Result<&'static str, String> {
    let arrow = spark_element(dtype).ok_or_else(|| format!("{dtype} has no Spark element type"))?;
    Ok(match arrow {
        DataType::Boolean => "boolean",
        DataType::Int8 => "byte",
        DataType::Int16 => "short",
        DataType::Int32 => "integer",
        DataType::Int64 => "long",
        DataType::Float32 => "float",
        _ => "double",
    })
}

/// The dtype `arr_to_st` gives values of a Spark element type when no dtype is named: the
/// writer's natural dtype (float → F32, double → F64, …).
pub fn natural_dtype(element: &str) -> Result<Dtype, String> {
    Ok(spark_numeric(element)?.natural_dtype())
}

fn source_type(t: SparkNumeric) -> SourceType {
    match t {
        SparkNumeric::Boolean => SourceType::Bool,
        SparkNumeric::Byte => SourceType::I8,
        SparkNumeric::Short => SourceType::I16,
        SparkNumeric::Int => SourceType::I32,
        SparkNumeric::Long => SourceType::I64,
        SparkNumeric::Float => SourceType::F32,
        SparkNumeric::Double => SourceType::F64,
    }
}

fn arrow_type(t: SparkNumeric) -> DataType {
    match t {
        SparkNumeric::Boolean => DataType::Boolean,
        SparkNumeric::Byte => DataType::Int8,
        SparkNumeric::Short => DataType::Int16,
        SparkNumeric::Int => DataType::Int32,
        SparkNumeric::Long => DataType::Int64,
        SparkNumeric::Float => DataType::Float32,
        SparkNumeric::Double => DataType::Float64,
    }
}

fn fmt_shape(shape: &[i64]) -> String {
    let dims: Vec<String> = shape.iter().map(i64::to_string).collect();
    format!("[{}]", dims.join(", "))
}

/// The element count of `shape` (every dimension ≥ 0 and at most 2^31 − 1, as a Spark
/// `array<int>` holds them).
fn elements(shape: &[i64]) -> Result<u64, String> {
    let mut count: u64 = 1;
    for &d in shape {
        let d = u64::try_from(d)
            .ok()
            .filter(|&d| d <= i32::MAX as u64)
            .ok_or_else(|| {
                format!(
                    "shape {} has dimension {d}; dimensions are integers from 0 to {}",
                    fmt_shape(shape),
                    i32::MAX
                )
            })?;
        count = count
            .checked_mul(d)
            .ok_or_else(|| format!("shape {} overflows", fmt_shape(shape)))?;
    }
    Ok(count)
}

fn le<const N: usize, T>(bytes: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
    bytes.as_chunks::<N>().0.iter().map(|&c| f(c)).collect()
}

/// `arr_to_st`: `values` (little-endian elements of the Spark type `element`, one byte per
/// boolean) as `dtype`, after checking that `shape` holds exactly that many elements. Returns
/// the tensor's bytes. Errors name the value, the shape or the dtype.
pub fn encode(values: &[u8], element: &str, dtype: &str, shape: &[i64]) -> Result<Vec<u8>, String> {
    let element = spark_numeric(element)?;
    let dtype = writable_dtype(dtype)?;
    let src = source_type(element);
    let size = src.byte_size();
    if !values.len().is_multiple_of(size) {
        return Err(format!(
            "internal error: {} bytes are not a whole number of {} values",
            values.len(),
            element.spark_name()
        ));
    }
    let count = values.len() / size;
    let expected = elements(shape)?;
    if expected != count as u64 {
        return Err(format!(
            "shape {} holds {expected} elements but the array has {count}",
            fmt_shape(shape)
        ));
    }
    let mut out = Vec::new();
    let result = match src {
        SourceType::F64 => convert::append_converted(
            Source::F64(&le(values, f64::from_le_bytes)),
            dtype,
            &mut out,
        ),
        SourceType::F32 => convert::append_converted(
            Source::F32(&le(values, f32::from_le_bytes)),
            dtype,
            &mut out,
        ),
        SourceType::I64 => convert::append_converted(
            Source::I64(&le(values, i64::from_le_bytes)),
            dtype,
            &mut out,
        ),
        SourceType::I32 => convert::append_converted(
            Source::I32(&le(values, i32::from_le_bytes)),
            dtype,
            &mut out,
        ),
        SourceType::I16 => convert::append_converted(
            Source::I16(&le(values, i16::from_le_bytes)),
            dtype,
            &mut out,
        ),
        SourceType::I8 => {
            convert::append_converted(Source::I8(&le(values, i8::from_le_bytes)), dtype, &mut out)
        }
        SourceType::Bool => {
            let mut bools = Vec::with_capacity(values.len());
            for (i, &b) in values.iter().enumerate() {
                match b {
                    0 | 1 => bools.push(b == 1),
                    _ => return Err(format!("internal error: boolean byte {b} at element {i}")),
                }
            }
            convert::append_converted(Source::Bool(&bools), dtype, &mut out)
        }
    };
    result.map_err(|e| e.to_string())?;
    Ok(out)
}

/// `st_to_array`: a Tensor Struct's `data` of `dtype` (exact, case-sensitive: the struct's own
/// field, as the writer reads it) and `shape`, decoded as the read path decodes it and widened
/// exactly to the Spark type `element`. Returns little-endian elements of `element` (one byte
/// per boolean), row-major.
pub fn decode(data: &[u8], dtype: &str, shape: &[i64], element: &str) -> Result<Vec<u8>, String> {
    let target = spark_numeric(element)?;
    let dt = Dtype::from_name(dtype).ok_or_else(|| {
        format!("unknown dtype '{dtype}' (dtype names are exact and case-sensitive)")
    })?;
    let count = elements(shape)?;
    let needed = dt.checked_byte_len(count);
    if needed != Some(data.len() as u64) {
        return Err(match needed {
            Some(n) => format!(
                "data has {} bytes but shape {} of {dt} needs {n}",
                data.len(),
                fmt_shape(shape)
            ),
            None => format!(
                "shape {} of {dt} does not describe a whole number of bytes",
                fmt_shape(shape)
            ),
        });
    }
    let natural = element_of(dt)
        .map_err(|_| format!("{dt} values have no Spark type and cannot be decoded"))?;
    let decoded = decode_values(dt, data).map_err(|e| format!("{dt} data: {e}"))?;
    let array = widen(decoded, &arrow_type(target)).map_err(|_| {
        format!(
            "a tensor of dtype {dt} (Spark {natural}) does not fit the result's element type {}; \
             name its dtype, e.g. st_to_array(col, '{dt}')",
            target.spark_name()
        )
    })?;
    Ok(le_bytes(&array))
}

/// The little-endian bytes of a non-null primitive or boolean array (booleans: 0/1 bytes).
fn le_bytes(array: &ArrayRef) -> Vec<u8> {
    // The host is little-endian (the jar ships x86_64 Linux only), so the values' memory is
    // their little-endian encoding.
    fn prim<T: arrow_array::ArrowPrimitiveType>(a: &ArrayRef) -> Vec<u8> {
        use arrow_buffer::ToByteSlice;
        let values: &[T::Native] = a.as_primitive::<T>().values();
        values.to_byte_slice().to_vec()
    }
    match array.data_type() {
        DataType::Boolean => array.as_boolean().values().iter().map(u8::from).collect(),
        DataType::Int8 => prim::<Int8Type>(array),
        DataType::Int16 => prim::<Int16Type>(array),
        DataType::Int32 => prim::<Int32Type>(array),
        DataType::Int64 => prim::<Int64Type>(array),
        DataType::Float32 => prim::<Float32Type>(array),
        _ => prim::<Float64Type>(array),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn f64s(v: &[f64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn encode_equals_the_writer_conversion() {
        let vals = [0.1, 65520.0, 1e-5, -2.5];
        for dtype in ["F16", "BF16", "F32", "F64"] {
            let d = Dtype::from_name(dtype).unwrap();
            let mut expect = Vec::new();
            convert::append_converted(Source::F64(&vals), d, &mut expect).unwrap();
            assert_eq!(
                encode(&f64s(&vals), "double", dtype, &[2, 2]).unwrap(),
                expect
            );
        }
        // case-insensitive dtype argument
        assert_eq!(
            encode(&f64s(&[1.0]), "double", "bf16", &[1]).unwrap(),
            [0x80, 0x3f]
        );
    }

    #[test]
    fn encode_errors_name_the_value_shape_and_dtype() {
        let e = encode(&f64s(&[1.0, 300.0]), "double", "U8", &[2]).unwrap_err();
        assert_eq!(
            e,
            "value 300.0 at element 1 (f64) does not fit in U8 (allowed 0..=255)"
        );
        let e = encode(&f64s(&[f64::NAN]), "double", "I32", &[1]).unwrap_err();
        assert_eq!(e, "NaN at element 0 (f64) cannot be stored as I32");
        let e = encode(&f64s(&[1.0, 2.0, 3.0]), "double", "F32", &[2, 2]).unwrap_err();
        assert_eq!(e, "shape [2, 2] holds 4 elements but the array has 3");
        let e = encode(&f64s(&[1.0]), "double", "F8_E4M3", &[1]).unwrap_err();
        assert!(
            e.starts_with("unknown dtype 'F8_E4M3'; allowed: BOOL, U8"),
            "{e}"
        );
        let e = encode(&f64s(&[]), "double", "F32", &[-1]).unwrap_err();
        assert!(e.contains("has dimension -1"), "{e}");
        let e = encode(&[], "string", "F32", &[0]).unwrap_err();
        assert!(e.starts_with("unsupported element type 'string'"), "{e}");
    }

    #[test]
    fn decode_reads_as_the_sample_layout_and_widens_exactly() {
        // U8 reads as short
        assert_eq!(
            decode(&[200, 1], "U8", &[2], "short").unwrap(),
            [200, 0, 1, 0]
        );
        // F16 1.0 = 0x3c00 reads as float 1.0, widened to double on request
        assert_eq!(
            decode(&[0x00, 0x3c], "F16", &[1], "double").unwrap(),
            1.0f64.to_le_bytes()
        );
        let e = decode(&[0; 8], "I64", &[1], "float").unwrap_err();
        assert!(
            e.starts_with(
                "a tensor of dtype I64 (Spark long) does not fit the result's element type float"
            ),
            "{e}"
        );
        let e = decode(&[0; 12], "F32", &[2, 2], "float").unwrap_err();
        assert_eq!(e, "data has 12 bytes but shape [2, 2] of F32 needs 16");
        let e = decode(&[0; 4], "f32", &[1], "float").unwrap_err();
        assert!(e.starts_with("unknown dtype 'f32'"), "{e}");
        let e = decode(&[0xff; 8], "U64", &[1], "long").unwrap_err();
        assert!(e.contains("U64"), "{e}");
        assert_eq!(decode(&[1, 0], "BOOL", &[2], "boolean").unwrap(), [1, 0]);
        let e = decode(&[1], "F8_E4M3", &[1], "float").unwrap_err();
        assert!(e.contains("no Spark type"), "{e}");
    }

    #[test]
    fn element_types() {
        assert_eq!(element_of(Dtype::U8).unwrap(), "short");
        assert_eq!(element_of(Dtype::Bf16).unwrap(), "float");
        assert_eq!(element_of(Dtype::U32).unwrap(), "long");
        assert_eq!(element_of(Dtype::F64).unwrap(), "double");
        assert!(element_of(Dtype::C64).is_err());
    }
}
