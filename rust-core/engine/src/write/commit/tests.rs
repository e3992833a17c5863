use super::*;
use crate::write::plan::plan_write;
use crate::write::InputKind;
use safetensors_spark_dataset::manifest::{next_manifest, parse_manifest};
use safetensors_spark_dataset::DatasetError;
use safetensors_spark_format::file::write_file;
use safetensors_spark_format::header::TensorEntry;
use safetensors_spark_format::Dtype;
use std::sync::atomic::{AtomicU64, Ordering};

fn ext(m: &Manifest) -> &ManifestExt {
    m.ext.as_ref().unwrap()
}

fn opts(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const SCHEMA: &str = r#"{"type":"struct","fields":[
 {"name":"k","type":"string","nullable":true,"metadata":{}},
 {"name":"x","type":{"type":"array","elementType":"float","containsNull":true},"nullable":true,"metadata":{}},
 {"name":"y","type":{"type":"array","elementType":"long","containsNull":true},"nullable":true,"metadata":{}}]}"#;

fn batch_plan(tail: &str) -> WritePlan {
    plan_write(
        SCHEMA,
        &opts(&[
            ("batch_size", "2"),
            ("columns", "x,y"),
            ("tail_strategy", tail),
        ]),
        false,
    )
    .unwrap()
}

fn kv_plan(dup: &str) -> WritePlan {
    plan_write(
        SCHEMA,
        &opts(&[("name_col", "k"), ("duplicatesStrategy", dup)]),
        false,
    )
    .unwrap()
}

fn col(dtype: Dtype, shape: Option<Vec<u64>>) -> ColumnReport {
    ColumnReport {
        dtype,
        sample_shape: shape,
        inner_shape: None,
    }
}

/// A batch shard with `rows` real rows + `pad` padding rows of x: F32 [3] and y: I64 [2].
fn batch_shard(plan: &WritePlan, partition: u32, shard: u32, rows: u64, pad: u64) -> ShardReport {
    let n = rows + pad;
    ShardReport {
        file: shard_file_name(partition, shard, &plan.write_id),
        local_path: String::new(),
        partition,
        shard,
        samples: rows,
        padded_samples: pad,
        bytes: 100 + n * 28,
        crc32c: None,
        tensors: vec![
            SealedTensor {
                name: "y".into(),
                dtype: Dtype::I64,
                shape: vec![n, 2],
                data_start: 100,
                data_end: 100 + n * 16,
                sample_key: None,
                column: None,
            },
            SealedTensor {
                name: "x".into(),
                dtype: Dtype::F32,
                shape: vec![n, 3],
                data_start: 100 + n * 16,
                data_end: 100 + n * 28,
                sample_key: None,
                column: None,
            },
        ],
        num_tensors: None,
    }
}

fn batch_task(partition: u32, shards: Vec<ShardReport>, dropped: u64) -> TaskReport {
    TaskReport {
        partition,
        shards,
        dropped_samples: dropped,
        columns: BTreeMap::from([
            ("x".into(), col(Dtype::F32, Some(vec![3]))),
            ("y".into(), col(Dtype::I64, Some(vec![2]))),
        ]),
    }
}

/// A KV shard holding `keys`, each with tensors `<key>__x` and `<key>__y`.
fn kv_shard(plan: &WritePlan, partition: u32, shard: u32, keys: &[&str]) -> ShardReport {
    let mut tensors = Vec::new();
    for k in keys {
        for c in ["x", "y"] {
            tensors.push(SealedTensor {
                name: format!("{k}__{c}"),
                dtype: if c == "x" { Dtype::F32 } else { Dtype::I64 },
                shape: vec![2],
                data_start: 0,
                data_end: 0,
                sample_key: Some(k.to_string()),
                column: Some(c.into()),
            });
        }
    }
    ShardReport {
        file: shard_file_name(partition, shard, &plan.write_id),
        local_path: String::new(),
        partition,
        shard,
        samples: keys.len() as u64,
        padded_samples: 0,
        bytes: 1000,
        crc32c: None,
        tensors,
        num_tensors: None,
    }
}

fn kv_task(partition: u32, shards: Vec<ShardReport>, x_shape: Option<Vec<u64>>) -> TaskReport {
    TaskReport {
        partition,
        shards,
        dropped_samples: 0,
        columns: BTreeMap::from([
            ("x".into(), col(Dtype::F32, x_shape)),
            ("y".into(), col(Dtype::I64, Some(vec![2]))),
        ]),
    }
}

