use super::local::{compact_dir, select_datasets, CompactionOptions};
use super::*;
use crate::local::{commit_version, latest, latest_manifest, publish_version, read_log};
use crate::manifest::{
    ColumnMap, ManifestExt, ManifestTensor, RaggedColumn, RaggedElement, MANIFEST_FORMAT,
};
use crate::names::{manifest_log_file_name, MANIFEST_LOG_DIR};
use std::fs;
use std::path::{Path, PathBuf};

pub(crate) const B: u64 = 4;

/// Files by name, with their bytes.
pub(crate) type Files = Vec<(String, Vec<u8>)>;

pub(crate) fn uuid_of(i: u32) -> String {
    format!("00000000-0000-4000-8000-{i:012}")
}

/// One batch row: a fixed F32 [2] column `x` and a ragged I32 column `tok`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Row {
    pub x: [f32; 2],
    pub tok: Vec<i32>,
}

pub(crate) fn row(i: u32) -> Row {
    Row {
        x: [i as f32 + 0.25, -(i as f32)],
        tok: (0..(i % 4)).map(|k| (i * 100 + k) as i32).collect(),
    }
}

pub(crate) fn batch_schema() -> ColumnMap {
    ColumnMap(vec![
        (
            "x".into(),
            ManifestTensor {
                dtype: Dtype::F32,
                shape: Some(vec![B, 2]),
                ragged: None,
            },
        ),
        (
            "tok".into(),
            ManifestTensor {
                dtype: Dtype::I32,
                shape: None,
                ragged: Some(RaggedColumn {
                    inner_shape: vec![],
                    element: RaggedElement::Array,
                }),
            },
        ),
    ])
}

pub(crate) fn ext(
    mode: DatasetMode,
    tail: Option<TailStrategy>,
    retention: Option<u64>,
) -> ManifestExt {
    ManifestExt {
        format: MANIFEST_FORMAT.into(),
        created_by: "test".into(),
        manifest_version: 1,
        mode,
        batch_size: (mode == DatasetMode::Batch).then_some(B),
        tail_strategy: tail,
        kv_separator: (mode == DatasetMode::Kv).then(|| "__".to_string()),
        padded_samples: 0,
        dropped_samples: 0,
        stream_commits: Default::default(),
        committed_at_ms: Some(1),
        operation: Some(Operation::Create),
        commit_message: None,
        app_id: None,
        retention_seconds: retention,
        vacuumed: None,
        checkpoint_interval: None,
    }
}

pub(crate) fn entry(
    name: String,
    partition: u32,
    samples: u64,
    padded: u64,
    bytes: &[u8],
    n: u64,
) -> ManifestShard {
    ManifestShard {
        shard_path: name,
        samples_count: samples,
        bytes: bytes.len() as u64,
        partition: Some(partition),
        padded_samples: Some(padded),
        num_tensors: Some(n),
        crc32c: Some(crc32c_hex(crc32c::crc32c(bytes))),
        added_version: None,
    }
}

