//! CPU cost of the KV task writer per key: drives `TaskWriter` (KV mode, `target_shard_size_mb`
//! 1000, one shard) with Arrow batches of 4096 rows, as the JVM hands them over, then `finish`
//! (seal, index part, task report). Rows: key `k<i>` and `WIDTH` × f32 (`WIDTH` > 0), or with
//! `WIDTH` = `epoch` the rows of `jvm-connector/bench/epoch.py` (256 × f32, a 3,072-byte image
//! written as U8 [3, 32, 32], an int64 label: three tensors per key). The batches are built
//! before the clock starts. Prints, per phase, the CPU time of the calling thread (where the
//! writer works; its sealer thread's fsync and rename are not included), the wall time, and the
//! CPU per key.
//!
//! `cargo run --release --example kv_cpu -- [ROWS] [WIDTH|epoch] [DIR]` (defaults 200000 64).
//! `perf record -g` on it gives the breakdown (spec/performance.md §10.6).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use arrow_array::types::Float32Type;
use arrow_array::{ArrayRef, BinaryArray, Int64Array, ListArray, StringArray, StructArray};
use arrow_schema::Field;
use safetensors_spark_engine::write::task::TaskWriter;
use safetensors_spark_engine::write::{
    ColumnPlan, DuplicatesStrategy, InputKind, SparkNumeric, WriteMode, WritePlan,
};
use safetensors_spark_format::Dtype;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

const BATCH_ROWS: usize = 4096;

/// CPU seconds of the calling thread, where the writer does its work, from
/// `/proc/thread-self/schedstat` (nanoseconds; the sealer thread's fsync and rename excluded).
fn cpu_s() -> f64 {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    s.split(' ').next().unwrap().parse::<u64>().unwrap() as f64 / 1e9
}

fn floats(from: usize, rows: usize, width: usize) -> ArrayRef {
    Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(
        (from..from + rows).map(|i| {
            Some(
                (0..width)
                    .map(|j| Some(((i * width + j) as f32).sin()))
                    .collect::<Vec<_>>(),
            )
        }),
    ))
}

/// `width` 0: the epoch rows (module docs).
fn make_batch(from: usize, rows: usize, width: usize) -> StructArray {
    let keys: ArrayRef = Arc::new(StringArray::from_iter_values(
        (from..from + rows).map(|i| format!("k{i}")),
    ));
    let mut children = vec![("key", keys)];
    if width > 0 {
        children.push(("xf", floats(from, rows, width)));
    } else {
        let images: Vec<Vec<u8>> = (from..from + rows)
            .map(|i| (0..3072).map(|j| (i * 31 + j * 7) as u8).collect())
            .collect();
        children.push(("embedding", floats(from, rows, 256)));
        children.push((
            "image",
            Arc::new(BinaryArray::from_iter_values(images.iter())),
        ));
        children.push((
            "label",
            Arc::new(Int64Array::from_iter_values(
                (from..from + rows).map(|i| (i % 1000) as i64),
            )),
        ));
    }
    StructArray::from(
        children
            .into_iter()
            .map(|(name, a)| (Arc::new(Field::new(name, a.data_type().clone(), true)), a))
            .collect::<Vec<_>>(),
    )
}

fn column(name: &str, field_index: usize, input: InputKind, dtype: Dtype) -> ColumnPlan {
    ColumnPlan {
        name: name.into(),
        field_index,
        input,
        dtype: Some(dtype),
        sample_shape: None,
        ragged: None,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rows: usize = args.get(1).map_or(200_000, |s| s.parse().unwrap());
    let width: usize = match args.get(2).map(String::as_str) {
        None => 64,
        Some("epoch") => 0,
        Some(w) => w.parse().unwrap(),
    };
    let float = |depth| InputKind::NumericArray {
        element: SparkNumeric::Float,
        depth,
    };
    let columns = if width > 0 {
        vec![column("xf", 1, float(1), Dtype::F32)]
    } else {
        vec![
            column("embedding", 1, float(1), Dtype::F32),
            ColumnPlan {
                sample_shape: Some(vec![3, 32, 32]),
                ..column("image", 2, InputKind::Binary, Dtype::U8)
            },
            column(
                "label",
                3,
                InputKind::Scalar {
                    element: SparkNumeric::Long,
                },
                Dtype::I64,
            ),
        ]
    };
    let dir = args.get(3).map_or_else(
        || std::env::temp_dir().join(format!("kv-cpu-{}", std::process::id())),
        PathBuf::from,
    );
    let plan = WritePlan {
        write_id: "0b7c6f4e-1111-2222-3333-444455556666".into(),
        mode: WriteMode::Kv {
            name_col: "key".into(),
            name_field_index: 0,
            kv_separator: "__".into(),
            target_shard_bytes: 1000 << 20,
            duplicates: DuplicatesStrategy::Fail,
        },
        columns,
        metadata: BTreeMap::new(),
        generate_index: false,
        retention_seconds: None,
        checkpoint_interval: None,
    };
    let _ = std::fs::remove_dir_all(&dir);
    let batches: Vec<StructArray> = (0..rows)
        .step_by(BATCH_ROWS)
        .map(|from| make_batch(from, BATCH_ROWS.min(rows - from), width))
        .collect();

    let (c0, t0) = (cpu_s(), Instant::now());
    let mut writer = TaskWriter::open(plan, 0, dir.clone()).unwrap();
    for b in &batches {
        writer.write_batch(b).unwrap();
    }
    let (c1, t1) = (cpu_s(), Instant::now());
    let done = writer.finish().unwrap();
    let (c2, t2) = (cpu_s(), Instant::now());
    let bytes: u64 = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    drop(done);
    let _ = std::fs::remove_dir_all(&dir);
    let per_key = |s: f64| s * 1e6 / rows as f64;
    println!("rows={rows} width={width} (0: epoch rows) output={bytes} bytes");
    println!(
        "  write_batch  cpu {:.4} s ({:.2} µs/key)  wall {:.3} s",
        c1 - c0,
        per_key(c1 - c0),
        (t1 - t0).as_secs_f64()
    );
    println!(
        "  finish       cpu {:.4} s ({:.2} µs/key)  wall {:.3} s",
        c2 - c1,
        per_key(c2 - c1),
        (t2 - t1).as_secs_f64()
    );
    println!(
        "  total        cpu {:.4} s ({:.2} µs/key)  wall {:.3} s",
        c2 - c0,
        per_key(c2 - c0),
        (t2 - t0).as_secs_f64()
    );
}