#[test]
fn batch_write_totals_and_order() {
    let p = batch_plan("write");
    let reports = vec![
        batch_task(
            1,
            vec![batch_shard(&p, 1, 0, 2, 0), batch_shard(&p, 1, 1, 1, 0)],
            0,
        ),
        batch_task(0, vec![batch_shard(&p, 0, 0, 2, 0)], 0),
        // An empty partition.
        TaskReport {
            partition: 2,
            shards: vec![],
            dropped_samples: 0,
            columns: BTreeMap::new(),
        },
    ];
    let c = commit_manifest(&p, &reports).unwrap();
    assert!(c.rewrites.is_empty());
    let m = &c.manifest;
    assert_eq!(m.mode(), Some(DatasetMode::Batch));
    assert_eq!(ext(m).batch_size, Some(2));
    assert_eq!(ext(m).tail_strategy, Some(TailStrategy::Write));
    assert_eq!(ext(m).kv_separator, None);
    assert_eq!(m.total_samples, 5);
    assert_eq!(ext(m).padded_samples, 0);
    assert_eq!(ext(m).dropped_samples, 0);
    assert_eq!(m.total_bytes, m.shards.iter().map(|s| s.bytes).sum::<u64>());
    assert_eq!(
        m.shards
            .iter()
            .map(|s| (
                s.partition.unwrap(),
                s.samples_count,
                s.num_tensors.unwrap()
            ))
            .collect::<Vec<_>>(),
        [(0, 2, 2), (1, 2, 2), (1, 1, 2)]
    );
    assert!(m
        .shards
        .windows(2)
        .all(|w| w[0].shard_path < w[1].shard_path));
    // Columns in plan order, not alphabetical.
    assert_eq!(m.schema.names().collect::<Vec<_>>(), ["x", "y"]);
    assert_eq!(
        m.schema.get("x"),
        Some(&ManifestTensor {
            dtype: Dtype::F32,
            shape: Some(vec![2, 3]),
            ragged: None,
        })
    );
    assert_eq!(
        ext(m).created_by,
        format!("safetensors-spark {}", safetensors_spark_format::VERSION)
    );
    let json = m.to_json_pretty().unwrap();
    assert!(json.find("\"x\"").unwrap() < json.find("\"y\"").unwrap());
    assert_eq!(parse_manifest(&json).unwrap(), *m);
    assert_eq!(c.shards.len(), 3);
}

#[test]
fn batch_pad_and_drop_totals() {
    let p = batch_plan("pad");
    let reports = vec![batch_task(
        0,
        vec![batch_shard(&p, 0, 0, 2, 0), batch_shard(&p, 0, 1, 1, 1)],
        0,
    )];
    let m = commit_manifest(&p, &reports).unwrap().manifest;
    assert_eq!(
        (
            m.total_samples,
            ext(&m).padded_samples,
            ext(&m).dropped_samples
        ),
        (3, 1, 0)
    );
    assert_eq!(m.shards[1].padded_samples, Some(1));

    let p = batch_plan("drop");
    let reports = vec![
        batch_task(0, vec![batch_shard(&p, 0, 0, 2, 0)], 1),
        // A partition whose only rows were the dropped tail.
        batch_task(1, vec![], 1),
    ];
    let m = commit_manifest(&p, &reports).unwrap().manifest;
    assert_eq!(
        (
            m.total_samples,
            ext(&m).padded_samples,
            ext(&m).dropped_samples
        ),
        (2, 0, 2)
    );

    // Padding or dropping reported under another strategy is a bad report.
    let p = batch_plan("write");
    let e =
        commit_manifest(&p, &[batch_task(0, vec![batch_shard(&p, 0, 0, 1, 1)], 0)]).unwrap_err();
    assert!(
        e.to_string().contains("padding without tail_strategy=pad"),
        "{e}"
    );
    let e = commit_manifest(&p, &[batch_task(0, vec![], 3)]).unwrap_err();
    assert!(e.to_string().contains("dropped samples"), "{e}");
}

#[test]
fn conflicting_shapes_across_tasks_name_partitions() {
    let p = batch_plan("write");
    let mut t3 = batch_task(3, vec![batch_shard(&p, 3, 0, 2, 0)], 0);
    t3.columns
        .insert("x".into(), col(Dtype::F32, Some(vec![4])));
    let reports = vec![batch_task(1, vec![batch_shard(&p, 1, 0, 2, 0)], 0), t3];
    let e = commit_manifest(&p, &reports).unwrap_err();
    assert_eq!(
        e.to_string(),
        "column 'x': partition 1 wrote sample shape [3] but partition 3 wrote [4]; every row of a column must have the same sample shape"
    );
    // A dtype the plan did not ask for is a bad report.
    let mut t = batch_task(0, vec![batch_shard(&p, 0, 0, 2, 0)], 0);
    t.columns.insert("y".into(), col(Dtype::I32, Some(vec![2])));
    let e = commit_manifest(&p, &[t]).unwrap_err();
    assert!(
        e.to_string()
            .contains("column 'y' was planned as I64 but written as I32"),
        "{e}"
    );
}

#[test]
fn tensor_struct_dtype_conflict_across_tasks() {
    let schema = r#"{"type":"struct","fields":[{"name":"t","type":{"type":"struct","fields":[
        {"name":"data","type":"binary","nullable":true,"metadata":{}},
        {"name":"shape","type":{"type":"array","elementType":"integer","containsNull":true},"nullable":true,"metadata":{}},
        {"name":"dtype","type":"string","nullable":true,"metadata":{}}]},"nullable":true,"metadata":{}}]}"#;
    let p = plan_write(schema, &opts(&[("batch_size", "1")]), false).unwrap();
    assert_eq!(p.columns[0].input, InputKind::TensorStruct);
    let task = |partition: u32, dtype: Dtype| {
        let mut s = batch_shard(&p, partition, 0, 1, 0);
        s.tensors.truncate(1);
        s.tensors[0].name = "t".into();
        TaskReport {
            partition,
            shards: vec![s],
            dropped_samples: 0,
            columns: BTreeMap::from([("t".into(), col(dtype, Some(vec![2])))]),
        }
    };
    let e = commit_manifest(&p, &[task(0, Dtype::F16), task(2, Dtype::Bf16)]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "column 't': partition 0 wrote dtype F16 but partition 2 wrote BF16; every row of a column must have the same dtype"
    );
    let m = commit_manifest(&p, &[task(0, Dtype::F16), task(2, Dtype::F16)])
        .unwrap()
        .manifest;
    assert_eq!(m.schema.get("t").unwrap().dtype, Dtype::F16);
}

