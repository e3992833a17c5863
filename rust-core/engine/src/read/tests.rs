#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;
use safetensors_spark_format::dtype::{Dtype, DTYPES};
use safetensors_spark_format::file::write_file;
use safetensors_spark_format::header::TensorEntry;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

static DIR_COUNTER: AtomicU64 = AtomicU64::new(0);

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "st-read-test-{tag}-{}-{}",
            std::process::id(),
            DIR_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `bytes` copied to an address that is odd (never 2-, 4- or 8-byte aligned).
fn unaligned(bytes: &[u8]) -> (Vec<u8>, usize) {
    let mut v = vec![0xAAu8; 16];
    let base = v.as_ptr() as usize;
    let start = (0..8).find(|s| (base + s) % 8 == 1).unwrap();
    v.truncate(start);
    v.extend_from_slice(bytes);
    (v, start)
}

fn dec(dtype: Dtype, bytes: &[u8]) -> ArrayRef {
    let (buf, start) = unaligned(bytes);
    assert_eq!(buf[start..].as_ptr() as usize % 2, 1);
    let a = decode_values(dtype, &buf[start..]).unwrap();
    // Aligned input decodes identically.
    assert_eq!(a.to_data(), decode_values(dtype, bytes).unwrap().to_data());
    a
}

fn le<T, const N: usize>(values: &[T], f: impl Fn(&T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(f).collect()
}

// ---------------------------------------------------------------------------------------------
// decode
// ---------------------------------------------------------------------------------------------

#[test]
fn element_types() {
    use DataType::*;
    let expected = [
        ("BOOL", Some(Boolean)),
        ("F4", None),
        ("F6_E2M3", None),
        ("F6_E3M2", None),
        ("U8", Some(Int16)),
        ("I8", Some(Int8)),
        ("F8_E5M2", None),
        ("F8_E4M3", None),
        ("F8_E8M0", None),
        ("F8_E4M3FNUZ", None),
        ("F8_E5M2FNUZ", None),
        ("I16", Some(Int16)),
        ("U16", Some(Int32)),
        ("F16", Some(Float32)),
        ("BF16", Some(Float32)),
        ("I32", Some(Int32)),
        ("U32", Some(Int64)),
        ("F32", Some(Float32)),
        ("C64", None),
        ("F64", Some(Float64)),
        ("I64", Some(Int64)),
        ("U64", Some(Int64)),
    ];
    assert_eq!(expected.len(), DTYPES.len());
    for (name, t) in expected {
        let d = Dtype::from_name(name).unwrap();
        assert_eq!(spark_element(d), t, "{name}");
        if t.is_none() {
            assert!(matches!(
                decode_values(d, &[0; 24]),
                Err(ReadErrorKind::NotDecodable { dtype }) if dtype == d
            ));
        }
    }
}

#[test]
fn integers_decode_unaligned() {
    let a = dec(Dtype::Bool, &[0, 1, 2, 255, 0]);
    assert_eq!(
        a.as_boolean().iter().collect::<Vec<_>>(),
        [false, true, true, true, false].map(Some)
    );
    let a = dec(Dtype::I8, &[0x80, 0xff, 0, 0x7f]);
    assert_eq!(a.as_primitive::<Int8Type>().values(), &[-128, -1, 0, 127]);
    let a = dec(Dtype::U8, &[0x80, 0xff, 0, 0x7f]);
    assert_eq!(a.as_primitive::<Int16Type>().values(), &[128, 255, 0, 127]);
    let a = dec(Dtype::I16, &[0x00, 0x80, 0xff, 0xff, 0x34, 0x12]);
    assert_eq!(
        a.as_primitive::<Int16Type>().values(),
        &[-32768, -1, 0x1234]
    );
    let a = dec(Dtype::U16, &[0x00, 0x80, 0xff, 0xff, 0x34, 0x12]);
    assert_eq!(
        a.as_primitive::<Int32Type>().values(),
        &[32768, 65535, 0x1234]
    );
    let a = dec(
        Dtype::I32,
        &[0x78, 0x56, 0x34, 0x12, 0xff, 0xff, 0xff, 0xff],
    );
    assert_eq!(a.as_primitive::<Int32Type>().values(), &[0x1234_5678, -1]);
    let a = dec(
        Dtype::U32,
        &[0x78, 0x56, 0x34, 0x12, 0xff, 0xff, 0xff, 0xff],
    );
    assert_eq!(
        a.as_primitive::<Int64Type>().values(),
        &[0x1234_5678, 4_294_967_295]
    );
    let bytes = le(&[i64::MIN, -2, 0x0102_0304_0506_0708], |v| v.to_le_bytes());
    assert_eq!(&bytes[16..24], &[8, 7, 6, 5, 4, 3, 2, 1]);
    let a = dec(Dtype::I64, &bytes);
    assert_eq!(
        a.as_primitive::<Int64Type>().values(),
        &[i64::MIN, -2, 0x0102_0304_0506_0708]
    );
    let a = dec(
        Dtype::U64,
        &le(&[0u64, i64::MAX as u64, 7], |v| v.to_le_bytes()),
    );
    assert_eq!(a.as_primitive::<Int64Type>().values(), &[0, i64::MAX, 7]);
    for a in [dec(Dtype::I32, &[]), dec(Dtype::U64, &[])] {
        assert_eq!(a.len(), 0);
    }
}

#[test]
fn u64_beyond_i64_max_is_an_error_naming_the_element() {
    let bytes = le(&[1u64, 2, 1 << 63, u64::MAX], |v| v.to_le_bytes());
    let (buf, start) = unaligned(&bytes);
    match decode_values(Dtype::U64, &buf[start..]) {
        Err(ReadErrorKind::U64Overflow { index: 2, value }) => assert_eq!(value, 1 << 63),
        other => panic!("{other:?}"),
    }
}

#[test]
fn floats_decode_unaligned_bit_exact() {
    let f32s = [
        1.5f32,
        -0.0,
        f32::INFINITY,
        f32::MIN_POSITIVE / 4.0,
        f32::MAX,
    ];
    let a = dec(Dtype::F32, &le(&f32s, |v| v.to_le_bytes()));
    let got: Vec<u32> = a
        .as_primitive::<Float32Type>()
        .values()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    assert_eq!(got, f32s.map(f32::to_bits));
    // A NaN with a payload keeps its bits.
    let nan = f64::from_bits(0x7ff0_0000_0000_0001);
    let f64s = [std::f64::consts::PI, -1e300, nan, 5e-324];
    let a = dec(Dtype::F64, &le(&f64s, |v| v.to_le_bytes()));
    let got: Vec<u64> = a
        .as_primitive::<Float64Type>()
        .values()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    assert_eq!(got, f64s.map(f64::to_bits));
}

#[test]
fn f16_widening_hand_values() {
    let cases: [(u16, f32); 10] = [
        (0x3c00, 1.0),
        (0xc000, -2.0),
        (0x7bff, 65504.0),
        (0x0001, 5.960_464_5e-8), // smallest subnormal 2^-24
        (0x03ff, 6.097_555e-5),   // largest subnormal 1023 · 2^-24
        (0x0400, 6.103_515_6e-5), // smallest normal 2^-14
        (0x8001, -5.960_464_5e-8),
        (0x8000, -0.0),
        (0x7c00, f32::INFINITY),
        (0xfc00, f32::NEG_INFINITY),
    ];
    let bytes = le(&cases, |(h, _)| h.to_le_bytes());
    let a = dec(Dtype::F16, &bytes);
    for (got, (h, want)) in a.as_primitive::<Float32Type>().values().iter().zip(cases) {
        assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
    }
    assert_eq!(f16_exact(0x0001), 2f32.powi(-24));
    assert_eq!(f16_exact(0x03ff), 1023.0 * 2f32.powi(-24));
    // NaNs: quiet and signalling, payload and sign kept bit for bit.
    assert_eq!(f16_exact(0x7e00).to_bits(), 0x7fc0_0000);
    assert_eq!(f16_exact(0x7c01).to_bits(), 0x7f80_2000);
    assert_eq!(f16_exact(0xfd55).to_bits(), 0xffaa_a000);
}

fn f16_exact(h: u16) -> f32 {
    decode_values(Dtype::F16, &h.to_le_bytes())
        .unwrap()
        .as_primitive::<Float32Type>()
        .value(0)
}

#[test]
fn f16_widening_matches_half_for_every_value() {
    let all: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
    let a = dec(Dtype::F16, &all);
    let a = a.as_primitive::<Float32Type>();
    for (h, got) in (0..=u16::MAX).zip(a.values().iter()) {
        let want = half::f16::from_bits(h).to_f32();
        if want.is_nan() {
            assert!(got.is_nan(), "{h:#06x}");
            assert_eq!(got.to_bits() >> 31, u32::from(h >> 15), "{h:#06x} sign");
            assert_eq!(got.to_bits() & 0x7f_ffff, u32::from(h & 0x3ff) << 13);
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
        }
    }
}

#[test]
fn bf16_widening_is_the_top_half() {
    let cases: [(u16, f32); 8] = [
        (0x3f80, 1.0),
        (0xc040, -3.0),
        (0x0001, f32::from_bits(0x0001_0000)), // subnormal
        (0x8000, -0.0),
        (0x7f80, f32::INFINITY),
        (0xff80, f32::NEG_INFINITY),
        (0x7f7f, f32::from_bits(0x7f7f_0000)), // largest finite
        (0x7fc1, f32::from_bits(0x7fc1_0000)), // NaN with payload
    ];
    let a = dec(Dtype::Bf16, &le(&cases, |(h, _)| h.to_le_bytes()));
    for (got, (h, want)) in a.as_primitive::<Float32Type>().values().iter().zip(cases) {
        assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
    }
    for h in 0..=u16::MAX {
        let got = decode::bf16_to_f32(h);
        assert_eq!(got.to_bits(), u32::from(h) << 16);
        let want = half::bf16::from_bits(h).to_f32();
        assert!(got == want || (got.is_nan() && want.is_nan()), "{h:#06x}");
    }
}

#[test]
fn partial_elements_are_an_error() {
    for (dtype, len) in [(Dtype::I16, 3), (Dtype::F32, 6), (Dtype::F64, 12)] {
        assert!(matches!(
            decode_values(dtype, &vec![0; len]),
            Err(ReadErrorKind::ByteLength { len: l, .. }) if l == len
        ));
    }
}

#[test]
fn widening_and_common_element() {
    use DataType::*;
    let ints = decode_values(Dtype::I16, &le(&[-3i16, 300], |v| v.to_le_bytes())).unwrap();
    let w = widen(ints.clone(), &Float32).unwrap();
    assert_eq!(w.as_primitive::<Float32Type>().values(), &[-3.0, 300.0]);
    let w = widen(ints.clone(), &Int64).unwrap();
    assert_eq!(w.as_primitive::<Int64Type>().values(), &[-3, 300]);
    assert!(matches!(
        widen(ints, &Int8),
        Err(ReadErrorKind::NotWidenable { .. })
    ));
    let i32s = decode_values(Dtype::I32, &[0; 4]).unwrap();
    assert!(widen(i32s, &Float32).is_err());
    assert_eq!(
        common_element([Dtype::F32, Dtype::Bf16, Dtype::F8E4M3]),
        Some(Float32)
    );
    assert_eq!(common_element([Dtype::F32, Dtype::I32]), Some(Float64));
    assert_eq!(common_element([Dtype::U8, Dtype::I8]), Some(Int16));
    assert_eq!(common_element([Dtype::I64, Dtype::F16]), None);
    assert_eq!(common_element([Dtype::Bool, Dtype::I8]), None);
    assert_eq!(common_element([Dtype::Bool]), Some(Boolean));
    assert_eq!(common_element([Dtype::C64, Dtype::F4]), None);
    // Every candidate pair `common_element` accepts, `widen` performs.
    for d in DTYPES.iter().map(|d| d.dtype) {
        for e in DTYPES.iter().map(|d| d.dtype) {
            if let (Some(t), Some(_)) = (common_element([d, e]), spark_element(d)) {
                let size = d.byte_size().unwrap();
                let a = decode_values(d, &vec![0; size]).unwrap();
                assert_eq!(widen(a, &t).unwrap().data_type(), &t, "{d} {e}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// per sample
// ---------------------------------------------------------------------------------------------

fn f32_bytes(n: usize) -> Vec<u8> {
    le(&(0..n).map(|i| i as f32).collect::<Vec<_>>(), |v| {
        v.to_le_bytes()
    })
}

fn offsets(a: &dyn Array) -> Vec<i32> {
    a.as_list::<i32>().offsets().iter().copied().collect()
}

fn floats(a: &dyn Array) -> Vec<f32> {
    a.as_primitive::<Float32Type>().values().to_vec()
}

#[test]
fn sample_array_ranks_and_offsets() {
    // Rank 1 tensor [5]: the primitive array itself.
    let a = sample_array(Dtype::F32, &[], 3, &f32_bytes(3)).unwrap();
    assert_eq!(a.data_type(), &DataType::Float32);
    assert_eq!(floats(&a), [0.0, 1.0, 2.0]);
    // Rank 2 [rows=2, 3].
    let a = sample_array(Dtype::F32, &[3], 2, &f32_bytes(6)).unwrap();
    assert_eq!(a.len(), 2);
    assert_eq!(offsets(&a), [0, 3, 6]);
    assert_eq!(floats(a.as_list::<i32>().values()), f32_bytes_f(6));
    // Rank 3 [rows=2, 3, 2]: outer lists of 3, inner lists of 2.
    let a = sample_array(Dtype::F32, &[3, 2], 2, &f32_bytes(12)).unwrap();
    assert_eq!(a.data_type(), &sample_data_type(Dtype::F32, 2).unwrap());
    assert_eq!(offsets(&a), [0, 3, 6]);
    let inner = a.as_list::<i32>().values();
    assert_eq!(inner.len(), 6);
    assert_eq!(offsets(inner.as_ref()), [0, 2, 4, 6, 8, 10, 12]);
    let row1 = a.as_list::<i32>().value(1);
    let row1_2 = row1.as_list::<i32>().value(2);
    assert_eq!(floats(&row1_2), [10.0, 11.0]);
    // Wrong byte count for the shape.
    assert!(matches!(
        sample_array(Dtype::F32, &[3], 2, &f32_bytes(5)),
        Err(ReadErrorKind::DataLength {
            expected: 24,
            actual: 20
        })
    ));
}

fn f32_bytes_f(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32).collect()
}

#[test]
fn zero_size_and_scalar_tensors() {
    // [0]: no rows.
    let a = sample_array(Dtype::I64, &[], 0, &[]).unwrap();
    assert_eq!((a.len(), a.data_type()), (0, &DataType::Int64));
    // [2, 0]: two empty rows.
    let a = sample_array(Dtype::F64, &[0], 2, &[]).unwrap();
    assert_eq!(a.len(), 2);
    assert_eq!(offsets(&a), [0, 0, 0]);
    // [2, 0, 3] and [2, 3, 0].
    let a = sample_array(Dtype::I8, &[0, 3], 2, &[]).unwrap();
    assert_eq!(offsets(&a), [0, 0, 0]);
    assert_eq!(a.as_list::<i32>().values().len(), 0);
    let a = sample_array(Dtype::I8, &[3, 0], 2, &[]).unwrap();
    assert_eq!(offsets(&a), [0, 3, 6]);
    assert_eq!(offsets(a.as_list::<i32>().values().as_ref()), [0; 7]);
    // A scalar has no row dimension.
    let scalar = TensorInfo {
        name: "s".into(),
        dtype: Dtype::F32,
        shape: vec![],
        data_offsets: [0, 4],
    };
    assert!(matches!(
        row_byte_range(&scalar, 0..1),
        Err(ReadErrorKind::NoRowDimension)
    ));
    // ... but decodes to one value.
    let a = decode_values(Dtype::F32, &2.5f32.to_le_bytes()).unwrap();
    assert_eq!(floats(&a), [2.5]);
}

fn entry(name: &str, dtype: Dtype, shape: &[u64]) -> TensorEntry {
    TensorEntry {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
    }
}

fn meta(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A batch-mode shard as the writer makes it: 4 real rows + 2 pad rows.
fn padded_shard(dir: &TempDir) -> SafetensorsFile {
    let path = dir.0.join("part-00000-0000-x.safetensors");
    let m = meta(&[
        ("safetensors_spark.layout", "batch"),
        ("safetensors_spark.samples", "4"),
        ("safetensors_spark.padded_samples", "2"),
        ("user", "u"),
    ]);
    let x = f32_bytes(6 * 2 * 3);
    let y = le(&[10i64, 11, 12, 13, 0, 0], |v| v.to_le_bytes());
    let z = le(&[1u64, 2, 3, u64::MAX, 0, 0], |v| v.to_le_bytes());
    write_file(
        &path,
        Some(&m),
        &[
            (entry("x", Dtype::F32, &[6, 2, 3]), &x[..]),
            (entry("y", Dtype::I64, &[6]), &y[..]),
            (entry("z", Dtype::U64, &[6]), &z[..]),
            (entry("e", Dtype::F16, &[6, 0]), &[][..]),
        ],
    )
    .unwrap();
    SafetensorsFile::open(&path).unwrap()
}

#[test]
fn sample_rows_exclude_pad_rows_and_split_ranges() {
    let dir = TempDir::new("samples");
    let file = padded_shard(&dir);
    assert_eq!(batch_samples("f", file.header()).unwrap(), (4, 2));
    let opts = SampleOptions {
        file: true,
        metadata: true,
    };
    let b = sample_rows(&file, &["y", "x", "e"], 1..4, opts).unwrap();
    assert_eq!(b.num_rows(), 3);
    let names: Vec<_> = b
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["y", "x", "e", "file", "metadata"]);
    assert_eq!(
        b.column(0).as_primitive::<Int64Type>().values(),
        &[11, 12, 13]
    );
    let x = b.column(1).as_list::<i32>();
    assert_eq!(offsets(x), [0, 2, 4, 6]);
    // Row 1 of the shard starts at element 6.
    assert_eq!(
        floats(x.value(0).as_list::<i32>().value(1).as_ref()),
        [9.0, 10.0, 11.0]
    );
    assert_eq!(offsets(b.column(2).as_ref()), [0, 0, 0, 0]);
    assert_eq!(
        b.column(3).as_string::<i32>().value(2),
        file.path().to_string_lossy()
    );
    let m = b.column(4).as_map();
    assert_eq!(m.value_offsets(), &[0, 4, 8, 12]);
    // Pad rows are never returned, whatever the range asked.
    let e = sample_rows(&file, &["y"], 2..5, SampleOptions::default()).unwrap_err();
    assert!(
        matches!(
            e.kind,
            ReadErrorKind::RowRange {
                start: 2,
                end: 5,
                rows: 4
            }
        ),
        "{e}"
    );
    // Empty range, no extra columns.
    let b = sample_rows(&file, &["x"], 4..4, SampleOptions::default()).unwrap();
    assert_eq!((b.num_rows(), b.num_columns()), (0, 1));
    // The U64 column: rows 0..3 fit, row 3 holds u64::MAX.
    let z = sample_column(&file, "z", 0..3).unwrap();
    assert_eq!(z.as_primitive::<Int64Type>().values(), &[1, 2, 3]);
    let e = sample_column(&file, "z", 2..4).unwrap_err();
    assert!(
        matches!(
            e.kind,
            ReadErrorKind::U64Overflow {
                index: 3,
                value: u64::MAX
            }
        ),
        "{e}"
    );
    assert_eq!(e.tensor.as_deref(), Some("z"));
    let msg = e.to_string();
    assert!(msg.contains("part-00000-0000-x.safetensors") && msg.contains("tensor `z`"));
    assert!(msg.contains("18446744073709551615"), "{msg}");
    let e = sample_column(&file, "nope", 0..1).unwrap_err();
    assert!(matches!(e.kind, ReadErrorKind::MissingTensor));
}

#[test]
fn sample_rows_from_memory_and_other_writers() {
    // No reserved metadata: every row of the leading dimension is a sample.
    let bytes = safetensors_spark_format::file::serialize(
        None,
        &[
            (entry("a", Dtype::U8, &[3, 2]), &[1, 2, 3, 4, 250, 6][..]),
            (entry("b", Dtype::Bool, &[3]), &[1, 0, 1][..]),
        ],
    )
    .unwrap();
    let src = FileBytes::parse("mem://a", &bytes).unwrap();
    assert_eq!(batch_samples("mem://a", src.header()).unwrap(), (3, 0));
    let opts = SampleOptions {
        file: false,
        metadata: true,
    };
    let b = sample_rows(&src, &["a", "b"], 1..3, opts).unwrap();
    let a = b.column(0).as_list::<i32>();
    assert_eq!(
        a.values().as_primitive::<Int16Type>().values(),
        &[3, 4, 250, 6]
    );
    assert_eq!(
        b.column(1).as_boolean().iter().collect::<Vec<_>>(),
        [Some(false), Some(true)]
    );
    // No __metadata__: the map is null.
    assert_eq!(b.column(2).null_count(), 2);
    // Leading dimensions that disagree.
    let bytes = safetensors_spark_format::file::serialize(
        None,
        &[
            (entry("a", Dtype::U8, &[3]), &[1, 2, 3][..]),
            (entry("b", Dtype::U8, &[2]), &[1, 2][..]),
        ],
    )
    .unwrap();
    let src = FileBytes::parse("mem://b", &bytes).unwrap();
    let e = batch_samples("mem://b", src.header()).unwrap_err();
    assert!(
        matches!(
            e.kind,
            ReadErrorKind::RowCount {
                rows: 2,
                expected: 3
            }
        ),
        "{e}"
    );
    assert_eq!(e.tensor.as_deref(), Some("b"));
}

#[test]
fn batch_samples_checks_reserved_metadata() {
    let header = |m: &[(&str, &str)], shape: &[u64]| {
        let data = vec![0u8; shape.iter().product::<u64>() as usize];
        let bytes = safetensors_spark_format::file::serialize(
            Some(&meta(m)),
            &[(entry("t", Dtype::U8, shape), &data[..])],
        )
        .unwrap();
        safetensors_spark_format::header::parse_file_bytes(&bytes).unwrap()
    };
    let ok = |m: &[(&str, &str)], shape: &[u64]| batch_samples("f", &header(m, shape));
    assert_eq!(
        ok(&[("safetensors_spark.samples", "3")], &[3]).unwrap(),
        (3, 0)
    );
    assert_eq!(
        ok(&[("safetensors_spark.padded_samples", "1")], &[3]).unwrap(),
        (2, 1)
    );
    let e = ok(&[("safetensors_spark.samples", "x")], &[3]).unwrap_err();
    assert!(matches!(
        e.kind,
        ReadErrorKind::ReservedMetadata {
            key: "safetensors_spark.samples",
            ..
        }
    ));
    let e = ok(
        &[
            ("safetensors_spark.samples", "3"),
            ("safetensors_spark.padded_samples", "1"),
        ],
        &[3],
    )
    .unwrap_err();
    assert!(
        matches!(
            e.kind,
            ReadErrorKind::RowCount {
                rows: 3,
                expected: 4
            }
        ),
        "{e}"
    );
    let e = ok(&[("safetensors_spark.layout", "kv")], &[3]).unwrap_err();
    assert!(e.to_string().contains("KV shard"), "{e}");
    let e = ok(&[], &[]).unwrap_err();
    assert!(matches!(e.kind, ReadErrorKind::NoRowDimension));
}

// ---------------------------------------------------------------------------------------------
// per tensor and per file
// ---------------------------------------------------------------------------------------------

/// One file with a tensor of every dtype, named after it, shape [4] (4 elements: whole bytes
/// for every sub-byte type), byte i of tensor j = 7·j + i.
fn every_dtype_file(dir: &TempDir) -> (SafetensorsFile, BTreeMap<String, Vec<u8>>) {
    let path = dir.0.join("all.safetensors");
    let mut data = BTreeMap::new();
    for (j, d) in DTYPES.iter().enumerate() {
        let len = d.dtype.checked_byte_len(4).unwrap() as usize;
        let mut bytes: Vec<u8> = (0..len).map(|i| (7 * j + i) as u8).collect();
        if d.dtype == Dtype::U64 {
            bytes.iter_mut().skip(7).step_by(8).for_each(|b| *b &= 0x7f);
        }
        data.insert(d.name.to_string(), bytes);
    }
    let entries: Vec<_> = DTYPES
        .iter()
        .map(|d| (entry(d.name, d.dtype, &[4]), &data[d.name][..]))
        .collect();
    write_file(&path, Some(&meta(&[("a", "1"), ("b", "two")])), &entries).unwrap();
    (SafetensorsFile::open(&path).unwrap(), data)
}

fn all_rows(src: &dyn TensorSource) -> Vec<(&dyn TensorSource, &TensorInfo)> {
    src.header().tensors.iter().map(|t| (src, t)).collect()
}

#[test]
fn tensor_rows_for_every_dtype() {
    let dir = TempDir::new("tensors");
    let (file, data) = every_dtype_file(&dir);
    let opts = TensorRowOptions {
        data: true,
        decoded: None,
    };
    let rows = all_rows(&file);
    let b = tensor_rows(&rows, &opts).unwrap();
    assert_eq!(b.schema(), tensor_rows_schema(&opts));
    assert_eq!(b.num_rows(), 22);
    let keys = b.column(1).as_string::<i32>();
    let dtypes = b.column(2).as_string::<i32>();
    let shapes = b.column(3).as_list::<i32>();
    let sizes = b.column(4).as_primitive::<Int64Type>();
    let bin = b.column(5).as_binary::<i32>();
    for (i, (_, info)) in rows.iter().enumerate() {
        let name = keys.value(i);
        assert_eq!(name, info.name);
        let dtype = Dtype::from_name(name).unwrap();
        assert_eq!(dtypes.value(i), name);
        assert_eq!(shapes.value(i).as_primitive::<Int64Type>().values(), &[4]);
        assert_eq!(bin.value(i), &data[name][..], "{name}");
        assert_eq!(sizes.value(i), data[name].len() as i64);
        // Decoded to its natural type; bytes-only dtypes give null (whatever element asked).
        let opts = TensorRowOptions {
            data: false,
            decoded: Some(spark_element(dtype).unwrap_or(DataType::Int8)),
        };
        let one = tensor_rows(&rows[i..=i], &opts).unwrap();
        let decoded = one.column(5).as_list::<i32>();
        match spark_element(dtype) {
            None => assert!(decoded.is_null(0), "{name}"),
            Some(_) => assert_eq!(
                decoded.value(0).to_data(),
                decode_values(dtype, &data[name]).unwrap().to_data(),
                "{name}"
            ),
        }
    }
    // Hand values through a common element type: U8 bytes are 7·4 + 0..4, I8 7·5 + 0..4.
    let small: Vec<_> = rows
        .iter()
        .copied()
        .filter(|(_, t)| matches!(t.dtype, Dtype::U8 | Dtype::I8 | Dtype::F8E5M2))
        .collect();
    let element = common_element(small.iter().map(|(_, t)| t.dtype)).unwrap();
    assert_eq!(element, DataType::Int16);
    let opts = TensorRowOptions {
        data: false,
        decoded: Some(element),
    };
    let d = tensor_rows(&small, &opts).unwrap();
    let decoded = d.column(5).as_list::<i32>();
    let keys_small = d.column(1).as_string::<i32>();
    for i in 0..3 {
        match keys_small.value(i) {
            "U8" => assert_eq!(
                decoded.value(i).as_primitive::<Int16Type>().values(),
                &[28, 29, 30, 31]
            ),
            "I8" => assert_eq!(
                decoded.value(i).as_primitive::<Int16Type>().values(),
                &[35, 36, 37, 38]
            ),
            _ => assert!(decoded.is_null(i)),
        }
    }
    // Data order (the writer's dtype order): F8_E5M2 (null, empty), I8, U8.
    assert_eq!(
        (0..3).map(|i| keys_small.value(i)).collect::<Vec<_>>(),
        ["F8_E5M2", "I8", "U8"]
    );
    assert_eq!(
        decoded.offsets().iter().copied().collect::<Vec<_>>(),
        [0, 0, 4, 8]
    );
    // Map column.
    let m = b.column(6).as_map();
    assert_eq!(m.len(), 22);
    let first = m.value(0);
    assert_eq!(
        first
            .column(0)
            .as_string::<i32>()
            .iter()
            .collect::<Vec<_>>(),
        [Some("a"), Some("b")]
    );
    assert_eq!(
        first
            .column(1)
            .as_string::<i32>()
            .iter()
            .collect::<Vec<_>>(),
        [Some("1"), Some("two")]
    );
    assert_eq!(m.null_count(), 0);
}

#[test]
fn decoded_column_rejects_lossy_widening() {
    let bytes = safetensors_spark_format::file::serialize(
        None,
        &[
            (entry("i", Dtype::I64, &[1]), &5i64.to_le_bytes()[..]),
            (entry("f", Dtype::F32, &[]), &1f32.to_le_bytes()[..]),
        ],
    )
    .unwrap();
    let src = FileBytes::parse("mem://x", &bytes).unwrap();
    let opts = TensorRowOptions {
        data: false,
        decoded: Some(DataType::Float64),
    };
    let e = tensor_rows(&all_rows(&src), &opts).unwrap_err();
    assert_eq!(e.tensor.as_deref(), Some("i"));
    assert!(matches!(e.kind, ReadErrorKind::NotWidenable { .. }), "{e}");
    // With a common type chosen from the dtypes: I64 + F32 has none; F32 alone works.
    assert_eq!(common_element([Dtype::I64, Dtype::F32]), None);
    let f = src.header().tensor("f").unwrap();
    let b = tensor_rows(
        &[(&src as &dyn TensorSource, f)],
        &TensorRowOptions {
            data: false,
            decoded: Some(DataType::Float32),
        },
    )
    .unwrap();
    assert_eq!(
        floats(b.column(5).as_list::<i32>().value(0).as_ref()),
        [1.0]
    );
    // A scalar's shape is the empty list.
    assert_eq!(b.column(3).as_list::<i32>().value(0).len(), 0);
}

/// A source that fails any data read: proves metadata-only scans touch no data bytes.
struct NoData<'a>(&'a dyn TensorSource);

impl TensorSource for NoData<'_> {
    fn name(&self) -> std::borrow::Cow<'_, str> {
        self.0.name()
    }
    fn header(&self) -> &safetensors_spark_format::header::Header {
        self.0.header()
    }
    fn read(
        &self,
        info: &TensorInfo,
        _: std::ops::Range<u64>,
    ) -> Result<std::borrow::Cow<'_, [u8]>, ReadError> {
        panic!("data of {} read", info.name)
    }
}

#[test]
fn tensor_rows_without_data_read_no_bytes() {
    let dir = TempDir::new("nodata");
    let (file, data) = every_dtype_file(&dir);
    let src = NoData(&file);
    let opts = TensorRowOptions::default();
    let b = tensor_rows(&all_rows(&src), &opts).unwrap();
    let names: Vec<_> = b
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(
        names,
        ["file", "key", "dtype", "shape", "byte_size", "metadata"]
    );
    let total: i64 = b
        .column(4)
        .as_primitive::<Int64Type>()
        .values()
        .iter()
        .sum();
    assert_eq!(total as usize, data.values().map(Vec::len).sum::<usize>());
    // Empty input: an empty batch of the same schema.
    let b = tensor_rows(&[], &opts).unwrap();
    assert_eq!((b.num_rows(), b.schema()), (0, tensor_rows_schema(&opts)));
}

#[test]
fn file_rows_with_a_missing_key_are_null() {
    let a = safetensors_spark_format::file::serialize(
        Some(&meta(&[("k", "v")])),
        &[
            (entry("w", Dtype::Bf16, &[2]), &[1, 2, 3, 4][..]),
            (entry("b", Dtype::F8E4M3, &[3]), &[9, 8, 7][..]),
        ],
    )
    .unwrap();
    let b = safetensors_spark_format::file::serialize(
        None,
        &[(entry("w", Dtype::I32, &[1, 1]), &[5, 0, 0, 0][..])],
    )
    .unwrap();
    let fa = FileBytes::parse("a.safetensors", &a).unwrap();
    let fb = FileBytes::parse("b.safetensors", &b).unwrap();
    let batch: RecordBatch = file_rows(&[&fa, &fb], &["w", "b"]).unwrap();
    assert_eq!(batch.schema(), file_rows_schema(&["w", "b"]));
    assert_eq!(
        batch
            .column(0)
            .as_string::<i32>()
            .iter()
            .collect::<Vec<_>>(),
        [Some("a.safetensors"), Some("b.safetensors")]
    );
    let w = batch.column(1).as_struct();
    assert_eq!(w.null_count(), 0);
    assert_eq!(w.column(0).as_binary::<i32>().value(0), &[1, 2, 3, 4]);
    assert_eq!(w.column(0).as_binary::<i32>().value(1), &[5, 0, 0, 0]);
    let shapes = w.column(1).as_list::<i32>();
    assert_eq!(
        shapes.value(1).as_primitive::<Int64Type>().values(),
        &[1, 1]
    );
    assert_eq!(w.column(2).as_string::<i32>().value(0), "BF16");
    assert_eq!(w.column(2).as_string::<i32>().value(1), "I32");
    let bcol = batch.column(2).as_struct();
    assert!(bcol.is_valid(0) && bcol.is_null(1));
    assert_eq!(bcol.column(0).as_binary::<i32>().value(0), &[9, 8, 7]);
    assert_eq!(bcol.column(2).as_string::<i32>().value(0), "F8_E4M3");
    let m = batch.column(3).as_map();
    assert!(m.is_valid(0) && m.is_null(1));
    assert_eq!(m.value(0).column(1).as_string::<i32>().value(0), "v");
}

#[test]
fn byte_ranges_reject_bad_rows() {
    let t = TensorInfo {
        name: "t".into(),
        dtype: Dtype::F16,
        shape: vec![5, 3],
        data_offsets: [0, 30],
    };
    assert_eq!(row_byte_range(&t, 1..4).unwrap(), 6..24);
    assert_eq!(row_byte_range(&t, 5..5).unwrap(), 30..30);
    assert!(matches!(
        row_byte_range(&t, 4..6),
        Err(ReadErrorKind::RowRange { rows: 5, .. })
    ));
    #[allow(clippy::reversed_empty_ranges)]
    let reversed = 3..2;
    assert!(row_byte_range(&t, reversed).is_err());
}
