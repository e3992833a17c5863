use super::local::{delete_keys_dir, delete_rows_dir, DeleteOptions};
use super::*;
use crate::compaction::merge_output;
use crate::compaction::tests::{
    batch_shard, commit, ext, kv_schema, kv_shard, manifest_of, pad_dataset, read_rows, row,
    rows_of, tensors_of, tmp, write_dataset, Row, B,
};
use crate::local::{latest, read_log, vacuum_dir};
use crate::manifest::{stamp_added_versions, Operation};
use std::fs;
use std::path::Path;

fn rows(spec: &[(&str, &[u64])]) -> BTreeMap<String, BTreeSet<u64>> {
    spec.iter()
        .map(|(s, r)| (s.to_string(), r.iter().copied().collect()))
        .collect()
}

fn current(dir: &Path) -> Manifest {
    latest(dir, &read_log(dir).unwrap()).unwrap().unwrap()
}

/// Every byte string of `needle` found in any file under `dir` (recursively).
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let b = fs::read(&p).unwrap();
                if b.windows(needle.len()).any(|w| w == needle) {
                    out.push(p.display().to_string());
                }
            }
        }
    }
    out
}

/// A row's bytes as a shard stores them: its `x` values, then its ragged `tok` values.
fn row_bytes(r: &Row) -> Vec<u8> {
    r.x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[test]
fn batch_delete_recuts_the_kept_rows_of_the_affected_shards_only() {
    let (m, files, _) = pad_dataset();
    let names: Vec<String> = m.shards.iter().map(|s| s.shard_path.clone()).collect();
    // p1 holds rows 5,6,7 (3 real), p2 holds row 8 (1 real): delete p1's row 1 and p2's row 0
    let plan = plan_delete_rows(
        &m,
        &rows(&[(&names[1], &[1]), (&names[2], &[0])]),
        &crate::compaction::tests::uuid_of(91),
    )
    .unwrap();
    assert_eq!(plan.operation, Operation::Delete);
    assert_eq!(plan.replaced, vec![names[1].clone(), names[2].clone()]);
    assert_eq!(plan.rows_removed, 2);
    assert_eq!(plan.rows, 2);
    assert_eq!(plan.outputs.len(), 1);
    assert_eq!(
        plan.outputs[0].inputs,
        vec![
            InputSlice {
                shard: names[1].clone(),
                start: 0,
                end: 1
            },
            InputSlice {
                shard: names[1].clone(),
                start: 2,
                end: 3
            }
        ]
    );
    assert_eq!(
        (plan.outputs[0].samples, plan.outputs[0].padded),
        (2, B - 2)
    );
    let refs: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice()))
        .collect();
    let merged = merge_output(&m, &plan, &plan.outputs[0], &refs).unwrap();
    let (got, padded) = rows_of(&merged.bytes);
    assert_eq!(got, vec![row(5), row(7)]);
    assert_eq!(padded, B - 2);
    let next = crate::compaction::compaction_manifest(
        &m,
        &plan,
        std::slice::from_ref(&merged.entry),
        &crate::manifest::CommitInfo {
            committed_at_ms: 5,
            ..Default::default()
        },
    )
    .unwrap();
    let x = next.ext.as_ref().unwrap();
    assert_eq!(x.operation, Some(Operation::Delete));
    assert_eq!(next.total_samples, m.total_samples - 2);
    // the untouched shards are listed as they were; the new one carries the delete's version
    for n in [&names[0], &names[3]] {
        let a = m.shards.iter().find(|s| &s.shard_path == n).unwrap();
        let b = next.shards.iter().find(|s| &s.shard_path == n).unwrap();
        assert_eq!(a, b);
    }
    let new = next
        .shards
        .iter()
        .find(|s| s.shard_path == merged.entry.shard_path)
        .unwrap();
    assert_eq!(new.added_version, Some(next.manifest_version()));
    // a whole shard deleted: no output reads it
    let plan = plan_delete_rows(
        &m,
        &rows(&[(&names[2], &[0])]),
        &crate::compaction::tests::uuid_of(92),
    )
    .unwrap();
    assert!(plan.outputs.is_empty());
    assert_eq!((plan.rows_removed, plan.replaced.len()), (1, 1));
}

