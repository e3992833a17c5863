//! Conversion throughput per (source type → dtype) pair, in bytes of input per second, next to a
//! plain `memcpy` (`copy_from_slice`) of the same number of bytes. One thread.
//!
//! `cargo bench -p safetensors-spark-format --bench convert`; results in
//! `target/criterion/<pair>/{convert,memcpy}/`.
// A bench aborts on a setup error: unwrap/expect are the plain way to say so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use safetensors_spark_format::convert::{append_converted, convert_into, converted_len, Source};
use safetensors_spark_format::dtype::Dtype;

/// Elements per conversion: 4 MiB of f32 input, 8 MiB of f64/i64 input.
const N: usize = 1 << 20;

/// Deterministic values spread over many binades (normals, F16 subnormals, values that overflow
/// F16), signs mixed: every branch of the rounding is exercised.
fn doubles() -> Vec<f64> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..N)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let mantissa = (state >> 11) as f64 / (1u64 << 53) as f64 + 0.5;
            let exp = ((state & 0xff) as i32 % 48) - 30; // 2^-30 .. 2^17
            let sign = if state & 0x100 == 0 { 1.0 } else { -1.0 };
            sign * mantissa * 2f64.powi(exp)
        })
        .collect()
}

fn bench_pair(c: &mut Criterion, name: &str, src: Source<'_>, dst: Dtype, input_bytes: usize) {
    let mut out = vec![0u8; converted_len(src.len(), dst).unwrap()];
    // The API the writer uses: check once that the conversion succeeds on this input.
    let mut check = Vec::new();
    append_converted(src, dst, &mut check).unwrap();
    let copy_src = vec![0x5au8; input_bytes];
    let mut copy_dst = vec![0u8; input_bytes];

    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Bytes(input_bytes as u64));
    group.bench_function("convert", |b| {
        b.iter(|| convert_into(black_box(src), dst, black_box(&mut out)).unwrap())
    });
    group.bench_function("memcpy", |b| {
        b.iter(|| black_box(&mut copy_dst).copy_from_slice(black_box(&copy_src)))
    });
    group.finish();
}

fn conversions(c: &mut Criterion) {
    let f64s = doubles();
    let f32s: Vec<f32> = f64s.iter().map(|&x| x as f32).collect();
    let i64s: Vec<i64> = f64s
        .iter()
        .map(|&x| (x * 1e4) as i64 % i64::from(i32::MAX))
        .collect();
    bench_pair(c, "f32_to_F16", Source::F32(&f32s), Dtype::F16, N * 4);
    bench_pair(c, "f32_to_BF16", Source::F32(&f32s), Dtype::Bf16, N * 4);
    bench_pair(c, "f64_to_F16", Source::F64(&f64s), Dtype::F16, N * 8);
    bench_pair(c, "f64_to_BF16", Source::F64(&f64s), Dtype::Bf16, N * 8);
    bench_pair(c, "f64_to_F32", Source::F64(&f64s), Dtype::F32, N * 8);
    bench_pair(c, "i64_to_I32", Source::I64(&i64s), Dtype::I32, N * 8);
    bench_pair(c, "f32_to_F32", Source::F32(&f32s), Dtype::F32, N * 4);
}

criterion_group!(benches, conversions);
criterion_main!(benches);