#[test]
fn bad_reports() {
    let p = batch_plan("write");
    let mut wrong_name = batch_shard(&p, 0, 0, 2, 0);
    wrong_name.file = "part-00000-0000-x.safetensors".into();
    let e = commit_manifest(&p, &[batch_task(0, vec![wrong_name], 0)]).unwrap_err();
    assert!(
        e.to_string().contains("should be named part-00000-0000-"),
        "{e}"
    );
    let e = commit_manifest(&p, &[batch_task(0, vec![], 0), batch_task(0, vec![], 0)]).unwrap_err();
    assert!(
        e.to_string().contains("two reports for the same partition"),
        "{e}"
    );
    let mut missing_col = batch_task(0, vec![batch_shard(&p, 0, 0, 2, 0)], 0);
    missing_col.columns.remove("y");
    let e = commit_manifest(&p, &[missing_col]).unwrap_err();
    assert!(
        e.to_string().contains("reports nothing for column 'y'"),
        "{e}"
    );
}

#[test]
fn kv_manifest_shapes_and_counts() {
    let p = kv_plan("fail");
    let reports = vec![
        kv_task(
            0,
            vec![kv_shard(&p, 0, 0, &["a", "b"]), kv_shard(&p, 0, 1, &["c"])],
            Some(vec![2]),
        ),
        kv_task(1, vec![kv_shard(&p, 1, 0, &["d"])], Some(vec![5])),
    ];
    let c = commit_manifest(&p, &reports).unwrap();
    let m = &c.manifest;
    assert_eq!(m.mode(), Some(DatasetMode::Kv));
    assert_eq!((ext(m).batch_size, ext(m).tail_strategy), (None, None));
    assert_eq!(ext(m).kv_separator.as_deref(), Some("__"));
    assert_eq!(m.total_samples, 4);
    assert_eq!(m.schema.get("x").unwrap().shape, None);
    assert_eq!(m.schema.get("y").unwrap().shape, Some(vec![2]));
    assert_eq!(m.shards[0].num_tensors, Some(4));
    // KV dtypes must still agree.
    let mut bad = kv_task(1, vec![kv_shard(&p, 1, 0, &["d"])], None);
    bad.columns.insert("y".into(), col(Dtype::I32, None));
    let p2 = {
        let mut p2 = p.clone();
        p2.columns[1].dtype = None;
        p2
    };
    let e = commit_manifest(&p2, &[reports[0].clone(), bad]).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("column 'y': partition 0 wrote dtype I64 but partition 1 wrote I32"),
        "{e}"
    );
}

#[test]
fn kv_duplicate_across_tasks_fails_naming_key_and_files() {
    let p = kv_plan("fail");
    let reports = vec![
        kv_task(0, vec![kv_shard(&p, 0, 0, &["a", "dup"])], Some(vec![2])),
        kv_task(
            4,
            vec![kv_shard(&p, 4, 0, &["b"]), kv_shard(&p, 4, 1, &["dup"])],
            Some(vec![2]),
        ),
    ];
    let e = commit_manifest(&p, &reports).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "key 'dup' occurs more than once in this write (in shards {} and {}); duplicatesStrategy=fail (set duplicatesStrategy=lastWin to keep the last row)",
            shard_file_name(0, 0, &p.write_id),
            shard_file_name(4, 1, &p.write_id)
        )
    );
    // Within one task across shards too.
    let reports = vec![kv_task(
        0,
        vec![kv_shard(&p, 0, 0, &["a"]), kv_shard(&p, 0, 1, &["a"])],
        Some(vec![2]),
    )];
    assert!(matches!(
        commit_manifest(&p, &reports),
        Err(CommitError::DuplicateKey { ref key, .. }) if key == "a"
    ));
}

#[test]
fn kv_last_win_rewrite_list() {
    let p = kv_plan("lastwin");
    let reports = vec![
        kv_task(2, vec![kv_shard(&p, 2, 0, &["a", "z"])], Some(vec![2])),
        kv_task(
            0,
            vec![kv_shard(&p, 0, 0, &["a", "b"]), kv_shard(&p, 0, 1, &["c"])],
            Some(vec![2]),
        ),
        kv_task(1, vec![kv_shard(&p, 1, 0, &["c", "a"])], Some(vec![2])),
    ];
    let c = commit_manifest(&p, &reports).unwrap();
    let f = |part, shard| shard_file_name(part, shard, &p.write_id);
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(
        c.rewrites,
        vec![
            ShardRewrite {
                file: f(0, 0),
                partition: 0,
                shard: 0,
                drop_tensors: set(&["a__x", "a__y"]),
                drop_keys: set(&["a"]),
                samples_after: 1,
                delete: false,
            },
            ShardRewrite {
                file: f(0, 1),
                partition: 0,
                shard: 1,
                drop_tensors: set(&["c__x", "c__y"]),
                drop_keys: set(&["c"]),
                samples_after: 0,
                delete: true,
            },
            ShardRewrite {
                file: f(1, 0),
                partition: 1,
                shard: 0,
                drop_tensors: set(&["a__x", "a__y"]),
                drop_keys: set(&["a"]),
                samples_after: 1,
                delete: false,
            },
        ]
    );
    let m = &c.manifest;
    // Distinct keys a, b, c, z.
    assert_eq!(m.total_samples, 4);
    assert_eq!(
        m.shards
            .iter()
            .map(|s| (
                s.shard_path.clone(),
                s.samples_count,
                s.num_tensors.unwrap()
            ))
            .collect::<Vec<_>>(),
        [(f(0, 0), 1, 2), (f(1, 0), 1, 2), (f(2, 0), 2, 4)]
    );
    assert_eq!(c.shards.len(), 3);
    assert!(c.shards[0]
        .tensors
        .iter()
        .all(|t| t.sample_key.as_deref() == Some("b")));
}