#[test]
fn batch_kept_rows_across_shards_are_cut_at_batch_size_and_drop_keeps_its_tail() {
    let mut files = Vec::new();
    let mut shards = Vec::new();
    for p in 0..3u32 {
        let rs: Vec<Row> = (0..B as u32).map(|i| row(p * 10 + i)).collect();
        let (e, b) = batch_shard(p, &rs, 0);
        files.push((e.shard_path.clone(), b));
        shards.push(e);
    }
    let m = manifest_of(
        ext(DatasetMode::Batch, Some(TailStrategy::Drop), None),
        crate::compaction::tests::batch_schema(),
        shards,
    );
    let names: Vec<String> = m.shards.iter().map(|s| s.shard_path.clone()).collect();
    // one row from each of the three full shards: 9 kept rows = 2 full shards and a tail of 1
    let plan = plan_delete_rows(
        &m,
        &rows(&[(&names[0], &[0]), (&names[1], &[3]), (&names[2], &[2])]),
        &crate::compaction::tests::uuid_of(93),
    )
    .unwrap();
    let sizes: Vec<(u64, u64)> = plan.outputs.iter().map(|o| (o.samples, o.padded)).collect();
    assert_eq!(sizes, vec![(4, 0), (4, 0), (1, 0)]);
    let refs: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice()))
        .collect();
    let got: Vec<Row> = plan
        .outputs
        .iter()
        .flat_map(|o| rows_of(&merge_output(&m, &plan, o, &refs).unwrap().bytes).0)
        .collect();
    let want: Vec<Row> = [1, 2, 3, 10, 11, 12, 20, 21, 23]
        .into_iter()
        .map(row)
        .collect();
    assert_eq!(got, want);
}