/// A batch shard as the writer lays it out (spec/dataset.md §2, §2.1), with user metadata.
pub(crate) fn batch_shard(p: u32, rows: &[Row], padded: u64) -> (ManifestShard, Vec<u8>) {
    let n = rows.len() as u64 + padded;
    let mut x: Vec<u8> = rows
        .iter()
        .flat_map(|r| r.x.iter().flat_map(|v| v.to_le_bytes()))
        .collect();
    x.resize((n * 8) as usize, 0);
    let tok: Vec<u8> = rows
        .iter()
        .flat_map(|r| r.tok.iter().flat_map(|v| v.to_le_bytes()))
        .collect();
    let mut offs = vec![0i64];
    for r in rows {
        offs.push(offs.last().unwrap() + r.tok.len() as i64);
    }
    offs.resize((n + 1) as usize, *offs.last().unwrap());
    let offb: Vec<u8> = offs.iter().flat_map(|v| v.to_le_bytes()).collect();
    let meta = BTreeMap::from([
        (
            "safetensors_spark.format_version".to_string(),
            "1".to_string(),
        ),
        ("safetensors_spark.layout".into(), "batch".into()),
        ("safetensors_spark.write_id".into(), uuid_of(p)),
        ("safetensors_spark.samples".into(), rows.len().to_string()),
        (
            "safetensors_spark.padded_samples".into(),
            padded.to_string(),
        ),
        ("safetensors_spark.ragged".into(), r#"["tok"]"#.into()),
        ("team".into(), "vision".into()),
        ("run".into(), format!("r{p}")),
    ]);
    let t = |name: &str, dtype, shape: Vec<u64>| TensorEntry {
        name: name.into(),
        dtype,
        shape,
    };
    let bytes = serialize(
        Some(&meta),
        &[
            (t("x", Dtype::F32, vec![n, 2]), &x),
            (t("tok", Dtype::I32, vec![(tok.len() / 4) as u64]), &tok),
            (t("tok.offsets", Dtype::I64, vec![n + 1]), &offb),
        ],
    )
    .unwrap();
    let name = shard_file_name(p, 0, &uuid_of(p));
    (entry(name, p, rows.len() as u64, padded, &bytes, 3), bytes)
}

pub(crate) fn manifest_of(
    x: ManifestExt,
    schema: ColumnMap,
    shards: Vec<ManifestShard>,
) -> Manifest {
    let mut m = Manifest::empty(x);
    m.schema = schema;
    m.shards = shards;
    m.shards.sort_by(|a, b| a.shard_path.cmp(&b.shard_path));
    m.recompute_totals();
    m.validate().unwrap();
    m
}

/// The real rows of a batch shard, read back from its bytes alone.
pub(crate) fn rows_of(bytes: &[u8]) -> (Vec<Row>, u64) {
    let h = parse_file_bytes(bytes).unwrap();
    let meta = h.metadata.clone().unwrap();
    let samples: usize = meta["safetensors_spark.samples"].parse().unwrap();
    let padded: u64 = meta["safetensors_spark.padded_samples"].parse().unwrap();
    let get = |n: &str| {
        let t = h.tensor(n).unwrap();
        &bytes[(h.data_start() + t.data_offsets[0]) as usize
            ..(h.data_start() + t.data_offsets[1]) as usize]
    };
    let x: Vec<f32> = get("x")
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let tok: Vec<i32> = get("tok")
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let offs = read_offsets(get("tok.offsets"));
    let rows_total = samples + padded as usize;
    assert_eq!(x.len(), rows_total * 2);
    assert_eq!(offs.len(), rows_total + 1);
    // padding rows: zero bytes, empty ragged rows
    for r in samples..rows_total {
        assert_eq!(&x[r * 2..r * 2 + 2], &[0.0, 0.0]);
        assert_eq!(offs[r], offs[r + 1]);
    }
    let rows = (0..samples)
        .map(|r| Row {
            x: [x[r * 2], x[r * 2 + 1]],
            tok: tok[offs[r] as usize..offs[r + 1] as usize].to_vec(),
        })
        .collect();
    (rows, padded)
}

/// Full shard p=0 (4 rows), then three pad tails (3, 1, 2 real rows), as a partitioned write
/// with `tail_strategy=pad` leaves them.
pub(crate) fn pad_dataset() -> (Manifest, Files, Vec<Row>) {
    let mut all = Vec::new();
    let mut files = Vec::new();
    let mut shards = Vec::new();
    let mut next = 0;
    for (p, real) in [(0u32, 4u64), (1, 3), (2, 1), (3, 2)] {
        let rows: Vec<Row> = (0..real)
            .map(|_| {
                next += 1;
                row(next)
            })
            .collect();
        let (e, b) = batch_shard(p, &rows, B - real);
        if p > 0 {
            all.extend(rows);
        }
        files.push((e.shard_path.clone(), b));
        shards.push(e);
    }
    let m = manifest_of(
        ext(DatasetMode::Batch, Some(TailStrategy::Pad), None),
        batch_schema(),
        shards,
    );
    (m, files, all)
}

fn merge_all(m: &Manifest, plan: &CompactionPlan, files: &[(String, Vec<u8>)]) -> Vec<MergedShard> {
    let refs: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice()))
        .collect();
    // every output also merges from its task slice (what a Spark task is given), through the
    // JSON the JVM passes, to the same shard
    let slices = task_slices(m, plan).unwrap();
    assert_eq!(slices.len(), plan.outputs.len());
    plan.outputs
        .iter()
        .zip(&slices)
        .map(|(o, (sm, sp))| {
            let whole = merge_output(m, plan, o, &refs).unwrap();
            let sm = crate::parse_manifest(&sm.to_json_pretty().unwrap()).unwrap();
            let sp: CompactionPlan =
                serde_json::from_str(&serde_json::to_string(sp).unwrap()).unwrap();
            assert!(sm.shards.len() <= o.inputs.len() && sp.outputs == vec![o.clone()]);
            let sliced = merge_output(&sm, &sp, &sp.outputs[0], &refs).unwrap();
            assert_eq!((&sliced.bytes, &sliced.entry), (&whole.bytes, &whole.entry));
            whole
        })
        .collect()
}

