//! Test tool for the cross-language checks: prints example manifests built by `commit_manifest`
//! from synthetic task reports (batch, batch pad, batch drop, KV, KV lastWin, empty, appended) as
//! a JSON array of `{"name", "manifest"}`, so Python can validate them against the JSON Schema.
//!
//! `manifest_examples [INDEX.parquet]`: with a path, also writes a tensor index there (rows of
//! the batch and KV examples) so other tools can read it. Exits 1 with the error on stderr.

use safetensors_spark_dataset::index::{write_index, IndexRow};
use safetensors_spark_dataset::manifest::{next_manifest, Manifest};
use safetensors_spark_engine::write::commit::{commit_manifest, index_rows, CommitPlan};
use safetensors_spark_engine::write::plan::plan_write;
use safetensors_spark_engine::write::{
    shard_file_name, ColumnReport, SealedTensor, ShardReport, TaskReport, WritePlan,
};
use safetensors_spark_format::Dtype;
use std::collections::BTreeMap;
use std::error::Error;
use std::path::Path;
use std::process::ExitCode;

type Res<T> = Result<T, Box<dyn Error>>;

const SCHEMA: &str = r#"{"type":"struct","fields":[
 {"name":"key","type":"string","nullable":false,"metadata":{}},
 {"name":"pixels","type":{"type":"array","elementType":{"type":"array","elementType":"float","containsNull":false},"containsNull":false},"nullable":true,"metadata":{}},
 {"name":"label","type":"long","nullable":true,"metadata":{}}]}"#;

fn plan(options: &[(&str, &str)]) -> Res<WritePlan> {
    let options: BTreeMap<String, String> = options
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Ok(plan_write(SCHEMA, &options, false)?)
}

fn tensor(
    name: &str,
    dtype: Dtype,
    shape: Vec<u64>,
    start: u64,
    key: Option<&str>,
) -> SealedTensor {
    let bytes = shape.iter().product::<u64>() * u64::from(dtype.bits() / 8);
    SealedTensor {
        name: name.into(),
        dtype,
        shape,
        data_start: start,
        data_end: start + bytes,
        sample_key: key.map(String::from),
        column: key.map(|_| name.rsplit("__").next().unwrap_or_default().to_string()),
    }
}

/// A batch shard of `rows` real + `pad` padding rows: pixels F16 [n, 2, 2], label I64 [n].
fn batch_shard(p: &WritePlan, partition: u32, shard: u32, rows: u64, pad: u64) -> ShardReport {
    let n = rows + pad;
    let pixels = tensor("pixels", Dtype::F16, vec![n, 2, 2], 128, None);
    let label = tensor("label", Dtype::I64, vec![n], pixels.data_end, None);
    ShardReport {
        file: shard_file_name(partition, shard, &p.write_id),
        local_path: String::new(),
        partition,
        shard,
        samples: rows,
        padded_samples: pad,
        bytes: label.data_end,
        crc32c: None,
        tensors: vec![label, pixels],
        num_tensors: None,
    }
}

fn batch_task(partition: u32, shards: Vec<ShardReport>, dropped: u64) -> TaskReport {
    TaskReport {
        partition,
        shards,
        dropped_samples: dropped,
        columns: BTreeMap::from([
            (
                "pixels".to_string(),
                ColumnReport {
                    dtype: Dtype::F16,
                    sample_shape: Some(vec![2, 2]),
                    inner_shape: None,
                },
            ),
            (
                "label".to_string(),
                ColumnReport {
                    dtype: Dtype::I64,
                    sample_shape: Some(vec![]),
                    inner_shape: None,
                },
            ),
        ]),
    }
}

/// A KV shard: per key `<key>__pixels` F32 [side, side] and `<key>__label` I64 [].
fn kv_shard(p: &WritePlan, partition: u32, shard: u32, keys: &[(&str, u64)]) -> ShardReport {
    let mut tensors = Vec::new();
    let mut at = 256;
    for (key, side) in keys {
        let px = tensor(
            &format!("{key}__pixels"),
            Dtype::F32,
            vec![*side, *side],
            at,
            Some(key),
        );
        let lb = tensor(
            &format!("{key}__label"),
            Dtype::I64,
            vec![],
            px.data_end,
            Some(key),
        );
        at = lb.data_end;
        tensors.push(px);
        tensors.push(lb);
    }
    ShardReport {
        file: shard_file_name(partition, shard, &p.write_id),
        local_path: String::new(),
        partition,
        shard,
        samples: keys.len() as u64,
        padded_samples: 0,
        bytes: at,
        crc32c: None,
        tensors,
        num_tensors: None,
    }
}

fn kv_task(partition: u32, shards: Vec<ShardReport>, side: Option<u64>) -> TaskReport {
    TaskReport {
        partition,
        shards,
        dropped_samples: 0,
        columns: BTreeMap::from([
            (
                "pixels".to_string(),
                ColumnReport {
                    dtype: Dtype::F32,
                    sample_shape: side.map(|s| vec![s, s]),
                    inner_shape: None,
                },
            ),
            (
                "label".to_string(),
                ColumnReport {
                    dtype: Dtype::I64,
                    sample_shape: Some(vec![]),
                    inner_shape: None,
                },
            ),
        ]),
    }
}