#[test]
fn kv_tensor_name_collision_across_tasks() {
    let p = kv_plan("fail");
    let mut s0 = kv_shard(&p, 0, 0, &["a__b"]);
    s0.tensors.truncate(1); // a__b__x
    let mut s1 = kv_shard(&p, 1, 0, &["a"]);
    s1.tensors[0].name = "a__b__x".into();
    let mut t0 = kv_task(0, vec![s0], Some(vec![2]));
    t0.shards[0].tensors[0].column = Some("x".into());
    let reports = vec![t0, kv_task(1, vec![s1], Some(vec![2]))];
    let e = commit_manifest(&p, &reports).unwrap_err();
    assert!(
        matches!(e, CommitError::TensorNameCollision { ref name, .. } if name == "a__b__x"),
        "{e}"
    );
}

static N: AtomicU64 = AtomicU64::new(0);

fn tempdir() -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "st-manifest-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write_kv_file(path: &Path, keys: &[&str]) {
    let mut meta = BTreeMap::from([
        (
            "safetensors_spark.samples".to_string(),
            keys.len().to_string(),
        ),
        ("safetensors_spark.layout".to_string(), "kv".to_string()),
        ("user".to_string(), "kept".to_string()),
    ]);
    meta.insert("safetensors_spark.kv_separator".into(), "__".into());
    let mut owned: Vec<(TensorEntry, Vec<u8>)> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        owned.push((
            TensorEntry {
                name: format!("{k}__x"),
                dtype: Dtype::F32,
                shape: vec![2],
            },
            vec![i as u8; 8],
        ));
        owned.push((
            TensorEntry {
                name: format!("{k}__y"),
                dtype: Dtype::I64,
                shape: vec![1],
            },
            vec![100 + i as u8; 8],
        ));
    }
    let refs: Vec<(TensorEntry, &[u8])> = owned
        .iter()
        .map(|(e, d)| (e.clone(), d.as_slice()))
        .collect();
    write_file(path, Some(&meta), &refs).unwrap();
}