#[test]
fn batch_pad_tails_merge_bit_for_bit_with_ragged_offsets_rebased() {
    let (m, files, small_rows) = pad_dataset();
    let plan = plan_compaction(&m, &CompactionRequest::default(), &uuid_of(99)).unwrap();
    // the full shard is not touched; the three tails are, in manifest order
    assert_eq!(
        plan.replaced,
        files[1..].iter().map(|f| f.0.clone()).collect::<Vec<_>>()
    );
    assert_eq!(plan.rows, 6);
    assert_eq!(
        plan.outputs
            .iter()
            .map(|o| (o.samples, o.padded))
            .collect::<Vec<_>>(),
        vec![(4, 0), (2, 2)]
    );
    let merged = merge_all(&m, &plan, &files);
    let mut got = Vec::new();
    for s in &merged {
        let (rows, padded) = rows_of(&s.bytes);
        assert_eq!(padded, s.entry.padded());
        assert_eq!(rows.len() as u64, s.entry.samples_count);
        assert_eq!(
            s.entry.crc32c.as_deref(),
            Some(crc32c_hex(crc32c::crc32c(&s.bytes)).as_str())
        );
        let meta = parse_file_bytes(&s.bytes).unwrap().metadata.unwrap();
        assert_eq!(meta["safetensors_spark.write_id"], uuid_of(99));
        assert_eq!(meta["safetensors_spark.ragged"], r#"["tok"]"#);
        assert_eq!(
            meta["team"], "vision",
            "metadata every input agrees on is carried"
        );
        // the first output merges two shards whose "run" differs: dropped; the second has one
        assert_eq!(
            meta.contains_key("run"),
            s.entry.samples_count == 2,
            "{meta:?}"
        );
        got.extend(rows);
    }
    // every value of every row, bit for bit, in order
    assert_eq!(got.len(), small_rows.len());
    for (a, b) in got.iter().zip(&small_rows) {
        assert_eq!(a.x.map(f32::to_bits), b.x.map(f32::to_bits));
        assert_eq!(a.tok, b.tok);
    }
    let new: Vec<ManifestShard> = merged.iter().map(|s| s.entry.clone()).collect();
    let info = CommitInfo {
        committed_at_ms: 5,
        commit_message: Some("nightly".into()),
        app_id: None,
    };
    let next = compaction_manifest(&m, &plan, &new, &info).unwrap();
    let x = next.ext.as_ref().unwrap();
    assert_eq!(x.operation, Some(Operation::Compaction));
    assert_eq!(x.manifest_version, 2);
    assert_eq!(x.commit_message.as_deref(), Some("nightly"));
    assert_eq!(next.total_samples, m.total_samples);
    assert_eq!(
        x.padded_samples, 2,
        "padding of the tails dropped, the new tail padded"
    );
    assert_eq!(next.shards.len(), 3);
    assert!(next.shards.iter().any(|s| s.shard_path == files[0].0));
    // a second compaction finds nothing to merge (one tail left)
    let again = plan_compaction(&next, &CompactionRequest::default(), &uuid_of(98)).unwrap();
    assert!(again.outputs.is_empty() && again.replaced.is_empty());
}

#[test]
fn batch_write_tails_cut_at_batch_size_keep_rows_and_order() {
    let mut shards = Vec::new();
    let mut files = Vec::new();
    let mut want = Vec::new();
    let mut next = 0;
    for (p, n) in [(0u32, 3u64), (1, 3), (2, 3), (3, 2)] {
        let rows: Vec<Row> = (0..n)
            .map(|_| {
                next += 1;
                row(next)
            })
            .collect();
        want.extend(rows.clone());
        let (e, b) = batch_shard(p, &rows, 0);
        files.push((e.shard_path.clone(), b));
        shards.push(e);
    }
    let m = manifest_of(
        ext(DatasetMode::Batch, Some(TailStrategy::Write), None),
        batch_schema(),
        shards,
    );
    let plan = plan_compaction(
        &m,
        &CompactionRequest {
            batch_size: Some(B),
            ..Default::default()
        },
        &uuid_of(7),
    )
    .unwrap();
    assert_eq!(
        plan.outputs.iter().map(|o| o.samples).collect::<Vec<_>>(),
        vec![4, 4, 3]
    );
    // an output spans input shards: rows 3..4 of the first output come from the second shard
    assert_eq!(plan.outputs[0].inputs.len(), 2);
    let merged = merge_all(&m, &plan, &files);
    let got: Vec<Row> = merged.iter().flat_map(|s| rows_of(&s.bytes).0).collect();
    assert_eq!(got, want);
    assert!(merged.iter().all(|s| s.entry.padded() == 0));
}

pub(crate) fn kv_shard(p: u32, keys: &[u32]) -> (ManifestShard, Vec<u8>, Files) {
    let mut tensors = Vec::new();
    for k in keys {
        let emb: Vec<u8> = (0..(*k % 3 + 1))
            .flat_map(|i| ((k * 10 + i) as f32).to_le_bytes())
            .collect();
        tensors.push((
            format!("key{k}__emb"),
            Dtype::F32,
            vec![(*k % 3 + 1) as u64],
            emb,
        ));
        tensors.push((
            format!("key{k}__id"),
            Dtype::I64,
            vec![],
            (*k as i64).to_le_bytes().to_vec(),
        ));
    }
    let meta = BTreeMap::from([
        (
            "safetensors_spark.format_version".to_string(),
            "1".to_string(),
        ),
        ("safetensors_spark.layout".into(), "kv".into()),
        ("safetensors_spark.write_id".into(), uuid_of(p)),
        ("safetensors_spark.samples".into(), keys.len().to_string()),
        ("safetensors_spark.padded_samples".into(), "0".into()),
        ("safetensors_spark.kv_separator".into(), "__".into()),
    ]);
    let entries: Vec<(TensorEntry, &[u8])> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                TensorEntry {
                    name: n.clone(),
                    dtype: *d,
                    shape: s.clone(),
                },
                b.as_slice(),
            )
        })
        .collect();
    let bytes = serialize(Some(&meta), &entries).unwrap();
    let name = shard_file_name(p, 0, &uuid_of(p));
    let e = entry(name, p, keys.len() as u64, 0, &bytes, tensors.len() as u64);
    (
        e,
        bytes,
        tensors.into_iter().map(|(n, _, _, b)| (n, b)).collect(),
    )
}

