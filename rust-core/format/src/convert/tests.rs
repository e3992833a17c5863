#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use half::{bf16, f16};
use proptest::prelude::*;
use std::cmp::Ordering;

const INT_DTYPES: [Dtype; 8] = [
    Dtype::U8,
    Dtype::I8,
    Dtype::U16,
    Dtype::I16,
    Dtype::U32,
    Dtype::I32,
    Dtype::U64,
    Dtype::I64,
];

fn writable() -> Vec<Dtype> {
    crate::dtype::DTYPES
        .iter()
        .filter(|d| d.writable)
        .map(|d| d.dtype)
        .collect()
}

fn conv(src: Source<'_>, dst: Dtype) -> Result<Vec<u8>, ConvertError> {
    let mut out = vec![0xAA]; // appending keeps what was there
    append_converted(src, dst, &mut out)?;
    assert_eq!(out[0], 0xAA);
    assert_eq!(out.len(), 1 + converted_len(src.len(), dst).unwrap());
    // the preallocated form agrees
    let mut buf = vec![0u8; out.len() - 1];
    convert_into(src, dst, &mut buf).unwrap();
    assert_eq!(buf, out[1..]);
    Ok(out.split_off(1))
}

fn u16s(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

fn f16_of_f64(x: f64) -> u16 {
    u16s(&conv(Source::F64(&[x]), Dtype::F16).unwrap())[0]
}
fn bf16_of_f64(x: f64) -> u16 {
    u16s(&conv(Source::F64(&[x]), Dtype::Bf16).unwrap())[0]
}
fn f16_of_f32(x: f32) -> u16 {
    u16s(&conv(Source::F32(&[x]), Dtype::F16).unwrap())[0]
}
fn bf16_of_f32(x: f32) -> u16 {
    u16s(&conv(Source::F32(&[x]), Dtype::Bf16).unwrap())[0]
}
fn of_i64(x: i64, dst: Dtype) -> Vec<u8> {
    conv(Source::I64(&[x]), dst).unwrap()
}

/// Expected encoding of the small whole number `v` (0 or 1 or -1…) in `dst`, computed without
/// the code under test.
fn encode_small(v: i8, dst: Dtype) -> Vec<u8> {
    let x = f32::from(v);
    match dst {
        Dtype::F64 => f64::from(x).to_le_bytes().to_vec(),
        Dtype::F32 => x.to_le_bytes().to_vec(),
        Dtype::F16 => f16::from_f32(x).to_le_bytes().to_vec(),
        Dtype::Bf16 => bf16::from_f32(x).to_le_bytes().to_vec(),
        Dtype::Bool | Dtype::U8 => vec![v as u8],
        Dtype::I8 => v.to_le_bytes().to_vec(),
        Dtype::U16 => (v as u16).to_le_bytes().to_vec(),
        Dtype::I16 => i16::from(v).to_le_bytes().to_vec(),
        Dtype::U32 => (v as u32).to_le_bytes().to_vec(),
        Dtype::I32 => i32::from(v).to_le_bytes().to_vec(),
        Dtype::U64 => (v as u64).to_le_bytes().to_vec(),
        Dtype::I64 => i64::from(v).to_le_bytes().to_vec(),
        _ => unreachable!(),
    }
}

#[test]
fn dispatched_loop_equals_the_baseline_loop() {
    // Random bit patterns (every exponent, NaN payloads) and values scaled across the
    // 16-bit formats' normal, subnormal and overflow ranges, plus the specials.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut vals: Vec<f64> = (0..20_000).map(|_| f64::from_bits(next())).collect();
    vals.extend((0..20_000).map(|i| {
        let unit = (next() >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
        unit * 2f64.powi(i % 300 - 150)
    }));
    vals.extend([
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        65504.0,
        65520.0,
    ]);
    let floats: Vec<f32> = vals.iter().map(|&v| v as f32).collect();
    let base16 = |v: &[f64], f: fn(f64) -> u16| {
        let mut out = vec![0u8; v.len() * 2];
        fill_baseline(v, &mut out, |x| f(x).to_le_bytes());
        out
    };
    assert_eq!(
        conv(Source::F64(&vals), Dtype::Bf16).unwrap(),
        base16(&vals, f64_to_bf16_bits)
    );
    assert_eq!(
        conv(Source::F64(&vals), Dtype::F16).unwrap(),
        base16(&vals, f64_to_f16_bits)
    );
    let mut out = vec![0u8; floats.len() * 2];
    fill_baseline(&floats, &mut out, |x| f32_to_bf16_bits(x).to_le_bytes());
    assert_eq!(conv(Source::F32(&floats), Dtype::Bf16).unwrap(), out);
    fill_baseline(&floats, &mut out, |x| f32_to_f16_bits(x).to_le_bytes());
    assert_eq!(conv(Source::F32(&floats), Dtype::F16).unwrap(), out);
}

#[test]
fn every_source_to_every_writable_dtype() {
    assert_eq!(writable().len(), 13);
    for dst in writable() {
        let mut expect = encode_small(0, dst);
        expect.extend(encode_small(1, dst));
        expect.extend(encode_small(1, dst));
        for src in [
            Source::F64(&[0.0, 1.0, 1.0]),
            Source::F32(&[0.0, 1.0, 1.0]),
            Source::I64(&[0, 1, 1]),
            Source::I32(&[0, 1, 1]),
            Source::I16(&[0, 1, 1]),
            Source::I8(&[0, 1, 1]),
            Source::Bool(&[false, true, true]),
        ] {
            assert_eq!(
                conv(src, dst).unwrap(),
                expect,
                "{} -> {dst}",
                src.source_type()
            );
            assert_eq!(
                conv(src.slice(0..0).unwrap(), dst).unwrap(),
                Vec::<u8>::new()
            );
        }
    }
}

#[test]
fn negative_one_everywhere() {
    for dst in writable() {
        let signed = dst != Dtype::Bool && IntRange::of(dst).is_none_or(|r| r.min < 0);
        for src in [
            Source::F64(&[-1.0]),
            Source::F32(&[-1.0]),
            Source::I64(&[-1]),
            Source::I32(&[-1]),
            Source::I16(&[-1]),
            Source::I8(&[-1]),
        ] {
            let got = conv(src, dst);
            if signed {
                assert_eq!(got.unwrap(), encode_small(-1, dst), "{dst}");
            } else {
                assert!(got.is_err(), "{} -> {dst}", src.source_type());
            }
        }
    }
}

#[test]
fn non_writable_dtypes_are_refused() {
    for info in crate::dtype::DTYPES.iter().filter(|d| !d.writable) {
        let err = conv(Source::F32(&[1.0]), info.dtype).unwrap_err();
        assert_eq!(err, ConvertError::NotWritable(info.dtype));
        assert!(
            err.to_string().contains("writable dtypes are BOOL, U8"),
            "{err}"
        );
    }
}

#[test]
fn wrong_buffer_size() {
    let mut buf = [0u8; 7];
    let err = convert_into(Source::I32(&[1, 2]), Dtype::I32, &mut buf).unwrap_err();
    assert_eq!(
        err.to_string(),
        "output buffer has 7 bytes but 2 elements of I32 take 8"
    );
}

/// Is the whole number `c` exactly representable in the source type?
fn in_source(c: i128, t: SourceType) -> bool {
    match t {
        SourceType::F64 => (c as f64) as i128 == c && c.unsigned_abs() <= 1 << 64,
        SourceType::F32 => (c as f32) as i128 == c && c.unsigned_abs() <= 1 << 64,
        SourceType::I64 => i64::try_from(c).is_ok(),
        SourceType::I32 => i32::try_from(c).is_ok(),
        SourceType::I16 => i16::try_from(c).is_ok(),
        SourceType::I8 => i8::try_from(c).is_ok(),
        SourceType::Bool => false,
    }
}

fn convert_one(c: i128, t: SourceType, dst: Dtype) -> Result<Vec<u8>, ConvertError> {
    match t {
        SourceType::F64 => conv(Source::F64(&[c as f64]), dst),
        SourceType::F32 => conv(Source::F32(&[c as f32]), dst),
        SourceType::I64 => conv(Source::I64(&[c as i64]), dst),
        SourceType::I32 => conv(Source::I32(&[c as i32]), dst),
        SourceType::I16 => conv(Source::I16(&[c as i16]), dst),
        SourceType::I8 => conv(Source::I8(&[c as i8]), dst),
        SourceType::Bool => unreachable!(),
    }
}

#[test]
fn integer_dtype_boundaries_from_every_source() {
    let mut checked = 0;
    for dst in INT_DTYPES {
        let r = IntRange::of(dst).unwrap();
        let size = dst.byte_size().unwrap();
        // plus the largest f64/f32 below 2^64 and 2^63, which are in range for U64/I64
        let candidates = [
            r.min - 1,
            r.min,
            r.max,
            r.max + 1,
            (1 << 64) - 2048,
            (1 << 63) - 1024,
            (1 << 64) - (1 << 40),
            (1 << 63) - (1 << 39),
        ];
        for t in SourceType::ALL {
            for c in candidates {
                if !in_source(c, t) {
                    continue;
                }
                checked += 1;
                let got = convert_one(c, t, dst);
                if r.min <= c && c <= r.max {
                    let bytes = got.unwrap_or_else(|e| panic!("{c} {t} -> {dst}: {e}"));
                    assert_eq!(bytes, c.to_le_bytes()[..size], "{c} {t} -> {dst}");
                } else {
                    let err = got.unwrap_err();
                    let ConvertError::OutOfRange {
                        index: 0,
                        from,
                        to,
                        range,
                        ..
                    } = err
                    else {
                        panic!("{err:?}")
                    };
                    assert_eq!((from, to, range), (t, dst, r));
                    let text = err.to_string();
                    assert!(
                        text.contains(&format!("allowed {}..={}", r.min, r.max)),
                        "{text}"
                    );
                }
            }
        }
    }
    assert!(checked > 150, "{checked}");
}

#[test]
fn i64_to_64_bit_integers_is_exact() {
    let v = [i64::MIN, -1, 0, 1, (1 << 53) + 1, i64::MAX - 1, i64::MAX];
    let i = conv(Source::I64(&v), Dtype::I64).unwrap();
    let back: Vec<i64> = i
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(back, v);
    let u = conv(Source::I64(&v[2..]), Dtype::U64).unwrap();
    let back: Vec<u64> = u
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(back, v[2..].iter().map(|&x| x as u64).collect::<Vec<_>>());
    let err = conv(Source::I64(&v), Dtype::U64).unwrap_err();
    assert_eq!(
        err.to_string(),
        "value -9223372036854775808 at element 0 (i64) does not fit in U64 (allowed 0..=18446744073709551615)"
    );
}

#[test]
fn f64_to_i64_boundary() {
    let two63 = 2f64.powi(63);
    assert_eq!(
        conv(Source::F64(&[-two63]), Dtype::I64).unwrap(),
        i64::MIN.to_le_bytes()
    );
    let below = f64::from_bits(two63.to_bits() - 1);
    assert_eq!(
        conv(Source::F64(&[below]), Dtype::I64).unwrap(),
        (below as i64).to_le_bytes()
    );
    assert_eq!(below as i64, i64::MAX - 1023);
    let err = conv(Source::F64(&[1.0, two63]), Dtype::I64).unwrap_err();
    assert_eq!(
        err.to_string(),
        "value 9.223372036854776e18 at element 1 (f64) does not fit in I64 (allowed -9223372036854775808..=9223372036854775807)"
    );
    let above_min = f64::from_bits((-two63).to_bits() + 1); // next below -2^63
    assert!(conv(Source::F64(&[above_min]), Dtype::I64).is_err());
    assert!(conv(Source::F32(&[two63 as f32]), Dtype::I64).is_err());
    assert!(conv(Source::F32(&[-two63 as f32]), Dtype::I64).is_ok());
}

#[test]
fn error_messages() {
    let e = |src, dst| conv(src, dst).unwrap_err().to_string();
    assert_eq!(
        e(Source::I32(&[0, 1, 2, 3, 4, 300]), Dtype::U8),
        "value 300 at element 5 (i32) does not fit in U8 (allowed 0..=255)"
    );
    assert_eq!(
        e(Source::F64(&[2.5]), Dtype::I32),
        "value 2.5 at element 0 (f64) is not a whole number; I32 holds integers only"
    );
    assert_eq!(
        e(Source::F32(&[0.0, 1.0, 2.0, f32::NAN]), Dtype::I16),
        "NaN at element 3 (f32) cannot be stored as I16"
    );
    assert_eq!(
        e(Source::F64(&[f64::NEG_INFINITY]), Dtype::U64),
        "-Infinity at element 0 (f64) cannot be stored as U64"
    );
    assert_eq!(
        e(Source::F32(&[f32::INFINITY]), Dtype::Bool),
        "Infinity at element 0 (f32) cannot be stored as BOOL"
    );
    assert_eq!(
        e(Source::F32(&[0.1]), Dtype::I8),
        "value 0.1 at element 0 (f32) is not a whole number; I8 holds integers only"
    );
    assert_eq!(
        e(Source::F64(&[1e300]), Dtype::I8),
        "value 1e300 at element 0 (f64) does not fit in I8 (allowed -128..=127)"
    );
    assert_eq!(
        e(Source::F64(&[-0.5]), Dtype::U8),
        "value -0.5 at element 0 (f64) is not a whole number; U8 holds integers only"
    );
    assert_eq!(
        e(Source::F64(&[300.0]), Dtype::U8),
        "value 300.0 at element 0 (f64) does not fit in U8 (allowed 0..=255)"
    );
    assert_eq!(
        e(Source::I8(&[1, 0, 2]), Dtype::Bool),
        "value 2 at element 2 (i8) cannot be stored as BOOL (allowed 0 or 1)"
    );
    assert_eq!(
        e(Source::F64(&[0.5]), Dtype::Bool),
        "value 0.5 at element 0 (f64) cannot be stored as BOOL (allowed 0 or 1)"
    );
    assert_eq!(
        e(Source::I64(&[-1]), Dtype::Bool),
        "value -1 at element 0 (i64) cannot be stored as BOOL (allowed 0 or 1)"
    );
}

#[test]
fn first_bad_element_found_across_blocks() {
    let mut v = vec![7i32; 3 * BLOCK + 5];
    v[2 * BLOCK + 17] = -3;
    v[2 * BLOCK + 20] = 1000;
    let err = conv(Source::I32(&v), Dtype::U8).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "value -3 at element {} (i32) does not fit in U8 (allowed 0..=255)",
            2 * BLOCK + 17
        )
    );
    // and append_converted leaves the vector alone on error
    let mut out = vec![1, 2, 3];
    assert!(append_converted(Source::I32(&v), Dtype::U8, &mut out).is_err());
    assert_eq!(out, [1, 2, 3]);
}