#[test]
fn kv_delete_rewrites_only_the_shards_holding_the_keys() {
    let (e0, b0, _) = kv_shard(0, &[1, 2, 3]);
    let (e1, b1, t1) = kv_shard(1, &[4, 5]);
    let (e2, b2, _) = kv_shard(2, &[6]);
    let m = manifest_of(
        ext(DatasetMode::Kv, None, None),
        kv_schema(),
        vec![e0.clone(), e1.clone(), e2.clone()],
    );
    let headers: BTreeMap<String, Header> = [(&e0, &b0), (&e1, &b1), (&e2, &b2)]
        .iter()
        .map(|(e, b)| {
            (
                e.shard_path.clone(),
                safetensors_spark_format::header::parse_file_bytes(b).unwrap(),
            )
        })
        .collect();
    let keys: BTreeSet<String> = ["key2", "key6", "nope"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let plan =
        plan_delete_keys(&m, &headers, &keys, &crate::compaction::tests::uuid_of(91)).unwrap();
    assert_eq!(
        plan.replaced,
        vec![e0.shard_path.clone(), e2.shard_path.clone()]
    );
    assert_eq!(plan.rows_removed, 2);
    assert_eq!(
        plan.deleted_keys,
        vec!["key2".to_string(), "key6".to_string()]
    );
    assert_eq!(
        plan.outputs.len(),
        1,
        "key6's shard held nothing else: dropped"
    );
    let refs: Vec<(&str, &[u8])> = vec![(e0.shard_path.as_str(), b0.as_slice())];
    let merged = merge_output(&m, &plan, &plan.outputs[0], &refs).unwrap();
    let t = tensors_of(&merged.bytes);
    let names: Vec<&str> = t.keys().map(String::as_str).collect();
    assert_eq!(names, ["key1__emb", "key1__id", "key3__emb", "key3__id"]);
    assert_eq!(merged.entry.samples_count, 2);
    // the untouched shard's tensors are where they were
    assert!(t1.iter().all(|(n, _)| !t.contains_key(n)));
}

#[test]
fn kv_delete_given_candidate_headers_only_examines_those_and_refuses_unlisted_ones() {
    let (e0, b0, _) = kv_shard(0, &[1, 2, 3]);
    let (e1, b1, _) = kv_shard(1, &[4, 5]);
    let m = manifest_of(
        ext(DatasetMode::Kv, None, None),
        kv_schema(),
        vec![e0.clone(), e1.clone()],
    );
    let parse = |b: &[u8]| safetensors_spark_format::header::parse_file_bytes(b).unwrap();
    let only_e1: BTreeMap<String, Header> = [(e1.shard_path.clone(), parse(&b1))].into();
    let keys: BTreeSet<String> = ["key2", "key5"].iter().map(|s| s.to_string()).collect();
    let id = crate::compaction::tests::uuid_of(92);
    // the whole-dataset rule wants every header
    let e = plan_delete_keys(&m, &only_e1, &keys, &id)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no header was read") && e.contains(&e0.shard_path),
        "{e}"
    );
    // the candidate rule trusts the caller: key2 (in e0, not given) stays
    let plan = plan_delete_keys_in(&m, &only_e1, &keys, &id).unwrap();
    assert_eq!(plan.replaced, vec![e1.shard_path.clone()]);
    assert_eq!(plan.deleted_keys, vec!["key5".to_string()]);
    assert_eq!(plan.rows_removed, 1);
    assert_eq!(plan.rows, 1);
    // no candidates: nothing to do
    let plan = plan_delete_keys_in(&m, &BTreeMap::new(), &keys, &id).unwrap();
    assert!(plan.replaced.is_empty() && plan.outputs.is_empty());
    // a header of a shard the version does not list (a concurrent commit removed it)
    let (e9, b9, _) = kv_shard(9, &[7]);
    let stray: BTreeMap<String, Header> = [(e9.shard_path.clone(), parse(&b9))].into();
    let e = plan_delete_keys_in(&m, &stray, &keys, &id)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&e9.shard_path) && e.contains("not listed"),
        "{e}"
    );
    // a batch dataset is refused whatever the headers
    let (bm, _, _) = pad_dataset();
    let e = plan_delete_keys_in(&bm, &BTreeMap::new(), &keys, &id)
        .unwrap_err()
        .to_string();
    assert!(e.contains("batch layout"), "{e}");
    drop(b0);
    // the names to look up: every column of every key
    let names = kv_tensor_names(&m, &keys).unwrap();
    assert_eq!(names, ["key2__emb", "key2__id", "key5__emb", "key5__id"]);
    let e = kv_tensor_names(&m, &BTreeSet::new())
        .unwrap_err()
        .to_string();
    assert!(e.contains("empty"), "{e}");
    let e = kv_tensor_names(&bm, &keys).unwrap_err().to_string();
    assert!(e.contains("batch layout"), "{e}");
}

#[test]
fn bad_deletes_are_refused_naming_what_is_wrong() {
    let (m, _, _) = pad_dataset();
    let names: Vec<String> = m.shards.iter().map(|s| s.shard_path.clone()).collect();
    let e = plan_delete_rows(
        &m,
        &rows(&[("part-9-x.safetensors", &[0])]),
        &crate::compaction::tests::uuid_of(91),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("part-9-x.safetensors") && e.contains("not listed"),
        "{e}"
    );
    let e = plan_delete_rows(
        &m,
        &rows(&[(&names[1], &[3])]),
        &crate::compaction::tests::uuid_of(91),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("row 3 of shard") && e.contains("has 3 rows"),
        "{e}"
    );
    let e = plan_delete_keys(
        &m,
        &BTreeMap::new(),
        &BTreeSet::new(),
        &crate::compaction::tests::uuid_of(91),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("batch layout"), "{e}");
    let (e0, _, _) = kv_shard(0, &[1]);
    let kv = manifest_of(ext(DatasetMode::Kv, None, None), kv_schema(), vec![e0]);
    let e = plan_delete_rows(&kv, &rows(&[]), &crate::compaction::tests::uuid_of(91))
        .unwrap_err()
        .to_string();
    assert!(e.contains("KV layout") && e.contains("by key"), "{e}");
    let mut published = m.clone();
    published.ext = None;
    let e = plan_delete_rows(
        &published,
        &rows(&[]),
        &crate::compaction::tests::uuid_of(91),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("another tool"), "{e}");
}