#[test]
fn rewrite_shard_without_keeps_the_rest() {
    let dir = tempdir();
    let input = dir.join("in.safetensors");
    write_kv_file(&input, &["a", "b", "c"]);
    let output = dir.join("out.safetensors");
    let drop: HashSet<String> = ["b__x".to_string(), "b__y".to_string()].into();
    let r = rewrite_shard_without(&input, &output, &drop, 2).unwrap();
    let f = SafetensorsFile::open(&output).unwrap();
    let names: Vec<&str> = f.header().tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names.len(), 4);
    assert!(!names.contains(&"b__x") && !names.contains(&"b__y"));
    assert_eq!(f.tensor("a__x").unwrap().1, &[0u8; 8]);
    assert_eq!(f.tensor("c__y").unwrap().1, &[102u8; 8]);
    let meta = f.header().metadata.clone().unwrap();
    assert_eq!(meta["safetensors_spark.samples"], "2");
    assert_eq!(meta["user"], "kept");
    assert_eq!(meta["safetensors_spark.layout"], "kv");
    assert_eq!(r.bytes, std::fs::metadata(&output).unwrap().len());
    assert_eq!(r.file, "out.safetensors");
    assert_eq!(r.samples, 2);
    let bytes = std::fs::read(&output).unwrap();
    for t in &r.tensors {
        let (_, data) = f.tensor(&t.name).unwrap();
        assert_eq!(&bytes[t.data_start as usize..t.data_end as usize], data);
    }
    // In place, and errors.
    let drop_a: HashSet<String> = ["a__x".to_string(), "a__y".to_string()].into();
    rewrite_shard_without(&output, &output, &drop_a, 1).unwrap();
    assert_eq!(
        SafetensorsFile::open(&output)
            .unwrap()
            .header()
            .tensors
            .len(),
        2
    );
    let missing: HashSet<String> = ["nope".to_string()].into();
    assert!(matches!(
        rewrite_shard_without(&output, &output, &missing, 1),
        Err(CommitError::Format(FormatError::TensorNotFound { .. }))
    ));
    let all: HashSet<String> = ["c__x".to_string(), "c__y".to_string()].into();
    assert!(matches!(
        rewrite_shard_without(&output, &output, &all, 0),
        Err(CommitError::Rewrite { .. })
    ));
    // Only the two files: no temporaries left.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn last_win_end_to_end_with_files() {
    let p = kv_plan("lastWin");
    let dir = tempdir();
    let shard = |part: u32, keys: &[&str]| {
        let mut s = kv_shard(&p, part, 0, keys);
        let path = dir.join(&s.file);
        write_kv_file(&path, keys);
        s.bytes = std::fs::metadata(&path).unwrap().len();
        s
    };
    let reports = vec![
        kv_task(0, vec![shard(0, &["a", "b"])], Some(vec![2])),
        kv_task(1, vec![shard(1, &["b"])], Some(vec![2])),
    ];
    let mut c = commit_manifest(&p, &reports).unwrap();
    assert_eq!(c.rewrites.len(), 1);
    let rw = c.rewrites[0].clone();
    let path = dir.join(&rw.file);
    let done = rw.apply(&path, &path).unwrap();
    c.apply_rewrite(&done).unwrap();
    let m = &c.manifest;
    assert_eq!(m.shards[0].bytes, std::fs::metadata(&path).unwrap().len());
    assert_eq!(m.total_bytes, m.shards.iter().map(|s| s.bytes).sum::<u64>());
    m.validate().unwrap();
    let f = SafetensorsFile::open(&path).unwrap();
    let a_x = c.shards[0]
        .tensors
        .iter()
        .find(|t| t.name == "a__x")
        .unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(
        &bytes[a_x.data_start as usize..a_x.data_end as usize],
        f.tensor("a__x").unwrap().1
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn append_merge() {
    let p = batch_plan("drop");
    let first = commit_manifest(&p, &[batch_task(0, vec![batch_shard(&p, 0, 0, 2, 0)], 1)])
        .unwrap()
        .manifest;
    let first = next_manifest(None, &first, true, &[]).unwrap();
    assert_eq!(ext(&first).manifest_version, 1);
    let mut p2 = batch_plan("drop");
    p2.write_id = "00000000-0000-4000-8000-000000000000".into();
    let write2 = commit_manifest(
        &p2,
        &[batch_task(
            0,
            vec![batch_shard(&p2, 0, 0, 2, 0), batch_shard(&p2, 0, 1, 2, 0)],
            1,
        )],
    )
    .unwrap()
    .manifest;
    let second = next_manifest(Some(&first), &write2, true, &[]).unwrap();
    assert_eq!(ext(&second).manifest_version, 2);
    assert_eq!(second.shards.len(), 3);
    assert_eq!(second.total_samples, 6);
    assert_eq!(ext(&second).dropped_samples, 2);
    assert_eq!(
        second.total_bytes,
        second.shards.iter().map(|s| s.bytes).sum::<u64>()
    );
    assert_eq!(
        second.shards[0].shard_path,
        shard_file_name(0, 0, &p2.write_id)
    );
    second.validate().unwrap();
    // The same write as an overwrite: only its shards, the next version, the old ones superseded.
    let replaced = next_manifest(Some(&first), &write2, false, &[]).unwrap();
    assert_eq!(replaced.shards.len(), 2);
    assert_eq!(ext(&replaced).manifest_version, 2);
    assert_eq!(
        safetensors_spark_dataset::manifest::superseded_shards(&first, &replaced),
        [first.shards[0].shard_path.as_str()]
    );
    // Appending nothing keeps everything.
    let mut p3 = batch_plan("drop");
    p3.write_id = "ffffffff-0000-4000-8000-000000000000".into();
    let nothing = commit_manifest(&p3, &[]).unwrap().manifest;
    let third = next_manifest(Some(&second), &nothing, true, &[]).unwrap();
    assert_eq!((third.shards.len(), third.total_samples), (3, 6));
    assert_eq!(third.schema, second.schema);

    // Disagreements fail.
    let mut bad = batch_task(0, vec![batch_shard(&p3, 0, 0, 2, 0)], 0);
    bad.columns
        .insert("x".into(), col(Dtype::F32, Some(vec![7])));
    let bad = commit_manifest(&p3, &[bad]).unwrap().manifest;
    let e = next_manifest(Some(&second), &bad, true, &[]).unwrap_err();
    assert!(
        e.to_string()
            .contains("column 'x' has shape [2, 3], this write has [2, 7]"),
        "{e}"
    );
    let pw = batch_plan("write");
    let e = next_manifest(
        Some(&second),
        &commit_manifest(&pw, &[]).unwrap().manifest,
        true,
        &[],
    )
    .unwrap_err();
    assert!(matches!(e, DatasetError::AppendMismatch { .. }));
    assert!(e.to_string().contains("tail_strategy=drop, this write is in batch mode with batch_size=2 and tail_strategy=write"), "{e}");
    let again = commit_manifest(&p, &[batch_task(0, vec![batch_shard(&p, 0, 0, 2, 0)], 0)])
        .unwrap()
        .manifest;
    let e = next_manifest(Some(&second), &again, true, &[]).unwrap_err();
    assert!(e.to_string().contains("is already in the dataset"), "{e}");

    // KV: differing common shapes become null.
    let k1 = kv_plan("fail");
    let m1 = commit_manifest(
        &k1,
        &[kv_task(0, vec![kv_shard(&k1, 0, 0, &["a"])], Some(vec![2]))],
    )
    .unwrap()
    .manifest;
    let mut k2 = kv_plan("fail");
    k2.write_id = "00000000-0000-4000-8000-000000000000".into();
    let w2 = commit_manifest(
        &k2,
        &[kv_task(0, vec![kv_shard(&k2, 0, 0, &["b"])], Some(vec![5]))],
    )
    .unwrap()
    .manifest;
    let m2 = next_manifest(Some(&m1), &w2, true, &[]).unwrap();
    assert_eq!(m2.schema.get("x").unwrap().shape, None);
    assert_eq!(m2.schema.get("y").unwrap().shape, Some(vec![2]));
    assert_eq!(m2.total_samples, 2);
}

/// A manifest as another writer of the published dataset format produces it: only the published fields.
const PUBLISHED_ONLY: &str = r#"{
  "format_version" : "1.0",
  "safetensors_version" : "1.0",
  "total_samples" : 6,
  "total_bytes" : 300,
  "shards" : [ {
    "shard_path" : "part-00000-0000-550e8400-e29b-41d4-a716-446655440000.safetensors",
    "samples_count" : 4,
    "bytes" : 200
  }, {
    "shard_path" : "part-00001-0000-550e8400-e29b-41d4-a716-446655440000.safetensors",
    "samples_count" : 2,
    "bytes" : 100
  } ],
  "schema" : {
    "x" : { "dtype" : "F32", "shape" : [ 4, 3 ] }
  },
  "producer_note" : "other properties are allowed"
}"#;