pub(crate) fn kv_schema() -> ColumnMap {
    ColumnMap(vec![
        (
            "emb".into(),
            ManifestTensor {
                dtype: Dtype::F32,
                shape: None,
                ragged: None,
            },
        ),
        (
            "id".into(),
            ManifestTensor {
                dtype: Dtype::I64,
                shape: Some(vec![]),
                ragged: None,
            },
        ),
    ])
}

pub(crate) fn tensors_of(bytes: &[u8]) -> BTreeMap<String, Vec<u8>> {
    let h = parse_file_bytes(bytes).unwrap();
    h.tensors
        .iter()
        .map(|t| {
            let s = (h.data_start() + t.data_offsets[0]) as usize;
            let e = (h.data_start() + t.data_offsets[1]) as usize;
            (t.name.clone(), bytes[s..e].to_vec())
        })
        .collect()
}

#[test]
fn kv_small_shards_packed_whole_with_every_tensor_unchanged() {
    let mut shards = Vec::new();
    let mut files = Vec::new();
    let mut want = BTreeMap::new();
    for (p, keys) in [
        (0u32, vec![1, 2]),
        (1, vec![3]),
        (2, vec![4, 5, 6]),
        (3, (10..20000).collect::<Vec<_>>()),
    ] {
        let (e, b, t) = kv_shard(p, &keys);
        if p < 3 {
            want.extend(t);
        }
        files.push((e.shard_path.clone(), b));
        shards.push(e);
    }
    let m = manifest_of(ext(DatasetMode::Kv, None, None), kv_schema(), shards);
    // 1 MiB: the big shard (20,000 keys, > 1 MiB) stays; the three small ones become one
    assert!(m.shards[3].bytes > 1 << 20);
    let plan = plan_compaction(
        &m,
        &CompactionRequest {
            target_shard_size_mb: Some(1),
            ..Default::default()
        },
        &uuid_of(50),
    )
    .unwrap();
    assert_eq!(plan.replaced.len(), 3);
    assert_eq!(plan.outputs.len(), 1);
    let merged = merge_all(&m, &plan, &files);
    assert_eq!(merged[0].entry.samples_count, 6);
    assert_eq!(tensors_of(&merged[0].bytes), want);
    let rows = index_rows(&m, &merged[0].entry.shard_path, &merged[0].bytes).unwrap();
    assert_eq!(rows.len(), 12);
    let r = rows.iter().find(|r| r.tensor_key == "key5__emb").unwrap();
    assert_eq!(
        (r.sample_key.as_deref(), r.column.as_str()),
        (Some("key5"), "emb")
    );
    assert_eq!(
        &merged[0].bytes[r.data_start as usize..r.data_end as usize],
        want["key5__emb"].as_slice()
    );
    let next = compaction_manifest(
        &m,
        &plan,
        &[merged[0].entry.clone()],
        &CommitInfo::default(),
    )
    .unwrap();
    assert_eq!(next.total_samples, m.total_samples);
    assert_eq!(next.shards.len(), 2);
}