#[test]
fn bool_conversions() {
    assert_eq!(
        conv(Source::Bool(&[false, true, false]), Dtype::Bool).unwrap(),
        [0, 1, 0]
    );
    assert_eq!(
        conv(Source::F64(&[-0.0, 1.0, 0.0]), Dtype::Bool).unwrap(),
        [0, 1, 0]
    );
    assert_eq!(conv(Source::I64(&[1, 0]), Dtype::Bool).unwrap(), [1, 0]);
    assert_eq!(
        u16s(&conv(Source::Bool(&[true, false]), Dtype::F16).unwrap()),
        [0x3C00, 0]
    );
    assert_eq!(
        u16s(&conv(Source::Bool(&[true, false]), Dtype::Bf16).unwrap()),
        [0x3F80, 0]
    );
    assert!(conv(Source::F32(&[f32::NAN]), Dtype::Bool).is_err());
}

#[test]
fn negative_zero() {
    assert_eq!(f16_of_f64(-0.0), 0x8000);
    assert_eq!(f16_of_f32(-0.0), 0x8000);
    assert_eq!(bf16_of_f64(-0.0), 0x8000);
    assert_eq!(bf16_of_f32(-0.0), 0x8000);
    assert_eq!(
        conv(Source::F64(&[-0.0]), Dtype::F32).unwrap(),
        (-0.0f32).to_le_bytes()
    );
    assert_eq!(
        conv(Source::F32(&[-0.0]), Dtype::F64).unwrap(),
        (-0.0f64).to_le_bytes()
    );
    for dst in INT_DTYPES {
        assert!(
            conv(Source::F64(&[-0.0]), dst)
                .unwrap()
                .iter()
                .all(|&b| b == 0),
            "{dst}"
        );
        assert!(
            conv(Source::F32(&[-0.0]), dst)
                .unwrap()
                .iter()
                .all(|&b| b == 0),
            "{dst}"
        );
    }
    // underflow keeps the sign
    assert_eq!(f16_of_f64(-1e-30), 0x8000);
    assert_eq!(bf16_of_f64(-1e-300), 0x8000);
}