#[test]
fn published_only_manifests_parse_and_cannot_be_appended_to() {
    let m = parse_manifest(PUBLISHED_ONLY).unwrap();
    assert!(m.ext.is_none());
    assert_eq!(m.mode(), None);
    assert_eq!(m.manifest_version(), 0);
    assert_eq!(m.shards[1].samples_count, 2);
    assert_eq!(m.sample_shape("x"), Some(vec![4, 3]));
    // An overwrite replaces it (version 1), an append is refused.
    let p = batch_plan("write");
    let w = commit_manifest(&p, &[batch_task(0, vec![batch_shard(&p, 0, 0, 2, 0)], 0)])
        .unwrap()
        .manifest;
    let next = next_manifest(Some(&m), &w, false, &[]).unwrap();
    assert_eq!(ext(&next).manifest_version, 1);
    assert_eq!(
        safetensors_spark_dataset::manifest::superseded_shards(&m, &next).len(),
        2
    );
    let e = next_manifest(Some(&m), &w, true, &[]).unwrap_err();
    assert!(e.to_string().contains("only the published fields"), "{e}");
    // The published field rules still hold.
    let broken = PUBLISHED_ONLY.replace("\"total_samples\" : 6", "\"total_samples\" : 7");
    assert!(parse_manifest(&broken)
        .unwrap_err()
        .to_string()
        .contains("total_samples is 7"));
    let missing = PUBLISHED_ONLY.replace("\"samples_count\" : 2,", "");
    assert!(parse_manifest(&missing).is_err());
}

#[test]
fn zero_shards() {
    for p in [batch_plan("write"), kv_plan("fail")] {
        let m = commit_manifest(&p, &[]).unwrap().manifest;
        assert!(m.shards.is_empty() && m.schema.is_empty());
        assert_eq!((m.total_samples, m.total_bytes), (0, 0));
        let json = m.to_json_pretty().unwrap();
        assert!(json.contains("\"schema\": {}"));
        assert!(json.contains("\"shards\": []"));
        assert_eq!(parse_manifest(&json).unwrap(), m);
    }
    // Everything dropped: columns were seen but nothing is stored.
    let p = batch_plan("drop");
    let m = commit_manifest(&p, &[batch_task(0, vec![], 1)])
        .unwrap()
        .manifest;
    assert!(m.schema.is_empty());
    assert_eq!(ext(&m).dropped_samples, 1);
}