#[test]
fn rebase_keeps_appends_and_fails_naming_the_version_that_removed_a_shard() {
    let (m, files, _) = pad_dataset();
    let plan = plan_compaction(&m, &CompactionRequest::default(), &uuid_of(99)).unwrap();
    let merged: Vec<ManifestShard> = merge_all(&m, &plan, &files)
        .into_iter()
        .map(|s| s.entry)
        .collect();
    // version 2: an append of one more tail
    let (extra, _) = batch_shard(7, &[row(40)], B - 1);
    let mut v2 = m.clone();
    v2.shards.push(extra.clone());
    v2.recompute_totals();
    v2.ext.as_mut().unwrap().manifest_version = 2;
    v2.ext.as_mut().unwrap().operation = Some(Operation::Append);
    let next = compaction_manifest(&v2, &plan, &merged, &CommitInfo::default()).unwrap();
    assert_eq!(next.manifest_version(), 3);
    assert!(
        next.shards.iter().any(|s| s.shard_path == extra.shard_path),
        "the append is kept"
    );
    assert_eq!(next.total_samples, v2.total_samples);
    // version 3: an overwrite drops everything
    let mut v3 = v2.clone();
    v3.shards = vec![extra];
    v3.recompute_totals();
    v3.ext.as_mut().unwrap().manifest_version = 3;
    v3.ext.as_mut().unwrap().operation = Some(Operation::Overwrite);
    let log: Vec<LogEntry> = [(1, &m), (2, &v2), (3, &v3)]
        .into_iter()
        .map(|(v, man)| {
            assert_eq!(v, man.manifest_version());
            LogEntry::full(man.clone(), 0)
        })
        .collect();
    let e = conflict(&plan, &v3, &log).unwrap().to_string();
    assert!(
        e.contains("version 3 (overwrite) removed it") && e.contains(&plan.replaced[0]),
        "{e}"
    );
    assert!(compaction_manifest(&v3, &plan, &merged, &CommitInfo::default()).is_err());
}