#[test]
fn f16_special_values_and_rounding() {
    for f in [f16_of_f64 as fn(f64) -> u16, |x| f16_of_f32(x as f32)] {
        assert_eq!(f(65504.0), 0x7BFF);
        assert_eq!(f(65519.0), 0x7BFF);
        assert_eq!(f(65520.0), 0x7C00); // tie with an odd max: rounds to infinity
        assert_eq!(f(-65520.0), 0xFC00);
        assert_eq!(f(1e10), 0x7C00);
        assert_eq!(f(f64::INFINITY), 0x7C00);
        assert_eq!(f(f64::NEG_INFINITY), 0xFC00);
        assert_eq!(f(1.0), 0x3C00);
        assert_eq!(f(2049.0), 0x6800); // tie -> even (2048)
        assert_eq!(f(2051.0), 0x6802); // tie -> even (2052)
        assert_eq!(f(2f64.powi(-14)), 0x0400); // smallest normal
        assert_eq!(f(2f64.powi(-24)), 0x0001); // smallest subnormal
        assert_eq!(f(1023.0 * 2f64.powi(-24)), 0x03FF); // largest subnormal
        assert_eq!(f(1023.5 * 2f64.powi(-24)), 0x0400); // tie rounds up into the normals
        assert_eq!(f(2f64.powi(-25)), 0x0000); // tie -> even (0)
        assert_eq!(f(3.0 * 2f64.powi(-25)), 0x0002); // tie -> even (2)
        assert_eq!(f(-1.5 * 2f64.powi(-24)), 0x8002);
        assert_eq!(f(2f64.powi(-26)), 0x0000);
        assert_eq!(f(f64::from(f32::from_bits(1))), 0x0000); // f32 subnormal
    }
    // just above the subnormal tie (not representable in f32)
    assert_eq!(f16_of_f64(2f64.powi(-25) * (1.0 + 2f64.powi(-40))), 0x0001);
    // single rounding from f64: through f32 these would round the wrong way
    assert_eq!(f16_of_f64(65519.999999), 0x7BFF); // f32: 65520 -> Inf
    assert_eq!(f16_of_f64(1.0 + 2f64.powi(-11) + 2f64.powi(-40)), 0x3C01); // f32: tie -> 0x3C00
    assert_eq!(f16_of_f64(f64::from_bits(1)), 0x0000);
    assert_eq!(f16_of_f64(f64::MAX), 0x7C00);
}