#[test]
fn parse_manifest_rejects() {
    let p = batch_plan("write");
    let m = commit_manifest(&p, &[batch_task(0, vec![batch_shard(&p, 0, 0, 2, 0)], 0)])
        .unwrap()
        .manifest;
    let good: serde_json::Value = serde_json::from_str(&m.to_json_pretty().unwrap()).unwrap();
    let with = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = good.clone();
        f(&mut v);
        parse_manifest(&v.to_string())
    };
    with(&|_| ()).unwrap();
    assert!(matches!(
        with(&|v| v["format_version"] = 1.into()),
        Err(DatasetError::UnsupportedVersion { ref found }) if found == "1"
    ));
    assert!(matches!(
        with(&|v| v["format_version"] = "2.0".into()),
        Err(DatasetError::UnsupportedVersion { .. })
    ));
    for (what, f) in [
        (
            "missing null field",
            &(|v: &mut serde_json::Value| {
                v.as_object_mut().unwrap().remove("kv_separator");
            }) as &dyn Fn(&mut serde_json::Value),
        ),
        ("bad total", &|v| v["total_samples"] = 9.into()),
        ("bad safetensors_version", &|v| {
            v["safetensors_version"] = "2".into()
        }),
        ("bad format", &|v| v["format"] = "x".into()),
        ("version 0", &|v| v["manifest_version"] = 0.into()),
        ("kv field in batch", &|v| v["kv_separator"] = "__".into()),
        ("bad dtype", &|v| v["schema"]["x"]["dtype"] = "C64".into()),
        ("null shape in batch", &|v| {
            v["schema"]["x"]["shape"] = serde_json::Value::Null
        }),
        ("shape without the batch dimension", &|v| {
            v["schema"]["x"]["shape"] = serde_json::json!([3])
        }),
        ("foreign shard name", &|v| {
            v["shards"][0]["shard_path"] = "a.safetensors".into()
        }),
        ("shard partition", &|v| {
            v["shards"][0]["partition"] = 3.into()
        }),
        ("missing num_tensors", &|v| {
            v["shards"][0]
                .as_object_mut()
                .unwrap()
                .remove("num_tensors");
        }),
    ] {
        assert!(with(f).is_err(), "{what}");
    }
    assert!(parse_manifest(r#"{"format_version":"1.0","safetensors_version":"1.0","total_samples":0,"total_bytes":0,"shards":[],"schema":{"a":{"dtype":"F32","shape":[]},"a":{"dtype":"F32","shape":[]}}}"#).is_err());
    assert!(parse_manifest("nope").is_err());
    assert!(parse_manifest("[]").is_err());
}

#[test]
fn tampered_shard_names_are_refused_by_every_manifest_parse() {
    for tampered in [
        "../victim/important.txt",
        "../victim/x.safetensors",
        "/etc/x.safetensors",
        "s3://bucket/x.safetensors",
        "sub/x.safetensors",
        "x\u{0}.safetensors",
    ] {
        let text = PUBLISHED_ONLY.replace(
            "\"part-00001-0000-550e8400-e29b-41d4-a716-446655440000.safetensors\"",
            &serde_json::to_string(tampered).unwrap(),
        );
        let e = parse_manifest(&text).unwrap_err();
        assert!(
            matches!(e, DatasetError::UnsafeShardPath { .. }),
            "{tampered:?}: {e}"
        );
        assert!(e.to_string().contains("is not a shard file name"), "{e}");
    }
}

#[test]
fn shard_file_names_parse() {
    let id = "0123abcd-0000-4000-8000-00000000beef";
    assert_eq!(
        parse_shard_file_name(&shard_file_name(7, 12, id)),
        Some((7, 12, id))
    );
    assert_eq!(
        parse_shard_file_name(&shard_file_name(123456, 12345, id)),
        Some((123456, 12345, id))
    );
    for bad in [
        "part-0007-0012-0123abcd-0000-4000-8000-00000000beef.safetensors",
        "part-00007-0012-0123ABCD-0000-4000-8000-00000000beef.safetensors",
        "part-00007-0012-0123abcd-0000-4000-8000-00000000beef.st",
        "x-00007-0012-0123abcd-0000-4000-8000-00000000beef.safetensors",
    ] {
        assert_eq!(parse_shard_file_name(bad), None, "{bad}");
    }
}

/// An index part of shard `file` holding keys `keys` (column `x`, and `y` for keys ending in
/// `!`): one run of [`merge_key_runs`].
fn run(dir: &Path, file: &str, keys: &[&str], existing: bool, rank: u64) -> KeyRunInput {
    let rows = keys.iter().flat_map(|k| {
        let columns: &[&str] = if k.ends_with('!') {
            &["x", "y"]
        } else {
            &["x"]
        };
        columns.iter().map(move |c| IndexRow {
            tensor_key: format!("{k}__{c}"),
            file_name: file.to_string(),
            dtype: Dtype::F32,
            shape: vec![1],
            data_start: 0,
            data_end: 4,
            sample_key: Some(k.to_string()),
            column: c.to_string(),
        })
    });
    let part = dir.join(format!("{file}.parquet"));
    safetensors_spark_dataset::index::write_index_part(&part, rows.collect::<Vec<_>>()).unwrap();
    KeyRunInput {
        file: file.to_string(),
        part,
        existing,
        rank,
    }
}

#[test]
fn merged_runs_without_shared_names_lose_nothing() {
    let dir = tempdir();
    let runs = vec![
        run(&dir, "a", &["k1", "k3", "k5"], false, 1),
        run(&dir, "b", &["k2", "k4"], false, 2),
        run(&dir, "c", &["k0", "k6!"], true, 0),
    ];
    for d in [DuplicatesStrategy::Fail, DuplicatesStrategy::LastWin] {
        assert!(merge_key_runs(&runs, d).unwrap().is_empty());
    }
    assert!(merge_key_runs(&[], DuplicatesStrategy::Fail)
        .unwrap()
        .is_empty());
}

#[test]
fn merged_runs_find_a_key_twice_in_a_write_and_last_win_drops_the_lower_rank() {
    let dir = tempdir();
    let runs = vec![
        run(&dir, "p0", &["a", "dup!", "z"], false, 1),
        run(&dir, "p1", &["dup!", "m"], false, 5),
        run(&dir, "p2", &["dup!", "m"], false, 3),
    ];
    let e = merge_key_runs(&runs, DuplicatesStrategy::Fail).unwrap_err();
    match e {
        CommitError::DuplicateKey {
            key,
            first_file,
            second_file,
        } => {
            assert_eq!(key, "dup!");
            assert_eq!(second_file, "p1", "the winner is named second");
            assert!(first_file == "p0" || first_file == "p2");
        }
        other => panic!("{other}"),
    }
    let losers = merge_key_runs(&runs, DuplicatesStrategy::LastWin).unwrap();
    assert_eq!(
        losers,
        BTreeMap::from([
            ("p0".to_string(), BTreeSet::from(["dup!".to_string()])),
            (
                "p2".to_string(),
                BTreeSet::from(["dup!".to_string(), "m".to_string()])
            ),
        ])
    );
}

#[test]
fn merged_runs_check_new_keys_against_existing_shards() {
    let dir = tempdir();
    let runs = vec![
        run(&dir, "old", &["k1", "k2"], true, 9),
        run(&dir, "new", &["k2"], false, 0),
    ];
    match merge_key_runs(&runs, DuplicatesStrategy::Fail).unwrap_err() {
        CommitError::KeyInDataset {
            key,
            existing_file,
            new_file,
        } => assert_eq!(
            (key.as_str(), existing_file.as_str(), new_file.as_str()),
            ("k2", "old", "new")
        ),
        other => panic!("{other}"),
    }
    let losers = merge_key_runs(&runs, DuplicatesStrategy::LastWin).unwrap();
    assert_eq!(
        losers,
        BTreeMap::from([("old".to_string(), BTreeSet::from(["k2".to_string()]))])
    );
}

#[test]
fn merged_runs_refuse_colliding_names_whatever_the_strategy() {
    // key `a__b` + column `x` and key `a` + column `b__x` are both `a__b__x`
    let dir = tempdir();
    let a = run(&dir, "s1", &["a__b"], false, 1);
    let rows = vec![IndexRow {
        tensor_key: "a__b__x".into(),
        file_name: "s2".into(),
        dtype: Dtype::F32,
        shape: vec![1],
        data_start: 0,
        data_end: 4,
        sample_key: Some("a".into()),
        column: "b__x".into(),
    }];
    let part = dir.join("s2.parquet");
    safetensors_spark_dataset::index::write_index_part(&part, rows).unwrap();
    let b = KeyRunInput {
        file: "s2".into(),
        part,
        existing: false,
        rank: 2,
    };
    for d in [DuplicatesStrategy::Fail, DuplicatesStrategy::LastWin] {
        match merge_key_runs(&[a.clone(), b.clone()], d).unwrap_err() {
            CommitError::TensorNameCollision { name, .. } => assert_eq!(name, "a__b__x"),
            other => panic!("{other}"),
        }
    }
}

#[test]
fn merged_runs_name_a_missing_or_invalid_part() {
    let dir = tempdir();
    let missing = KeyRunInput {
        file: "gone.safetensors".into(),
        part: dir.join("gone.parquet"),
        existing: true,
        rank: 0,
    };
    let e = merge_key_runs(&[missing], DuplicatesStrategy::Fail).unwrap_err();
    assert!(e.to_string().contains("gone.safetensors"), "{e}");
    std::fs::write(dir.join("junk.parquet"), b"not parquet").unwrap();
    let junk = KeyRunInput {
        file: "junk.safetensors".into(),
        part: dir.join("junk.parquet"),
        existing: false,
        rank: 0,
    };
    let e = merge_key_runs(&[junk], DuplicatesStrategy::Fail).unwrap_err();
    assert!(e.to_string().contains("junk.safetensors"), "{e}");
}

#[test]
fn stream_commits_record_batches_and_refuse_replays() {
    use safetensors_spark_dataset::manifest::{
        next_stream_manifest, stream_batch_committed, StreamBatch,
    };
    let q = "5f0c3a52-8d1e-4b7a-9c39-0a1b2c3d4e5f";
    let batch = |id: u64| StreamBatch {
        query_id: q.into(),
        batch_id: id,
    };
    let write = |id: &str, n: u64| {
        let mut p = batch_plan("drop");
        p.write_id = id.into();
        let tasks = if n == 0 {
            vec![]
        } else {
            vec![batch_task(0, vec![batch_shard(&p, 0, 0, 2, 0)], 0)]
        };
        commit_manifest(&p, &tasks).unwrap().manifest
    };
    // batch 0 onto nothing: the first version, recording batch 0
    assert!(!stream_batch_committed(None, &batch(0)));
    let m1 = next_stream_manifest(
        None,
        &write("00000000-0000-4000-8000-000000000001", 1),
        &[],
        &batch(0),
    )
    .unwrap();
    assert_eq!(ext(&m1).manifest_version, 1);
    assert_eq!(ext(&m1).stream_commits.get(q), Some(&0));
    // it round-trips through the text, and a manifest without streams has no such key
    let text = m1.to_json_pretty().unwrap();
    assert!(text.contains("\"stream_commits\""), "{text}");
    assert_eq!(parse_manifest(&text).unwrap(), m1);
    assert!(!write("00000000-0000-4000-8000-000000000009", 1)
        .to_json_pretty()
        .unwrap()
        .contains("stream_commits"));
    // batch 0 again (a replay) is committed; batch 1 is not
    assert!(stream_batch_committed(Some(&m1), &batch(0)));
    assert!(!stream_batch_committed(Some(&m1), &batch(1)));
    let e = next_stream_manifest(
        Some(&m1),
        &write("00000000-0000-4000-8000-000000000002", 1),
        &[],
        &batch(0),
    )
    .unwrap_err();
    assert!(matches!(e, DatasetError::StreamBatch { .. }), "{e}");
    assert!(
        e.to_string().contains(&format!(
            "streaming write: query {q} already committed batch 0 (the dataset records batch 0)"
        )),
        "{e}"
    );
    // an empty batch 1 still records it; shards stay
    let m2 = next_stream_manifest(
        Some(&m1),
        &write("00000000-0000-4000-8000-000000000003", 0),
        &[],
        &batch(1),
    )
    .unwrap();
    assert_eq!(
        (m2.shards.len(), ext(&m2).stream_commits.get(q)),
        (1, Some(&1))
    );
    // a plain append and an overwrite in between keep the record: batch 1 stays a replay
    let m3 = next_manifest(
        Some(&m2),
        &write("00000000-0000-4000-8000-000000000004", 1),
        true,
        &[],
    )
    .unwrap();
    let m4 = next_manifest(
        Some(&m3),
        &write("00000000-0000-4000-8000-000000000005", 1),
        false,
        &[],
    )
    .unwrap();
    assert_eq!(m4.shards.len(), 1);
    for m in [&m3, &m4] {
        assert!(stream_batch_committed(Some(m), &batch(1)));
        assert!(!stream_batch_committed(Some(m), &batch(2)));
    }
    // another query's batch 0 is not this one's
    let other = StreamBatch {
        query_id: "other_query".into(),
        batch_id: 0,
    };
    assert!(!stream_batch_committed(Some(&m4), &other));
    let m5 = next_stream_manifest(
        Some(&m4),
        &write("00000000-0000-4000-8000-000000000006", 1),
        &[],
        &other,
    )
    .unwrap();
    assert_eq!(ext(&m5).stream_commits.len(), 2);
    // bad query ids: in the argument and in a manifest's text
    let e = next_stream_manifest(
        Some(&m5),
        &write("00000000-0000-4000-8000-000000000007", 1),
        &[],
        &StreamBatch {
            query_id: "a/b".into(),
            batch_id: 3,
        },
    )
    .unwrap_err();
    assert!(matches!(e, DatasetError::StreamBatch { .. }), "{e}");
    assert!(
        e.to_string()
            .starts_with("streaming write: query id \"a/b\""),
        "{e}"
    );
    let bad = m5
        .to_json_pretty()
        .unwrap()
        .replace("\"other_query\"", "\"../x\"");
    let e = parse_manifest(&bad).unwrap_err();
    assert!(
        e.to_string()
            .contains("stream_commits has the query id \"../x\""),
        "{e}"
    );
}