fn run(index_path: Option<&str>) -> Res<()> {
    let mut out: Vec<(String, Manifest)> = Vec::new();
    let mut rows: Vec<IndexRow> = Vec::new();
    let mut keep = |name: &str, c: &CommitPlan| {
        out.push((name.to_string(), c.manifest.clone()));
        if matches!(name, "batch" | "kv") {
            rows.extend(c.shards.iter().flat_map(index_rows));
        }
    };

    let b = plan(&[
        ("batch_size", "4"),
        ("columns", "pixels,label"),
        ("dtypes", r#"{"pixels":"f16"}"#),
    ])?;
    let batch = commit_manifest(
        &b,
        &[
            batch_task(
                0,
                vec![batch_shard(&b, 0, 0, 4, 0), batch_shard(&b, 0, 1, 3, 0)],
                0,
            ),
            batch_task(1, vec![batch_shard(&b, 1, 0, 4, 0)], 0),
        ],
    )?;
    keep("batch", &batch);

    let bp = plan(&[
        ("batch_size", "4"),
        ("columns", "pixels,label"),
        ("dtype", "F16"),
        ("tail_strategy", "pad"),
    ])?;
    let mut bp_tasks = vec![batch_task(
        0,
        vec![batch_shard(&bp, 0, 0, 4, 0), batch_shard(&bp, 0, 1, 1, 3)],
        0,
    )];
    bp_tasks[0]
        .columns
        .entry("label".into())
        .and_modify(|c| c.dtype = Dtype::F16);
    for s in &mut bp_tasks[0].shards {
        for t in &mut s.tensors {
            t.dtype = Dtype::F16;
        }
    }
    keep("batch_pad", &commit_manifest(&bp, &bp_tasks)?);

    let bd = plan(&[
        ("batch_size", "4"),
        ("columns", "pixels,label"),
        ("dtypes", r#"{"pixels":"F16"}"#),
        ("tail_strategy", "drop"),
    ])?;
    let batch_drop = commit_manifest(
        &bd,
        &[
            batch_task(0, vec![batch_shard(&bd, 0, 0, 4, 0)], 2),
            batch_task(1, vec![], 3),
        ],
    )?;
    keep("batch_drop", &batch_drop);

    let k = plan(&[("name_col", "key")])?;
    let kv = commit_manifest(
        &k,
        &[
            kv_task(0, vec![kv_shard(&k, 0, 0, &[("a", 2), ("b", 3)])], None),
            kv_task(1, vec![kv_shard(&k, 1, 0, &[("c", 2)])], Some(2)),
        ],
    )?;
    keep("kv", &kv);

    let kl = plan(&[
        ("name_col", "key"),
        ("duplicatesStrategy", "lastWin"),
        ("kv_separator", "__"),
    ])?;
    keep(
        "kv_last_win",
        &commit_manifest(
            &kl,
            &[
                kv_task(
                    0,
                    vec![
                        kv_shard(&kl, 0, 0, &[("a", 2), ("b", 2)]),
                        kv_shard(&kl, 0, 1, &[("c", 2)]),
                    ],
                    Some(2),
                ),
                kv_task(1, vec![kv_shard(&kl, 1, 0, &[("a", 2), ("c", 2)])], Some(2)),
            ],
        )?,
    );

    keep("empty_batch", &commit_manifest(&b, &[])?);
    keep("empty_kv", &commit_manifest(&k, &[])?);

    let mut appended: Vec<(String, Manifest)> = Vec::new();
    let b2 = plan(&[
        ("batch_size", "4"),
        ("columns", "pixels,label"),
        ("dtypes", r#"{"pixels":"F16"}"#),
    ])?;
    let more = commit_manifest(&b2, &[batch_task(5, vec![batch_shard(&b2, 5, 0, 2, 0)], 0)])?;
    appended.push((
        "batch_appended".into(),
        next_manifest(Some(&batch.manifest), &more.manifest, true, &[])?,
    ));
    let k2 = plan(&[("name_col", "key")])?;
    let more = commit_manifest(
        &k2,
        &[kv_task(0, vec![kv_shard(&k2, 0, 0, &[("z", 4)])], Some(4))],
    )?;
    appended.push((
        "kv_appended".into(),
        next_manifest(Some(&kv.manifest), &more.manifest, true, &[])?,
    ));
    let e2 = plan(&[
        ("batch_size", "4"),
        ("columns", "pixels,label"),
        ("dtypes", r#"{"pixels":"F16"}"#),
        ("tail_strategy", "drop"),
    ])?;
    let more = commit_manifest(&e2, &[batch_task(0, vec![batch_shard(&e2, 0, 0, 4, 0)], 0)])?;
    appended.push((
        "appended_to_empty".into(),
        next_manifest(
            Some(&commit_manifest(&e2, &[])?.manifest),
            &more.manifest,
            true,
            &[],
        )?,
    ));
    out.extend(appended);
    let _ = batch_drop;

    // Printed by hand so each manifest keeps its own key order (columns in write order).
    let mut items = Vec::new();
    for (name, m) in &out {
        items.push(format!(
            "{{\"name\": {}, \"manifest\": {}}}",
            serde_json::to_string(name)?,
            m.to_json_pretty()?
        ));
    }
    println!("[\n{}\n]", items.join(",\n"));
    if let Some(path) = index_path {
        write_index(Path::new(path), rows)?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(args.first().map(String::as_str)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