#[test]
fn bf16_special_values_and_ties() {
    let b = |bits: u32| bf16_of_f32(f32::from_bits(bits));
    assert_eq!(b(0x3F80_8000), 0x3F80); // tie -> even
    assert_eq!(b(0x3F81_8000), 0x3F82); // tie -> even
    assert_eq!(b(0x3F80_8001), 0x3F81);
    assert_eq!(b(0x3F80_7FFF), 0x3F80);
    assert_eq!(b(0xBF81_8000), 0xBF82);
    assert_eq!(b(0x7F7F_FFFF), 0x7F80); // f32::MAX rounds up to infinity
    assert_eq!(b(0x7F7F_7FFF), 0x7F7F);
    assert_eq!(b(0x7F7F_8000), 0x7F80); // tie with odd max -> infinity
    assert_eq!(b(0x0000_0001), 0x0000); // f32 subnormals
    assert_eq!(b(0x0000_8000), 0x0000); // tie -> even
    assert_eq!(b(0x0001_8000), 0x0002); // tie -> even
    assert_eq!(b(0x0000_8001), 0x0001);
    assert_eq!(b(0x007F_FFFF), 0x0080); // largest subnormal rounds to the smallest normal
    assert_eq!(b(0x7F80_0000), 0x7F80);
    assert_eq!(b(0xFF80_0000), 0xFF80);
    for bits in [
        0x3F80_8000u32,
        0x3F81_8000,
        0x3F80_8001,
        0x7F7F_FFFF,
        0x7F7F_8000,
        0x0000_8000,
        0x0001_8000,
        0x007F_FFFF,
        1,
    ] {
        assert_eq!(
            bf16_of_f64(f64::from(f32::from_bits(bits))),
            b(bits),
            "{bits:#x}"
        );
    }
    // f64: bf16 max, overflow, below-subnormal, and single rounding
    assert_eq!(bf16_of_f64(f64::from(bf16::MAX.to_f32())), 0x7F7F);
    assert_eq!(bf16_of_f64(f64::MAX), 0x7F80);
    assert_eq!(bf16_of_f64(1e-300), 0x0000);
    assert_eq!(bf16_of_f64(2f64.powi(-133)), 0x0001);
    assert_eq!(bf16_of_f64(2f64.powi(-134)), 0x0000); // tie -> even
    assert_eq!(
        bf16_of_f64(2f64.powi(-134) * (1.0 + 2f64.powi(-50))),
        0x0001
    );
    assert_eq!(bf16_of_f64(1.0 + 2f64.powi(-8) + 2f64.powi(-30)), 0x3F81); // through f32: 0x3F80
    assert_eq!(bf16_of_f64(1.0 + 2f64.powi(-8) - 2f64.powi(-30)), 0x3F80);
    // (2 - 2^-8) * 2^127 is the overflow tie; the f64 just below stays finite
    let tie = (2.0 - 2f64.powi(-8)) * 2f64.powi(127);
    assert_eq!(bf16_of_f64(tie), 0x7F80);
    assert_eq!(bf16_of_f64(f64::from_bits(tie.to_bits() - 1)), 0x7F7F);
}