#[test]
fn bad_requests_and_changed_inputs_are_refused() {
    let (m, mut files, _) = pad_dataset();
    let bad = |req: CompactionRequest, m: &Manifest| {
        plan_compaction(m, &req, &uuid_of(1))
            .unwrap_err()
            .to_string()
    };
    assert!(bad(
        CompactionRequest {
            batch_size: Some(0),
            ..Default::default()
        },
        &m
    )
    .contains("batch_size is 0"));
    let e = bad(
        CompactionRequest {
            batch_size: Some(8),
            ..Default::default()
        },
        &m,
    );
    assert!(
        e.contains("batch_size is 8, the dataset has batch_size 4"),
        "{e}"
    );
    assert!(bad(
        CompactionRequest {
            target_shard_size_mb: Some(5),
            ..Default::default()
        },
        &m
    )
    .contains("KV datasets"));
    let mut published = m.clone();
    published.ext = None;
    assert!(bad(CompactionRequest::default(), &published).contains("another tool"));
    let kv = manifest_of(
        ext(DatasetMode::Kv, None, None),
        ColumnMap::default(),
        vec![],
    );
    assert!(bad(
        CompactionRequest {
            target_shard_size_mb: Some(0),
            ..Default::default()
        },
        &kv
    )
    .contains("from 1 to 65536"));
    // a shard whose bytes changed since it was listed
    let plan = plan_compaction(&m, &CompactionRequest::default(), &uuid_of(2)).unwrap();
    let last = files[1].1.len() - 1;
    files[1].1[last] ^= 1;
    let refs: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice()))
        .collect();
    let e = merge_output(&m, &plan, &plan.outputs[0], &refs)
        .unwrap_err()
        .to_string();
    assert!(e.contains(&files[1].0) && e.contains("CRC-32C"), "{e}");
}

// ---- the local run: real files, the commit protocol, a forced race

pub(crate) fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cmp-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

pub(crate) fn write_dataset(dir: &Path, m: &Manifest, files: &[(String, Vec<u8>)]) {
    for (n, b) in files {
        fs::write(dir.join(n), b).unwrap();
    }
    commit(dir, m);
}

pub(crate) fn commit(dir: &Path, m: &Manifest) {
    let base = latest_manifest(dir).unwrap();
    assert!(commit_version(dir, base.as_ref(), m, "t").unwrap());
    publish_version(dir, m, "t").unwrap();
}

pub(crate) fn read_rows(dir: &Path) -> Vec<Row> {
    let m = latest(dir, &read_log(dir).unwrap()).unwrap().unwrap();
    m.shards
        .iter()
        .flat_map(|s| rows_of(&fs::read(dir.join(&s.shard_path)).unwrap()).0)
        .collect()
}

