//! Prints what the architecture-sensitive code paths compute, one `name value` line each, so that
//! the output of an x86_64 build and of an aarch64 build (run under qemu-aarch64) can be diffed:
//!
//! ```text
//! cargo run --release -p safetensors-spark-engine --example arch_probe > x86_64.txt
//! tests/aarch64/run.sh        (builds it for aarch64, runs it under qemu and diffs the two)
//! ```
//!
//! What differs between the two machines and is covered here:
//! * CRC-32C: the crc32c crate takes SSE4.2 on x86_64 and the ARMv8 CRC instructions on aarch64
//!   (both detected at run time); every start offset 0..16 (unaligned loads) and lengths around
//!   the 8-byte and block boundaries, whole and appended in pieces.
//! * conversions (`format::convert`): on x86_64 the loops run compiled for AVX2 when the CPU has
//!   it, on aarch64 the baseline loop (NEON auto-vectorised); NaN payloads, signed zeros,
//!   subnormals, rounding ties and out-of-range values for every source type and writable dtype.
//! * decoding (`engine::read::decode_values`): little-endian bytes of every readable dtype from
//!   slices at every start offset 0..8 (data of a tensor can start at any byte of a file).
//! * the header parser (fast path and detailed path) and the file serialiser: bytes of a file and
//!   the header read back.
//!
//! Output is deterministic (a fixed xorshift sequence); values are printed as bit patterns or
//! SHA-256 digests, never through float formatting.

use std::fmt::Write as _;

use arrow_array::{Array, ArrayRef};
use safetensors_spark_engine::read::decode_values;
use safetensors_spark_format::convert::{append_converted, Source};
use safetensors_spark_format::file::{crc32c_append, crc32c_hex, serialize};
use safetensors_spark_format::header::{parse_file_bytes, TensorEntry};
use safetensors_spark_format::Dtype;
use sha2::{Digest, Sha256};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| (self.next() >> 56) as u8).collect()
    }
}