#[test]
fn nan_stays_nan() {
    let f16_nan = |b: u16| b & 0x7C00 == 0x7C00 && b & 0x03FF != 0;
    let bf16_nan = |b: u16| b & 0x7F80 == 0x7F80 && b & 0x007F != 0;
    for bits in [
        0x7FC0_0000u32,
        0x7F80_0001,
        0xFF80_0001,
        0x7FA0_0000,
        0xFFC1_2345,
    ] {
        let x = f32::from_bits(bits);
        let sign = (bits >> 16) as u16 & 0x8000;
        let h = f16_of_f32(x);
        assert!(
            f16_nan(h) && h & 0x8000 == sign && h & 0x0200 != 0,
            "{bits:#x} -> {h:#x}"
        );
        let b = bf16_of_f32(x);
        assert!(
            bf16_nan(b) && b & 0x8000 == sign && b & 0x0040 != 0,
            "{bits:#x} -> {b:#x}"
        );
        assert_eq!(
            conv(Source::F32(&[x]), Dtype::F32).unwrap(),
            bits.to_le_bytes()
        );
    }
    assert_eq!(f16_of_f32(f32::from_bits(0xFFC1_2345)), 0xFE09); // payload top bits kept
    assert_eq!(bf16_of_f32(f32::from_bits(0xFFC1_2345)), 0xFFC1);
    for bits in [
        0x7FF8_0000_0000_0000u64,
        0x7FF0_0000_0000_0001,
        0xFFF4_0000_0000_0000,
    ] {
        let x = f64::from_bits(bits);
        let sign = (bits >> 48) as u16 & 0x8000;
        let h = f16_of_f64(x);
        assert!(f16_nan(h) && h & 0x8000 == sign, "{bits:#x} -> {h:#x}");
        let b = bf16_of_f64(x);
        assert!(bf16_nan(b) && b & 0x8000 == sign, "{bits:#x} -> {b:#x}");
        assert!(f32::from_le_bytes(
            conv(Source::F64(&[x]), Dtype::F32)
                .unwrap()
                .try_into()
                .unwrap()
        )
        .is_nan());
        assert_eq!(
            conv(Source::F64(&[x]), Dtype::F64).unwrap(),
            bits.to_le_bytes()
        );
    }
}