#[test]
fn local_compaction_keeps_an_append_committed_during_it() {
    for retention in [Some(0), None] {
        let dir = tmp(&format!("race-{retention:?}"));
        let (mut m, files, _) = pad_dataset();
        m.ext.as_mut().unwrap().retention_seconds = retention;
        write_dataset(&dir, &m, &files);
        let before: Vec<Row> = read_rows(&dir);
        let (extra, extra_bytes) = batch_shard(9, &[row(77), row(78)], B - 2);
        let mut raced = false;
        let out = compact_dir(&dir, &CompactionOptions::default(), None, &mut |_| {
            // another writer appends (its own commit: version 2) while the compaction's
            // shards are written and its version not yet created
            fs::write(dir.join(&extra.shard_path), &extra_bytes).unwrap();
            let mut v2 = latest(&dir, &read_log(&dir).unwrap()).unwrap().unwrap();
            v2.shards.push(extra.clone());
            v2.shards.sort_by(|a, b| a.shard_path.cmp(&b.shard_path));
            v2.recompute_totals();
            v2.ext.as_mut().unwrap().manifest_version = 2;
            commit(&dir, &v2);
            raced = true;
        })
        .unwrap();
        assert!(raced);
        assert_eq!((out.version, out.committed_on), (Some(3), Some(2)));
        let m3 = latest(&dir, &read_log(&dir).unwrap()).unwrap().unwrap();
        assert_eq!(
            m3.ext.as_ref().unwrap().operation,
            Some(Operation::Compaction)
        );
        assert_eq!(m3.total_samples, m.total_samples + 2);
        assert!(m3.shards.iter().any(|s| s.shard_path == extra.shard_path));
        let mut after = read_rows(&dir);
        let mut want = before.clone();
        want.extend([row(77), row(78)]);
        let key = |r: &Row| (r.x.map(f32::to_bits), r.tok.clone());
        after.sort_by_key(key);
        want.sort_by_key(key);
        assert_eq!(after, want);
        // replaced shards: deleted at commit with retention 0, else left for vacuum
        let left = out
            .plan
            .replaced
            .iter()
            .filter(|r| dir.join(r).exists())
            .count();
        assert_eq!(out.replaced_deleted, retention == Some(0));
        assert_eq!(left, if retention == Some(0) { 0 } else { 3 });
        fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn local_compaction_losing_to_an_overwrite_deletes_only_its_own_shards() {
    let dir = tmp("overwrite");
    let (m, files, _) = pad_dataset();
    write_dataset(&dir, &m, &files);
    let mut new_names = Vec::new();
    let e = compact_dir(&dir, &CompactionOptions::default(), None, &mut |plan| {
        new_names = plan.outputs.iter().map(|o| o.name.clone()).collect();
        assert!(new_names.iter().all(|n| dir.join(n).exists()));
        let mut v2 = latest(&dir, &read_log(&dir).unwrap()).unwrap().unwrap();
        v2.shards.truncate(1);
        v2.recompute_totals();
        v2.ext.as_mut().unwrap().manifest_version = 2;
        v2.ext.as_mut().unwrap().operation = Some(Operation::Overwrite);
        commit(&dir, &v2);
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("version 2 (overwrite) removed it"), "{e}");
    assert!(
        new_names.iter().all(|n| !dir.join(n).exists()),
        "its own shards deleted"
    );
    assert!(
        files.iter().all(|(n, _)| dir.join(n).exists()),
        "nothing else deleted"
    );
    assert!(!dir
        .join(MANIFEST_LOG_DIR)
        .join(manifest_log_file_name(3))
        .exists());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn partitions_are_chosen_by_name_and_bad_paths_change_nothing() {
    let root = tmp("parts");
    let (m, files, _) = pad_dataset();
    for p in ["split=train", "split=test%2Fa"] {
        let d = root.join(p);
        fs::create_dir_all(&d).unwrap();
        write_dataset(&d, &m, &files);
    }
    assert_eq!(select_datasets(&root, &[]).unwrap().len(), 2);
    assert_eq!(
        select_datasets(&root, &["split=test/a".into()]).unwrap(),
        vec![root.join("split=test%2Fa")]
    );
    let e = select_datasets(&root, &["split=dev".into()])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no partition split=dev") && e.contains("split=train"),
        "{e}"
    );
    let e = select_datasets(&root, &["lang=en".into()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("'lang' is not a partition column"), "{e}");
    let counts = crate::progress::Counts::default();
    let out = super::local::compact_path(
        &root,
        &["split=train".into()],
        &CompactionOptions::default(),
        None,
        &mut |_| {},
        &counts,
    )
    .unwrap();
    assert_eq!(out.len(), 1);
    // the observer: the new shards, and the bytes of their input shards (a shard feeding two
    // outputs counted for each), each shard advanced once
    let outputs = &out[0].plan.outputs;
    let read: u64 = outputs
        .iter()
        .flat_map(|o| &o.inputs)
        .map(|i| {
            m.shards
                .iter()
                .find(|s| s.shard_path == i.shard)
                .unwrap()
                .bytes
        })
        .sum();
    assert!(!outputs.is_empty() && read > 0);
    let n = outputs.len() as u64;
    assert_eq!(counts.totals_and_done(), (n, read, n, read));
    assert_eq!(counts.calls(), (1, n, 1));
    assert_eq!(
        read_log(&root.join("split=test%2Fa")).unwrap().len(),
        1,
        "the other partition untouched"
    );
    assert_eq!(read_log(&root.join("split=train")).unwrap().len(), 2);
    let e = compact_dir(
        &root.join("nothing"),
        &CompactionOptions::default(),
        None,
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("not a dataset"), "{e}");
    fs::remove_dir_all(&root).unwrap();
}