fn sha(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut s = String::with_capacity(64);
    for b in digest {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn crc_lines(out: &mut Vec<String>) {
    out.push(format!(
        "crc32c known-vector {}",
        crc32c_hex(crc32c_append(0, b"123456789"))
    ));
    let buf = Rng(0x5afe_5afe).bytes(70_000);
    let lengths = [
        0usize, 1, 3, 7, 8, 9, 15, 16, 17, 31, 63, 64, 100, 255, 256, 1000, 4095, 4096, 65_537,
    ];
    for offset in 0..16 {
        for &len in &lengths {
            let data = &buf[offset..offset + len];
            let whole = crc32c_append(0, data);
            // the same bytes appended in pieces of 1, 7 and 4096 bytes
            let mut pieces = [0u32; 3];
            for (slot, step) in pieces.iter_mut().zip([1usize, 7, 4096]) {
                *slot = data.chunks(step).fold(0, crc32c_append);
            }
            let agree = pieces.iter().all(|&p| p == whole);
            out.push(format!(
                "crc32c offset={offset} len={len} {} pieces-agree={agree}",
                crc32c_hex(whole)
            ));
        }
    }
}

/// Special values of f64 (as bits): zeros, subnormals, NaNs with payloads (quiet and signalling),
/// infinities, the F16/BF16 rounding ties and overflow edges, integer edges.
fn special_f64() -> Vec<f64> {
    let bits: [u64; 14] = [
        0x0000_0000_0000_0000,
        0x8000_0000_0000_0000,
        0x0000_0000_0000_0001,
        0x800f_ffff_ffff_ffff,
        0x7ff0_0000_0000_0000,
        0xfff0_0000_0000_0000,
        0x7ff8_0000_0000_0000,
        0xfff8_0000_0000_1234,
        0x7ff0_0000_0000_0001,
        0x7ff4_5678_9abc_def0,
        0x3ff0_0100_0000_0000, // 1 + 2^-8: a BF16 tie
        0x3ff0_0200_0000_0000, // 1 + 2^-7
        0x40ef_fe00_0000_0000, // 65520: F16 overflow tie
        0x3e70_0000_0000_0000, // 2^-24: smallest F16 subnormal
    ];
    let mut v: Vec<f64> = bits.iter().map(|&b| f64::from_bits(b)).collect();
    v.extend([
        1.0,
        -1.0,
        0.5,
        127.0,
        128.0,
        -129.0,
        255.0,
        256.0,
        65_535.0,
        65_536.0,
        2_147_483_647.0,
        2_147_483_648.0,
        -2_147_483_649.0,
        9_007_199_254_740_993.0,
        1.5,
        f64::MAX,
        f64::MIN_POSITIVE,
    ]);
    v
}

fn special_i64() -> Vec<i64> {
    vec![
        0,
        1,
        -1,
        127,
        128,
        -128,
        -129,
        255,
        256,
        32_767,
        32_768,
        -32_769,
        65_535,
        65_536,
        i64::from(i32::MAX),
        i64::from(i32::MAX) + 1,
        i64::from(i32::MIN) - 1,
        u32::MAX.into(),
        (1 << 53) + 1,
        (1 << 62) + 3,
        i64::MAX,
        i64::MIN,
    ]
}

fn sources(rng: &mut Rng) -> Vec<(String, Vec<u8>)> {
    // (name, raw little-endian source values); mixed special values and random bit patterns,
    // long enough to run the vector loops and a remainder
    let n = 10_007;
    let mut f64s = special_f64();
    f64s.extend((0..n).map(|_| f64::from_bits(rng.next())));
    f64s.extend((0..n).map(|i| (rng.next() % 100_000) as f64 / 7.0 - (i % 3) as f64 * 1e4));
    // NaN inputs by bit pattern (an `as` cast of a NaN is not specified bit for bit)
    let mut f32s: Vec<f32> = [
        0x0000_0000u32,
        0x8000_0000,
        0x0000_0001,
        0x807f_ffff,
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        0xffc0_1234,
        0x7f80_0001,
        0x7fa0_0000,
        0x3f80_8000, // 1 + 2^-8: a BF16 tie
        0x477f_f000, // 65520: F16 overflow tie
        0x3380_0000, // 2^-24
    ]
    .iter()
    .map(|&b| f32::from_bits(b))
    .collect();
    f32s.extend(
        special_f64()
            .iter()
            .filter(|x| !x.is_nan())
            .map(|&x| x as f32),
    );
    f32s.extend((0..n).map(|_| f32::from_bits(rng.next() as u32)));
    f32s.extend((0..n).map(|i| (rng.next() % 70_000) as f32 / 3.0 - (i % 5) as f32 * 1e3));
    let mut i64s = special_i64();
    i64s.extend((0..n).map(|_| rng.next() as i64));
    i64s.extend((0..n).map(|_| (rng.next() % 300) as i64 - 150));
    let le = |v: Vec<[u8; 8]>| v.concat();
    vec![
        (
            "f64".into(),
            le(f64s.iter().map(|x| x.to_le_bytes()).collect()),
        ),
        (
            "f32".into(),
            f32s.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ),
        (
            "i64".into(),
            le(i64s.iter().map(|x| x.to_le_bytes()).collect()),
        ),
    ]
}

fn conversion_lines(out: &mut Vec<String>, rng: &mut Rng) {
    let dtypes: Vec<Dtype> = Dtype::writable_names()
        .into_iter()
        .filter_map(Dtype::from_name)
        .collect();
    for (name, raw) in sources(rng) {
        for &dtype in &dtypes {
            // every source type, including the narrower integer ones, from the same values
            let results: Vec<(String, Result<Vec<u8>, String>)> = match name.as_str() {
                "f64" => {
                    let v: Vec<f64> = raw
                        .as_chunks::<8>()
                        .0
                        .iter()
                        .map(|c| f64::from_le_bytes(*c))
                        .collect();
                    vec![run("f64", Source::F64(&v), dtype)]
                }
                "f32" => {
                    let v: Vec<f32> = raw
                        .as_chunks::<4>()
                        .0
                        .iter()
                        .map(|c| f32::from_le_bytes(*c))
                        .collect();
                    vec![run("f32", Source::F32(&v), dtype)]
                }
                _ => {
                    let v: Vec<i64> = raw
                        .as_chunks::<8>()
                        .0
                        .iter()
                        .map(|c| i64::from_le_bytes(*c))
                        .collect();
                    let i32s: Vec<i32> = v.iter().map(|&x| x as i32).collect();
                    let i16s: Vec<i16> = v.iter().map(|&x| x as i16).collect();
                    let i8s: Vec<i8> = v.iter().map(|&x| x as i8).collect();
                    let bools: Vec<bool> = v.iter().map(|&x| x & 1 == 1).collect();
                    // the in-range part alone as well, so integer targets produce bytes too
                    let small: Vec<i64> = v.iter().map(|&x| x.rem_euclid(100)).collect();
                    vec![
                        run("i64", Source::I64(&v), dtype),
                        run("i64-small", Source::I64(&small), dtype),
                        run("i32", Source::I32(&i32s), dtype),
                        run("i16", Source::I16(&i16s), dtype),
                        run("i8", Source::I8(&i8s), dtype),
                        run("bool", Source::Bool(&bools), dtype),
                    ]
                }
            };
            for (src, result) in results {
                let dst = dtype.name();
                out.push(match result {
                    Ok(bytes) => format!("convert {src}->{dst} ok {}", sha(&bytes)),
                    Err(e) => format!("convert {src}->{dst} err {e}"),
                });
            }
        }
    }
}

fn run(src_name: &str, src: Source<'_>, dtype: Dtype) -> (String, Result<Vec<u8>, String>) {
    let mut bytes = Vec::new();
    let r = append_converted(src, dtype, &mut bytes)
        .map(|()| bytes)
        .map_err(|e| e.to_string());
    (src_name.to_string(), r)
}

/// The decoded values as their little-endian bit patterns (NaN payloads included).
fn array_bits(array: &ArrayRef) -> Vec<u8> {
    let data = array.to_data();
    let mut out = Vec::new();
    if let Some(bools) = array.as_any().downcast_ref::<arrow_array::BooleanArray>() {
        out.extend(bools.values().iter().map(u8::from));
        return out;
    }
    for buffer in data.buffers() {
        out.extend_from_slice(buffer.as_slice());
    }
    out
}

fn decode_lines(out: &mut Vec<String>, rng: &mut Rng) {
    let buf = rng.bytes(8 * 4099 + 8);
    for name in [
        "BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64",
    ] {
        let Some(dtype) = Dtype::from_name(name) else {
            out.push(format!("decode {name} unknown-dtype"));
            continue;
        };
        let size = dtype.byte_size().unwrap_or(1);
        for offset in 0..8 {
            let bytes = &buf[offset..offset + size * 4099];
            // U64 with the sign bit set is an error: clear the top bits so most values decode
            let owned: Vec<u8>;
            let bytes = if name == "U64" {
                owned = bytes
                    .chunks(8)
                    .flat_map(|c| {
                        let mut c: [u8; 8] = c.try_into().unwrap_or_default();
                        c[7] &= 0x7f;
                        c
                    })
                    .collect();
                &owned[..]
            } else {
                bytes
            };
            out.push(match decode_values(dtype, bytes) {
                Ok(array) => format!(
                    "decode {name} offset={offset} len={} {}",
                    array.len(),
                    sha(&array_bits(&array))
                ),
                Err(e) => format!("decode {name} offset={offset} err {e}"),
            });
        }
    }
}

fn file_lines(out: &mut Vec<String>, rng: &mut Rng) {
    let a = rng.bytes(6 * 4);
    let b = rng.bytes(3 * 2);
    let c = rng.bytes(5);
    let tensors = [
        (
            TensorEntry {
                name: "weight".into(),
                dtype: Dtype::F32,
                shape: vec![2, 3],
            },
            &a[..],
        ),
        (
            TensorEntry {
                name: "bias".into(),
                dtype: Dtype::Bf16,
                shape: vec![3],
            },
            &b[..],
        ),
        (
            TensorEntry {
                name: "mask".into(),
                dtype: Dtype::Bool,
                shape: vec![5],
            },
            &c[..],
        ),
    ];
    let metadata = [("format".to_string(), "pt".to_string())].into();
    match serialize(Some(&metadata), &tensors) {
        Ok(bytes) => {
            out.push(format!("file serialize {} {}", bytes.len(), sha(&bytes)));
            match parse_file_bytes(&bytes) {
                Ok(header) => {
                    for t in &header.tensors {
                        out.push(format!(
                            "file tensor {} {} {:?} {:?}",
                            t.name,
                            t.dtype.name(),
                            t.shape,
                            t.data_offsets
                        ));
                    }
                    out.push(format!("file data_start {}", header.data_start()));
                }
                Err(e) => out.push(format!("file parse err {e}")),
            }
        }
        Err(e) => out.push(format!("file serialize err {e}")),
    }
}

fn main() {
    let mut out = Vec::new();
    out.push(format!(
        "target little-endian={} pointer-width={}",
        cfg!(target_endian = "little"),
        usize::BITS
    ));
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    crc_lines(&mut out);
    conversion_lines(&mut out, &mut rng);
    decode_lines(&mut out, &mut rng);
    file_lines(&mut out, &mut rng);
    let text = out.join("\n");
    println!("{text}");
    eprintln!(
        "arch_probe: {} lines, digest {}; {}",
        out.len(),
        sha(text.as_bytes()),
        simd_paths()
    );
}

/// The run-time-dispatched paths this CPU takes (stderr only: it differs by machine by design).
fn simd_paths() -> String {
    #[cfg(target_arch = "x86_64")]
    return format!(
        "x86_64: crc32c sse4.2={}, conversions avx2={}",
        std::arch::is_x86_feature_detected!("sse4.2"),
        std::arch::is_x86_feature_detected!("avx2")
    );
    #[cfg(target_arch = "aarch64")]
    return format!(
        "aarch64: crc32c crc={}, neon={}",
        std::arch::is_aarch64_feature_detected!("crc"),
        std::arch::is_aarch64_feature_detected!("neon")
    );
    #[allow(unreachable_code)]
    String::from("other architecture")
}
