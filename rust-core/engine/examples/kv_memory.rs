//! Heap use of the task writer: drives `TaskWriter` with Arrow batches of 4096 rows of
//! (key string, 256 × f32 list), as the JVM hands them over, and reports the heap the writer
//! holds (a counting global allocator).
//!
//! `cargo run --release --example kv_memory -- [kv|batch] [ROWS] [TARGET_MB] [DIR]`
//!
//! Printed: heap retained by the writer after the batches (the batch itself dropped), bytes per
//! row, the peak during the batches and during `finish` (which seals the last shard and writes
//! the task report file), all relative to the heap before `open`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use arrow_array::types::Float32Type;
use arrow_array::{ArrayRef, ListArray, StringArray, StructArray};
use arrow_schema::Field;
use safetensors_spark_engine::write::task::{read_report, TaskWriter};
use safetensors_spark_engine::write::{
    ColumnPlan, DuplicatesStrategy, InputKind, SparkNumeric, TailStrategy, WriteMode, WritePlan,
};
use safetensors_spark_format::alloc_stats::{
    allocations, live_bytes as current, peak_bytes, track_peak,
};
use safetensors_spark_format::Dtype;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

fn mib(b: usize) -> String {
    format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64)
}

const DIM: usize = 256;
const BATCH_ROWS: usize = 4096;

fn make_batch(kv: bool, from: usize, rows: usize) -> StructArray {
    let keys: ArrayRef = Arc::new(StringArray::from_iter_values(
        (from..from + rows).map(|i| format!("k{i}")),
    ));
    let values: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(
        (from..from + rows).map(|i| {
            Some(
                (0..DIM)
                    .map(|j| Some(((i * DIM + j) as f32).sin()))
                    .collect::<Vec<_>>(),
            )
        }),
    ));
    let mut children = Vec::new();
    if kv {
        children.push((
            Arc::new(Field::new("key", keys.data_type().clone(), true)),
            keys,
        ));
    }
    children.push((
        Arc::new(Field::new("xf", values.data_type().clone(), true)),
        values,
    ));
    StructArray::from(children)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let kv = args.get(1).map_or("kv", String::as_str) == "kv";
    let rows: usize = args.get(2).map_or(100_000, |s| s.parse().unwrap());
    let target_mb: u64 = args.get(3).map_or(1000, |s| s.parse().unwrap());
    let dir = args.get(4).map_or_else(
        || std::env::temp_dir().join(format!("kv-memory-{}", std::process::id())),
        PathBuf::from,
    );
    let mode = if kv {
        WriteMode::Kv {
            name_col: "key".into(),
            name_field_index: 0,
            kv_separator: "__".into(),
            target_shard_bytes: target_mb << 20,
            duplicates: DuplicatesStrategy::Fail,
        }
    } else {
        WriteMode::Batch {
            batch_size: BATCH_ROWS as u64,
            tail_strategy: TailStrategy::Write,
        }
    };
    let plan = WritePlan {
        write_id: "0b7c6f4e-1111-2222-3333-444455556666".into(),
        mode,
        columns: vec![ColumnPlan {
            name: "xf".into(),
            field_index: 1,
            input: InputKind::NumericArray {
                element: SparkNumeric::Float,
                depth: 1,
            },
            dtype: Some(Dtype::F32),
            sample_shape: None,
            ragged: None,
        }],
        metadata: BTreeMap::new(),
        generate_index: false,
        retention_seconds: None,
        checkpoint_interval: None,
    };
    let _ = std::fs::remove_dir_all(&dir);

    let base = current();
    let allocs0 = allocations();
    track_peak(true);
    let mut writer = TaskWriter::open(plan, 0, dir.clone()).unwrap();
    let mut batch_peak = 0usize;
    let mut batch_bytes = 0usize;
    let mut sealed_json = 0usize;
    let mut from = 0;
    while from < rows {
        let n = BATCH_ROWS.min(rows - from);
        let before = current();
        let batch = make_batch(kv, from, n);
        let this_batch = current() - before;
        batch_bytes = batch_bytes.max(this_batch);
        track_peak(true);
        let sealed = writer.write_batch(&batch).unwrap();
        // What the JNI `writeBatch` returns.
        sealed_json += serde_json::to_string(&sealed).unwrap().len();
        drop(sealed);
        batch_peak = batch_peak.max(peak_bytes() - base - this_batch);
        drop(batch);
        from += n;
    }
    let retained = current() - base;
    track_peak(true);
    let done = writer.finish().unwrap();
    let finish_peak = peak_bytes() - base;
    let after_finish = current() - base;
    // What the JNI `finish` returns is small (file names); the report is in its file.
    let report_bytes = std::fs::metadata(&done.report_path).unwrap().len() as usize;
    let report = read_report(&done.report_path).unwrap();
    let tensors: usize = report.shards.iter().map(|s| s.tensors.len()).sum();
    drop((done, report));
    let allocs = allocations() - allocs0;
    let _ = std::fs::remove_dir_all(&dir);

    println!(
        "mode={} rows={rows} target={target_mb}MB shards/tensors reported={tensors}",
        if kv { "kv" } else { "batch" }
    );
    println!("  one input batch (harness-owned)     {}", mib(batch_bytes));
    println!(
        "  retained by writer after batches    {}  ({:.0} B/row)",
        mib(retained),
        retained as f64 / rows as f64
    );
    println!(
        "  peak during write_batch (excl. the batch) {}",
        mib(batch_peak)
    );
    println!(
        "  peak during finish                  {}  ({:.0} B/row)",
        mib(finish_peak),
        finish_peak as f64 / rows as f64
    );
    println!(
        "  held after finish                   {}  ({:.0} B/row)",
        mib(after_finish),
        after_finish as f64 / rows as f64
    );
    println!(
        "  JSON: writeBatch total {}  task report file {}",
        mib(sealed_json),
        mib(report_bytes)
    );
    println!(
        "  allocations {allocs} ({:.1}/row)",
        allocs as f64 / rows as f64
    );
}