#[test]
fn added_version_is_set_for_new_shards_and_kept_for_old_ones() {
    let (m, _, _) = pad_dataset();
    let mut next = m.clone();
    next.ext.as_mut().unwrap().manifest_version = 2;
    next.shards[0].added_version = None;
    let mut base = m.clone();
    base.shards[1].added_version = Some(1);
    base.shards.remove(0);
    stamp_added_versions(Some(&base), &mut next);
    assert_eq!(
        next.shards[0].added_version,
        Some(2),
        "not in the base: new"
    );
    assert_eq!(next.shards[1].added_version, Some(1), "kept");
    assert_eq!(
        next.shards[2].added_version, None,
        "an old dataset's: unknown"
    );
}

#[test]
fn local_delete_keeps_a_concurrent_append_and_vacuum_leaves_no_byte_of_the_row() {
    let dir = tmp("delete-race");
    let (mut m, files, _) = pad_dataset();
    m.ext.as_mut().unwrap().retention_seconds = Some(0);
    write_dataset(&dir, &m, &files);
    let names: Vec<String> = m.shards.iter().map(|s| s.shard_path.clone()).collect();
    let victim = row(6); // p1's row 1
    assert!(!files_containing(&dir, &row_bytes(&victim)).is_empty());
    let (extra, extra_bytes) = batch_shard(9, &[row(77)], B - 1);
    let out = delete_rows_dir(
        &dir,
        &rows(&[(&names[1], &[1])]),
        &DeleteOptions {
            commit_message: Some("gdpr #12".into()),
            ..Default::default()
        },
        None,
        &mut |_| {
            fs::write(dir.join(&extra.shard_path), &extra_bytes).unwrap();
            let mut v2 = current(&dir);
            v2.shards.push(extra.clone());
            v2.shards.sort_by(|a, b| a.shard_path.cmp(&b.shard_path));
            v2.recompute_totals();
            v2.ext.as_mut().unwrap().manifest_version = 2;
            commit(&dir, &v2);
        },
    )
    .unwrap();
    assert_eq!(
        (out.version, out.committed_on, out.rows_removed),
        (Some(3), Some(2), 1)
    );
    let m3 = current(&dir);
    let x = m3.ext.as_ref().unwrap();
    assert_eq!(x.operation, Some(Operation::Delete));
    assert_eq!(x.commit_message.as_deref(), Some("gdpr #12"));
    assert_eq!(m3.total_samples, m.total_samples + 1 - 1);
    let got = read_rows(&dir);
    assert!(!got.contains(&victim));
    assert!(got.contains(&row(77)) && got.contains(&row(5)) && got.contains(&row(7)));
    // retention 0: the replaced shard went at commit; the log's entries still hold no row data
    assert!(out.replaced_deleted);
    vacuum_dir(
        &dir,
        &crate::vacuum::VacuumRequest {
            retention_seconds: Some(0),
            allow_shorter_retention: false,
            now_ms: crate::local::now_ms() + 1000,
        },
        false,
        &mut |_| {},
        &crate::progress::NoProgress,
    )
    .unwrap();
    assert_eq!(
        files_containing(&dir, &row_bytes(&victim)),
        Vec::<String>::new()
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn local_delete_losing_to_a_concurrent_delete_of_the_same_shard_fails_and_cleans_up() {
    let dir = tmp("delete-conflict");
    let (m, files, _) = pad_dataset();
    write_dataset(&dir, &m, &files);
    let names: Vec<String> = m.shards.iter().map(|s| s.shard_path.clone()).collect();
    let before: Vec<String> = {
        let mut v: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".safetensors"))
            .collect();
        v.sort();
        v
    };
    let e = delete_rows_dir(
        &dir,
        &rows(&[(&names[1], &[0])]),
        &DeleteOptions::default(),
        None,
        &mut |_| {
            // another delete of the same shard commits first
            delete_rows_dir(
                &dir,
                &rows(&[(&names[1], &[2])]),
                &DeleteOptions::default(),
                None,
                &mut |_| {},
            )
            .unwrap();
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("delete planned on version 1")
            && e.contains(&names[1])
            && e.contains("version 2 (delete) removed it"),
        "{e}"
    );
    let m2 = current(&dir);
    assert_eq!(m2.manifest_version(), 2);
    assert_eq!(m2.total_samples, m.total_samples - 1);
    // only the winner's new shard is added; the loser's own shard is gone
    let mut now: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".safetensors"))
        .collect();
    now.sort();
    assert_eq!(now.len(), before.len() + 1);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn local_kv_delete_by_keys_and_a_dry_run_changes_nothing() {
    let dir = tmp("delete-kv");
    let (e0, b0, _) = kv_shard(0, &[1, 2, 3]);
    let (e1, b1, _) = kv_shard(1, &[4]);
    let m = manifest_of(
        ext(DatasetMode::Kv, None, None),
        kv_schema(),
        vec![e0.clone(), e1.clone()],
    );
    write_dataset(
        &dir,
        &m,
        &[(e0.shard_path.clone(), b0), (e1.shard_path.clone(), b1)],
    );
    let keys: BTreeSet<String> = ["key2".to_string()].into();
    let dry = delete_keys_dir(
        &dir,
        &keys,
        &DeleteOptions {
            dry_run: true,
            ..Default::default()
        },
        None,
        &mut |_| {},
    )
    .unwrap();
    assert_eq!((dry.version, dry.rows_removed), (None, 1));
    assert_eq!(current(&dir).manifest_version(), 1);
    let out = delete_keys_dir(&dir, &keys, &DeleteOptions::default(), None, &mut |_| {}).unwrap();
    assert_eq!(out.version, Some(2));
    let m2 = current(&dir);
    assert_eq!(m2.total_samples, 3);
    assert!(m2.shards.iter().any(|s| s.shard_path == e1.shard_path));
    assert!(!m2.shards.iter().any(|s| s.shard_path == e0.shard_path));
    // the default retention keeps the replaced shard for version 1
    assert!(dir.join(&e0.shard_path).exists());
    // nothing to delete: no version
    let none = delete_keys_dir(
        &dir,
        &["zzz".to_string()].into(),
        &DeleteOptions::default(),
        None,
        &mut |_| {},
    )
    .unwrap();
    assert_eq!((none.version, none.rows_removed), (None, 0));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn deleting_every_row_leaves_an_empty_dataset_without_columns() {
    let (m, _, _) = pad_dataset();
    let all: BTreeMap<String, BTreeSet<u64>> = m
        .shards
        .iter()
        .map(|s| (s.shard_path.clone(), (0..s.samples_count).collect()))
        .collect();
    let plan = plan_delete_rows(&m, &all, &crate::compaction::tests::uuid_of(94)).unwrap();
    assert!(plan.outputs.is_empty());
    let next = crate::compaction::compaction_manifest(
        &m,
        &plan,
        &[],
        &crate::manifest::CommitInfo {
            committed_at_ms: 5,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(next.shards.is_empty() && next.schema.is_empty());
    assert_eq!(next.total_samples, 0);
}