#[test]
fn integers_to_floats_round_once() {
    let bf = |x: i64| u16::from_le_bytes(of_i64(x, Dtype::Bf16).try_into().unwrap());
    let h = |x: i64| u16::from_le_bytes(of_i64(x, Dtype::F16).try_into().unwrap());
    let f = |x: i64| f32::from_le_bytes(of_i64(x, Dtype::F32).try_into().unwrap());
    let d = |x: i64| f64::from_le_bytes(of_i64(x, Dtype::F64).try_into().unwrap());
    // 2^62 + 2^54 + 1: just above a BF16 tie; `as f64` rounds it onto the tie (-> 2^62).
    assert_eq!(bf((1 << 62) + (1 << 54) + 1), 0x5E81);
    assert_eq!(bf((1 << 62) + (1 << 54)), 0x5E80);
    assert_eq!(bf(-(1 << 62) - (1 << 54) - 1), 0xDE81);
    assert_eq!(bf(i64::MAX), 0x5F00); // 2^63
    assert_eq!(bf(i64::MIN), 0xDF00);
    assert_eq!(bf((1 << 53) + 1), 0x5A00);
    assert_eq!(bf(257), 0x4380); // tie -> 256
    assert_eq!(bf(259), 0x4382); // tie -> 260
                                 // F32: 2^62 + 2^38 + 1 is above a tie; F64: 2^53 + 1 ties to 2^53, 2^63 - 1 -> 2^63
    assert_eq!(
        f((1 << 62) + (1 << 38) + 1),
        (2f64.powi(62) + 2f64.powi(39)) as f32
    );
    assert_eq!(f((1 << 62) + (1 << 38)), 2f32.powi(62));
    assert_eq!(f((1 << 24) + 1), 2f32.powi(24));
    assert_eq!(d((1 << 53) + 1), 2f64.powi(53));
    assert_eq!(d((1 << 53) + 3), 2f64.powi(53) + 4.0);
    assert_eq!(d(i64::MAX), 2f64.powi(63));
    assert_eq!(h(65504), 0x7BFF);
    assert_eq!(h(65519), 0x7BFF);
    assert_eq!(h(65520), 0x7C00);
    assert_eq!(h(-65520), 0xFC00);
    assert_eq!(h(2049), 0x6800);
    assert_eq!(h(2051), 0x6802);
    assert_eq!(h((1 << 53) + 1), 0x7C00);
    assert_eq!(h(i64::MIN), 0xFC00);
    // i32 sources: exact through f64, so no f32 double rounding
    let bf32 = |x: i32| {
        u16::from_le_bytes(
            conv(Source::I32(&[x]), Dtype::Bf16)
                .unwrap()
                .try_into()
                .unwrap(),
        )
    };
    assert_eq!(bf32((1 << 30) + (1 << 22) + 1), 0x4E81); // via f32 this ties to 0x4E80
    assert_eq!(bf32(i32::MIN), 0xCF00);
    assert_eq!(bf32(i32::MAX), 0x4F00);
}

