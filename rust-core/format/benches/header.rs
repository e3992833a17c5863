//! Header parse + validate (`header::parse_header`: JSON, every rule of format.md §3, the offset
//! check against the file length) for headers of 10 and 100,000 tensors (tensors/s), and of
//! 100,000 and 1,000,000 tensors (bytes/s), as written by our own
//! serialiser (`plan_file`). `parse_file_bytes` on the whole file is checked once per size.
//! `header_parse_bytes_detailed` runs the same headers through the detailed path alone
//! (`parse_header_detailed`, what `parse_header` ran before its fast path).
//!
//! `cargo bench -p safetensors-spark-format --bench header`; results in `target/criterion/header_parse/`.
// A bench aborts on a setup error: unwrap/expect are the plain way to say so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use safetensors_spark_format::dtype::Dtype;
use safetensors_spark_format::error::FormatError;
use safetensors_spark_format::header::{
    parse_file_bytes, parse_header, parse_header_detailed, parse_header_fast, plan_file, Header,
    TensorEntry,
};

/// A KV-shard-like file: `n` tensors `k<i>__x` of F32 [4], with `__metadata__`.
fn file_with(n: usize) -> Vec<u8> {
    let meta: BTreeMap<String, String> = [
        ("safetensors_spark.format_version", "1"),
        ("safetensors_spark.layout", "kv"),
        ("safetensors_spark.samples", "0"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let entries = (0..n)
        .map(|i| TensorEntry {
            name: format!("k{i}__x"),
            dtype: Dtype::F32,
            shape: vec![4],
        })
        .collect();
    let plan = plan_file(Some(&meta), entries).unwrap();
    let mut bytes = plan.header_bytes.clone();
    bytes.resize(plan.file_len() as usize, 0);
    bytes
}

fn headers(c: &mut Criterion) {
    let mut group = c.benchmark_group("header_parse");
    for n in [10usize, 100_000] {
        let file = file_with(n);
        let header = parse_file_bytes(&file).unwrap();
        assert_eq!(header.tensors.len(), n);
        let json = &file[8..8 + header.header_len as usize];
        let file_len = file.len() as u64;
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &json, |b, json| {
            b.iter(|| parse_header(black_box(json), file_len).unwrap())
        });
    }
    group.finish();
    // Bytes per second of large KV headers (spec/performance.md: ≥ 200 MB/s), through
    // `parse_header` and through the detailed path alone (the parser before the fast path, still
    // the one that words errors and feeds the forensic report): a before/after in one run.
    type Parse = fn(&[u8], u64) -> Result<Header, FormatError>;
    let paths: [(&str, Parse); 2] = [
        ("header_parse_bytes", parse_header),
        ("header_parse_bytes_detailed", parse_header_detailed),
    ];
    for (name, parse) in paths {
        let mut group = c.benchmark_group(name);
        group.sample_size(10);
        for n in [100_000usize, 1_000_000] {
            let file = file_with(n);
            let header = parse_file_bytes(&file).unwrap();
            let json = &file[8..8 + header.header_len as usize];
            let file_len = file.len() as u64;
            assert!(parse_header_fast(json, file_len).is_some());
            group.throughput(Throughput::Bytes(json.len() as u64));
            group.bench_with_input(BenchmarkId::from_parameter(n), &json, |b, json| {
                b.iter(|| parse(black_box(json), file_len).unwrap())
            });
        }
        group.finish();
    }
}

criterion_group!(benches, headers);
criterion_main!(benches);
