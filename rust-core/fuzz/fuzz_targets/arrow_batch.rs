//! A batch of any values, nulls and list lengths, as the JVM hands it over: exported through the
//! Arrow C Data Interface, imported by the writer's own `import_batch`, and written by a
//! `TaskWriter` (batch or KV mode, any writable dtype, any tail strategy, both duplicate
//! strategies) into a scratch directory. Every outcome is a shard set or an error, never a
//! panic; a failed write leaves no file behind.
#![no_main]
use arrow_array::builder::{Float32Builder, Int64Builder, ListBuilder, StringBuilder};
use arrow_array::ffi::to_ffi;
use arrow_array::{Array, ArrayRef, StructArray};
use arrow_schema::Field;
use libfuzzer_sys::fuzz_target;
use safetensors_spark_engine::write::plan::plan_write;
use safetensors_spark_engine::write::task::{import_batch, TaskWriter};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const DTYPES: [&str; 13] = [
    "F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64", "BOOL",
];
const SCHEMA: &str = r#"{"type":"struct","fields":[
 {"name":"k","type":"string","nullable":true,"metadata":{}},
 {"name":"x","type":{"type":"array","elementType":"float","containsNull":true},"nullable":true,"metadata":{}},
 {"name":"y","type":"long","nullable":true,"metadata":{}}]}"#;
static RUN: AtomicU64 = AtomicU64::new(0);

fuzz_target!(|data: &[u8]| {
    let [mode, dtype, size, rest @ ..] = data else {
        return;
    };
    let kv = mode & 1 == 1;
    let mut options = BTreeMap::new();
    options.insert(
        "dtype".to_owned(),
        DTYPES[*dtype as usize % DTYPES.len()].to_owned(),
    );
    if kv {
        options.insert("name_col".to_owned(), "k".to_owned());
        let dup = if mode & 8 != 0 { "lastWin" } else { "fail" };
        options.insert("duplicatesStrategy".to_owned(), dup.to_owned());
        options.insert("target_shard_size_mb".to_owned(), "1".to_owned());
    } else {
        options.insert("batch_size".to_owned(), (1 + size % 8).to_string());
        options.insert("columns".to_owned(), "x,y".to_owned());
        let tail = ["write", "drop", "pad", "write"][((mode >> 1) & 3) as usize];
        options.insert("tail_strategy".to_owned(), tail.to_owned());
    }
    let Ok(plan) = plan_write(SCHEMA, &options, false) else {
        return;
    };
    // rows: [flags, key, y, x values (4 bytes each) ...], x's length in flags
    let (mut keys, mut xs, mut ys) = (
        StringBuilder::new(),
        ListBuilder::new(Float32Builder::new()),
        Int64Builder::new(),
    );
    let mut rows = 0usize;
    let mut bytes = rest;
    while let [flags, key, y, tail @ ..] = bytes {
        let n = (*flags as usize >> 3) % 5;
        let Some(values) = tail.get(..4 * n) else {
            break;
        };
        if flags & 1 == 1 {
            keys.append_null();
        } else {
            keys.append_value(format!("k{}", key % 8));
        }
        if flags & 2 == 2 {
            xs.append_null();
        } else {
            for v in values.chunks_exact(4) {
                let f = f32::from_le_bytes([v[0], v[1], v[2], v[3]]);
                if flags & 4 == 4 && v[0] == 0 {
                    xs.values().append_null();
                } else {
                    xs.values().append_value(f);
                }
            }
            xs.append(true);
        }
        ys.append_value(i64::from(*y as i8) * i64::from(*key));
        rows += 1;
        bytes = &tail[4 * n..];
        if rows == 64 {
            break;
        }
    }
    let mut children: Vec<(Arc<Field>, ArrayRef)> = Vec::new();
    let mut add = |name: &str, a: ArrayRef| {
        children.push((Arc::new(Field::new(name, a.data_type().clone(), true)), a));
    };
    if kv {
        add("k", Arc::new(keys.finish()));
    }
    add("x", Arc::new(xs.finish()));
    add("y", Arc::new(ys.finish()));
    let batch = StructArray::from(children);
    let Ok((mut array, mut schema)) = to_ffi(&batch.to_data()) else {
        return;
    };
    // SAFETY: both structs were just exported by arrow-rs for the same array.
    let imported = unsafe { import_batch(&mut array, &mut schema) };
    let imported = imported.expect("a batch exported by arrow-rs imports");
    assert_eq!(imported.len(), batch.len());

    let dir = std::env::temp_dir().join(format!(
        "st-fuzz-{}-{}",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    if let Ok(mut w) = TaskWriter::open(plan, 0, dir.clone()) {
        match w.write_batch(&imported) {
            Ok(_) => {
                let _ = w.finish();
            }
            Err(_) => {
                w.abort();
                let left: Vec<_> = std::fs::read_dir(&dir)
                    .expect("scratch dir")
                    .flatten()
                    .map(|e| e.file_name())
                    .collect();
                assert!(left.is_empty(), "a failed write left {left:?}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
});