// ---- property tests against an independent, exact reference ----

#[derive(Clone, Copy, Debug)]
enum Fmt {
    F16,
    Bf16,
}

impl Fmt {
    fn inf(self) -> u16 {
        match self {
            Fmt::F16 => 0x7C00,
            Fmt::Bf16 => 0x7F80,
        }
    }
    /// Exact value of a finite non-negative pattern; `inf` counts as 2^(emax+1).
    fn value(self, p: u16) -> f64 {
        match (self, p == self.inf()) {
            (Fmt::F16, true) => 65536.0,
            (Fmt::Bf16, true) => 2f64.powi(128),
            (Fmt::F16, false) => f16::from_bits(p).to_f64(),
            (Fmt::Bf16, false) => bf16::from_bits(p).to_f64(),
        }
    }
}

/// Correct RNE rounding of a finite non-negative value, which `cmp(m)` compares against `m`:
/// binary search for the neighbours, then compare with their midpoint (exact in f64).
fn reference(fmt: Fmt, cmp: impl Fn(f64) -> Ordering) -> u16 {
    // largest p in [0, inf) with value(p) <= v
    let (mut lo, mut hi) = (0u16, fmt.inf());
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if cmp(fmt.value(mid)) == Ordering::Less {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let (a, b) = (fmt.value(lo), fmt.value(lo + 1));
    match cmp(a) {
        Ordering::Equal => return lo,
        Ordering::Less => unreachable!(),
        Ordering::Greater => {}
    }
    match cmp((a + b) / 2.0) {
        Ordering::Less => lo,
        Ordering::Greater => lo + 1,
        Ordering::Equal => lo + (lo & 1),
    }
}

fn reference_f64(fmt: Fmt, x: f64) -> u16 {
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    let a = x.abs();
    if a.is_infinite() {
        return sign | fmt.inf();
    }
    sign | reference(fmt, |m| a.partial_cmp(&m).unwrap())
}

fn reference_i64(fmt: Fmt, x: i64) -> u16 {
    let sign = if x < 0 { 0x8000 } else { 0 };
    let a = i128::from(x).abs();
    sign | reference(fmt, |m| {
        // exact comparison of the integer a with m (m < 2^129 here)
        let fl = m.floor();
        let fi = fl as i128;
        if m >= 2f64.powi(126) {
            return Ordering::Less; // a < 2^64
        }
        match a.cmp(&fi) {
            Ordering::Equal if m != fl => Ordering::Less,
            o => o,
        }
    })
}

fn check_nan(fmt: Fmt, got: u16, negative: bool) {
    let inf = fmt.inf();
    assert!(
        got & inf == inf && got & !0x8000 & !inf != 0,
        "{got:#x} not NaN"
    );
    assert_eq!(got & 0x8000 != 0, negative);
}

/// An f64 whose exponent is in or near the F16/BF16 ranges, with random mantissa bits.
fn near_range(exp_lo: i32, exp_hi: i32) -> impl Strategy<Value = f64> {
    (any::<bool>(), exp_lo..exp_hi, any::<u64>()).prop_map(|(neg, e, m)| {
        let bits = (u64::from(neg) << 63) | (((e + 1023) as u64) << 52) | (m >> 12);
        f64::from_bits(bits)
    })
}

/// A value on or next to a rounding midpoint of `fmt` (the cases that catch double rounding).
fn near_midpoint(fmt: Fmt) -> impl Strategy<Value = f64> {
    (0u16..fmt.inf(), -3i64..=3, any::<bool>()).prop_map(move |(p, d, neg)| {
        let m = (fmt.value(p) + fmt.value(p + 1)) / 2.0;
        let x = f64::from_bits((m.to_bits() as i64 + d) as u64);
        if neg {
            -x
        } else {
            x
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    #[test]
    fn f32_to_f16_is_correctly_rounded(bits in any::<u32>()) {
        let x = f32::from_bits(bits);
        let got = f16_of_f32(x);
        if x.is_nan() {
            check_nan(Fmt::F16, got, x.is_sign_negative());
        } else {
            prop_assert_eq!(got, reference_f64(Fmt::F16, f64::from(x)), "{:#x}", bits);
            prop_assert_eq!(got, f16::from_f32(x).to_bits()); // half rounds f32 correctly
        }
    }

    #[test]
    fn f32_to_bf16_is_correctly_rounded(bits in any::<u32>()) {
        let x = f32::from_bits(bits);
        let got = bf16_of_f32(x);
        if x.is_nan() {
            check_nan(Fmt::Bf16, got, x.is_sign_negative());
        } else {
            prop_assert_eq!(got, reference_f64(Fmt::Bf16, f64::from(x)), "{:#x}", bits);
        }
    }

    #[test]
    fn f64_to_f16_rounds_once(x in prop_oneof![any::<f64>(), near_range(-30, 17), near_midpoint(Fmt::F16)]) {
        let got = f16_of_f64(x);
        if x.is_nan() {
            check_nan(Fmt::F16, got, x.is_sign_negative());
        } else {
            prop_assert_eq!(got, reference_f64(Fmt::F16, x), "{:e} {:#x}", x, x.to_bits());
        }
    }

    #[test]
    fn f64_to_bf16_rounds_once(x in prop_oneof![any::<f64>(), near_range(-140, 129), near_midpoint(Fmt::Bf16)]) {
        let got = bf16_of_f64(x);
        if x.is_nan() {
            check_nan(Fmt::Bf16, got, x.is_sign_negative());
        } else {
            prop_assert_eq!(got, reference_f64(Fmt::Bf16, x), "{:e} {:#x}", x, x.to_bits());
        }
    }

    #[test]
    fn i64_to_half_floats_rounds_once(
        x in prop_oneof![
            any::<i64>(),
            (0u32..64, any::<i64>()).prop_map(|(s, v)| v >> s),
            -70000i64..70000,
            // on or next to a BF16 midpoint above 2^53, where `as f64` would round onto it
            (54u32..63, 0i64..128, -3i64..=3, any::<bool>()).prop_map(|(e, k, d, neg)| {
                let x = (1i64 << e) + (2 * k + 1) * (1i64 << (e - 8)) + d;
                if neg { -x } else { x }
            }),
        ]
    ) {
        let bf = u16::from_le_bytes(of_i64(x, Dtype::Bf16).try_into().unwrap());
        prop_assert_eq!(bf, reference_i64(Fmt::Bf16, x), "{}", x);
        let h = u16::from_le_bytes(of_i64(x, Dtype::F16).try_into().unwrap());
        prop_assert_eq!(h, reference_i64(Fmt::F16, x), "{}", x);
        // F32 and F64: compare with the exact integer through i128
        let f = f32::from_le_bytes(of_i64(x, Dtype::F32).try_into().unwrap());
        let d = f64::from_le_bytes(of_i64(x, Dtype::F64).try_into().unwrap());
        for (got, next_up, next_down) in [
            (f as f64, f64::from(f32::from_bits(f.to_bits() + 1)), f64::from(f32::from_bits(f.to_bits().wrapping_sub(1)))),
            (d, f64::from_bits(d.to_bits() + 1), f64::from_bits(d.to_bits().wrapping_sub(1))),
        ] {
            // no neighbour is strictly closer: |x - got| <= |x - other| in exact i128 arithmetic
            if x == 0 { prop_assert_eq!(got, 0.0); continue; }
            let xi = i128::from(x);
            let err = (xi - got as i128).abs();
            for other in [next_up, next_down] {
                if other.is_finite() && other.abs() < 2f64.powi(100) && other.fract() == 0.0 {
                    prop_assert!(err <= (xi - other as i128).abs(), "{} {}", x, got);
                }
            }
        }
    }

    #[test]
    fn i64_round_trips_through_wide_integers(x in any::<i64>()) {
        prop_assert_eq!(of_i64(x, Dtype::I64), x.to_le_bytes());
        match u64::try_from(x) {
            Ok(u) => prop_assert_eq!(of_i64(x, Dtype::U64), u.to_le_bytes()),
            Err(_) => prop_assert!(conv(Source::I64(&[x]), Dtype::U64).is_err()),
        }
    }

    #[test]
    fn integers_convert_exactly_or_fail(x in any::<i32>(), shift in 0u32..32) {
        let v = x >> shift;
        for dst in INT_DTYPES {
            let r = IntRange::of(dst).unwrap();
            let fits = r.min <= i128::from(v) && i128::from(v) <= r.max;
            let size = dst.byte_size().unwrap();
            let expect = i128::from(v).to_le_bytes()[..size].to_vec();
            for src in [Source::I32(&[v]), Source::I64(&[i64::from(v)]), Source::F64(&[f64::from(v)])] {
                match conv(src, dst) {
                    Ok(bytes) => { prop_assert!(fits); prop_assert_eq!(&bytes, &expect); }
                    Err(e) => { prop_assert!(!fits, "{}", e); }
                }
            }
        }
    }

    #[test]
    fn fractional_floats_never_become_integers(x in near_range(-5, 40)) {
        prop_assume!(x.fract() != 0.0);
        for dst in INT_DTYPES {
            prop_assert!(conv(Source::F64(&[x]), dst).is_err());
        }
    }
}
