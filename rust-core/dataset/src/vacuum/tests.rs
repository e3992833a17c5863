use super::*;
use crate::local::{read_log, vacuum_dir};
use crate::manifest::parse_manifest;
use crate::names::{manifest_log_file_name, MANIFEST_FILE_NAME, MANIFEST_LOG_DIR};
use std::fs;
use std::path::{Path, PathBuf};

fn shard(i: u32) -> String {
    format!("part-{i:05}-0000-00000000-0000-0000-0000-{i:012}.safetensors")
}

/// A batch manifest of version `v` listing `shards` (4 bytes each), committed at `at`.
fn manifest_json(v: u64, shards: &[u32], at: Option<u64>, retention: Option<u64>) -> String {
    let entries: Vec<String> = shards
        .iter()
        .map(|i| {
            format!(
                r#"{{"shard_path":"{}","samples_count":1,"bytes":4,"partition":{i},"padded_samples":0,"num_tensors":1}}"#,
                shard(*i)
            )
        })
        .collect();
    let schema = if shards.is_empty() {
        "{}".to_string()
    } else {
        r#"{"x":{"dtype":"F32","shape":[1]}}"#.to_string()
    };
    let extra = at.map_or(String::new(), |t| format!(r#","committed_at_ms":{t}"#))
        + &retention.map_or(String::new(), |r| format!(r#","retention_seconds":{r}"#));
    format!(
        r#"{{"format_version":"1.0","safetensors_version":"1.0","total_samples":{n},"total_bytes":{b},"shards":[{s}],"schema":{schema},"format":"safetensors-spark-dataset","created_by":"t","manifest_version":{v},"layout":"batch","batch_size":1,"tail_strategy":"write","kv_separator":null,"padded_samples":0,"dropped_samples":0{extra}}}"#,
        n = shards.len(),
        b = 4 * shards.len(),
        s = entries.join(",")
    )
}

fn logged(v: u64, shards: &[u32], at: u64, retention: Option<u64>) -> LogEntry {
    LogEntry::full(
        parse_manifest(&manifest_json(v, shards, Some(at), retention)).unwrap(),
        0,
    )
}

fn files(shards: &[u32]) -> BTreeMap<String, u64> {
    shards.iter().map(|i| (shard(*i), 4)).collect()
}

fn req(retention: Option<u64>, allow: bool, now_ms: u64) -> VacuumRequest {
    VacuumRequest {
        retention_seconds: retention,
        allow_shorter_retention: allow,
        now_ms,
    }
}

#[test]
fn retention_values() {
    assert_eq!(parse_retention("0"), Some(0));
    assert_eq!(parse_retention("7 days"), Some(604_800));
    assert_eq!(parse_retention(" 1 Hour "), Some(3600));
    assert_eq!(parse_retention("30 minutes"), Some(1800));
    assert_eq!(parse_retention("0 seconds"), Some(0));
    assert_eq!(parse_retention("1 second"), Some(1));
    for bad in [
        "",
        "-1 days",
        "-1",
        "1",
        "1.5 days",
        "+1 days",
        "7days",
        "7 weeks",
        "days",
        "1 day extra",
        "abc",
        "99999999999999999999 seconds",
        "213503982334601 days",
    ] {
        assert_eq!(parse_retention(bad), None, "{bad:?}");
    }
    // the largest count whose milliseconds fit in u64
    assert!(parse_retention("18446744073709551 seconds").is_some());
}

#[test]
fn carried_forward_and_defaulted() {
    let m = parse_manifest(&manifest_json(1, &[1], None, None)).unwrap();
    assert_eq!(retention_seconds(&m), DEFAULT_RETENTION_SECONDS);
    assert!(!deletes_at_commit(Some(&m), &m));
    assert!(!deletes_at_commit(None, &m));
    let zero = parse_manifest(&manifest_json(1, &[1], None, Some(0))).unwrap();
    assert!(deletes_at_commit(Some(&m), &zero));
    // a base of another tool (only the published fields): no log version lists its shards, so
    // no vacuum could delete them later; the commit does
    let mut published = m.clone();
    published.ext = None;
    assert!(deletes_at_commit(Some(&published), &m));
    // a write that does not set it keeps the base's; one that does, its own
    let next = crate::manifest::next_manifest(Some(&zero), &m, false, &[]).unwrap();
    assert_eq!(next.ext.as_ref().unwrap().retention_seconds, Some(0));
    let sixty = parse_manifest(&manifest_json(1, &[2], None, Some(60))).unwrap();
    let next = crate::manifest::next_manifest(Some(&zero), &sixty, true, &[]).unwrap();
    assert_eq!(next.ext.as_ref().unwrap().retention_seconds, Some(60));
    // and it is written out
    assert!(next
        .to_json_pretty()
        .unwrap()
        .contains("\"retention_seconds\": 60"));
}

#[test]
fn plan_keeps_what_a_retained_version_lists() {
    // v1 {1}; v2 overwrite {2} at 1000 s; v3 append {2,3} at 2000 s; now 10000 s
    let log = [
        logged(1, &[1], 500_000, Some(0)),
        logged(2, &[2], 1_000_000, Some(0)),
        logged(3, &[2, 3], 2_000_000, Some(0)),
    ];
    let dir = files(&[1, 2, 3, 9]);
    let idx: BTreeMap<String, u64> = [(shard(1).replace(".safetensors", ".parquet"), 7)].into();
    let p = plan_vacuum(
        &log,
        &[],
        &[],
        &log[2].manifest,
        &dir,
        &idx,
        &req(None, false, 10_000_000),
    )
    .unwrap();
    assert_eq!(p.base_version, 3);
    assert_eq!(p.retained_versions, vec![3]);
    assert_eq!(
        p.shards,
        vec![VacuumFile {
            name: shard(1),
            bytes: 4
        }]
    );
    assert_eq!(p.index_parts.len(), 1);
    assert_eq!(p.prune_versions, vec![1, 2]);
    assert_eq!(
        p.vacuumed(),
        Vacuumed {
            files: 2,
            bytes: 11
        }
    );
    // 8500 s of retention: v2 was current until 2000 s > 10000-8500: retained; v1 until 1000 s: not
    let p = plan_vacuum(
        &log,
        &[],
        &[],
        &log[2].manifest,
        &dir,
        &idx,
        &req(Some(8500), false, 10_000_000),
    )
    .unwrap();
    assert_eq!(p.retained_versions, vec![2, 3]);
    assert_eq!(p.prune_versions, vec![1]);
    assert_eq!(p.shards.len(), 1);
    // 9500 s: v1 retained too, nothing deleted
    let p = plan_vacuum(
        &log,
        &[],
        &[],
        &log[2].manifest,
        &dir,
        &idx,
        &req(Some(9500), false, 10_000_000),
    )
    .unwrap();
    assert!(p.shards.is_empty() && p.prune_versions.is_empty());
    // a listed shard no longer on disk is not counted
    let p = plan_vacuum(
        &log,
        &[],
        &[],
        &log[2].manifest,
        &files(&[2, 3]),
        &idx,
        &req(None, false, 10_000_000),
    )
    .unwrap();
    assert!(p.shards.is_empty());
}

#[test]
fn shorter_retention_needs_the_override() {
    let log = [logged(1, &[1], 1, None), logged(2, &[2], 2, None)];
    let e = plan_vacuum(
        &log,
        &[],
        &[],
        &log[1].manifest,
        &files(&[1, 2]),
        &BTreeMap::new(),
        &req(Some(0), false, 3),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("retention 0 s is shorter than the dataset's retention 604800 s"),
        "{e}"
    );
    assert!(e.contains("allow_shorter_retention"), "{e}");
    let p = plan_vacuum(
        &log,
        &[],
        &[],
        &log[1].manifest,
        &files(&[1, 2]),
        &BTreeMap::new(),
        &req(Some(0), true, 3),
    )
    .unwrap();
    assert_eq!(p.shards.len(), 1);
}

#[test]
fn published_only_manifest_is_refused() {
    let m = parse_manifest(
        r#"{"format_version":"1.0","safetensors_version":"1.0","total_samples":0,"total_bytes":0,"shards":[]}"#,
    )
    .unwrap();
    let e = plan_vacuum(
        &[],
        &[],
        &[],
        &m,
        &BTreeMap::new(),
        &BTreeMap::new(),
        &req(None, false, 0),
    )
    .unwrap_err();
    assert!(e.to_string().contains("published fields"), "{e}");
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vacuum-test-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(d.join(MANIFEST_LOG_DIR)).unwrap();
    fs::create_dir_all(d.join(crate::names::INDEX_DIR_NAME)).unwrap();
    d
}

fn commit(dir: &Path, v: u64, shards: &[u32], at: u64) {
    let text = manifest_json(v, shards, Some(at), Some(0));
    fs::write(
        dir.join(MANIFEST_LOG_DIR).join(manifest_log_file_name(v)),
        &text,
    )
    .unwrap();
    fs::write(dir.join(MANIFEST_FILE_NAME), &text).unwrap();
    for i in shards {
        fs::write(dir.join(shard(*i)), b"abcd").unwrap();
    }
}

/// Every file under `dir` with its bytes.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(p.clone(), fs::read(&p).unwrap());
            }
        }
    }
    out
}

fn dataset(name: &str) -> PathBuf {
    let d = tempdir(name);
    commit(&d, 1, &[1], 1_000);
    commit(&d, 2, &[2], 2_000);
    commit(&d, 3, &[2, 3], 3_000);
    fs::write(
        d.join(crate::names::INDEX_DIR_NAME)
            .join(shard(1).replace(".safetensors", ".parquet")),
        b"p",
    )
    .unwrap();
    // a foreign file, and an in-flight writer's shard no version lists yet
    fs::write(d.join("notes.safetensors"), b"mine").unwrap();
    fs::write(d.join(shard(7)), b"inflight").unwrap();
    d
}

#[test]
fn local_vacuum_deletes_only_superseded_listed_shards_and_commits() {
    let d = dataset("run");
    let counts = crate::progress::Counts::default();
    let out = vacuum_dir(
        &d,
        &req(Some(0), false, now_ms_for_test()),
        false,
        &mut |_| {},
        &counts,
    )
    .unwrap();
    assert_eq!(out.version, Some(4));
    // the observer: a shard and its index part (5 bytes), and log entries 1 and 2, each once
    assert_eq!(counts.totals_and_done(), (4, 5, 4, 5));
    assert_eq!(counts.calls(), (1, 4, 1));
    assert!(!d.join(shard(1)).exists());
    assert!(!d
        .join(crate::names::INDEX_DIR_NAME)
        .join(shard(1).replace(".safetensors", ".parquet"))
        .exists());
    for keep in [
        shard(2),
        shard(3),
        shard(7),
        "notes.safetensors".to_string(),
    ] {
        assert!(d.join(&keep).exists(), "{keep}");
    }
    let versions: Vec<u64> = read_log(&d).unwrap().iter().map(|l| l.version).collect();
    assert_eq!(versions, vec![3, 4]);
    let m = parse_manifest(&fs::read_to_string(d.join(MANIFEST_FILE_NAME)).unwrap()).unwrap();
    let x = m.ext.as_ref().unwrap();
    assert_eq!(
        (x.manifest_version, x.operation),
        (4, Some(crate::manifest::Operation::Vacuum))
    );
    assert_eq!(x.vacuumed, Some(Vacuumed { files: 2, bytes: 5 }));
    assert_eq!(m.shards.len(), 2);
    fs::remove_dir_all(&d).unwrap();
}

fn now_ms_for_test() -> u64 {
    crate::local::now_ms()
}

#[test]
fn dry_run_changes_nothing() {
    let d = dataset("dry");
    let before = tree(&d);
    let counts = crate::progress::Counts::default();
    let out = vacuum_dir(
        &d,
        &req(Some(0), false, now_ms_for_test()),
        true,
        &mut |_| panic!("a dry run executes nothing"),
        &counts,
    )
    .unwrap();
    assert_eq!(counts.calls(), (0, 0, 0), "a dry run reports no progress");
    assert_eq!(out.plan.shards.len(), 1);
    assert_eq!(out.version, None);
    assert_eq!(tree(&d), before);
    fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_writer_committing_between_plan_and_commit_is_kept() {
    let d = dataset("race");
    let out = vacuum_dir(
        &d,
        &req(Some(0), false, now_ms_for_test()),
        false,
        &mut |_| {
            // the in-flight writer commits version 4 (an append of shard 7) after the plan
            commit(&d, 4, &[2, 3, 7], 4_000);
        },
        &crate::progress::NoProgress,
    )
    .unwrap();
    assert_eq!(out.version, Some(5));
    let m = parse_manifest(&fs::read_to_string(d.join(MANIFEST_FILE_NAME)).unwrap()).unwrap();
    let listed: Vec<&str> = m.shards.iter().map(|s| s.shard_path.as_str()).collect();
    assert_eq!(listed, vec![shard(2), shard(3), shard(7)]);
    assert!(listed.iter().all(|s| d.join(s).exists()));
    fs::remove_dir_all(&d).unwrap();
}

/// `validate_dir` (here for this file's dataset builder): each distinct shard is advanced once
/// with the size its manifest records, also when a version's error stops its checks early.
#[test]
fn validation_progress_counts_each_distinct_shard_once() {
    use crate::progress::Counts;
    use crate::versions::validate_dir;
    let d = dataset("validate-progress");
    let counts = Counts::default();
    let checks = validate_dir(&d, &counts).unwrap();
    assert!(checks.iter().all(|c| c.error.is_none()), "{checks:?}");
    // versions 1, 2, 3 list shards 1; 2; 2 and 3: three distinct shards of 4 bytes
    assert_eq!(counts.totals_and_done(), (3, 12, 3, 12));
    assert_eq!(counts.calls(), (1, 3, 1));
    // shard 2 missing: version 2 fails at it, version 3 fails at it before shard 3
    fs::remove_file(d.join(shard(2))).unwrap();
    let counts = Counts::default();
    let checks = validate_dir(&d, &counts).unwrap();
    assert_eq!(checks.iter().filter(|c| c.error.is_some()).count(), 2);
    assert_eq!(counts.totals_and_done(), (3, 12, 3, 12));
    assert_eq!(counts.calls(), (1, 3, 1));
    // not a dataset: an error, and the observer is still finished
    let counts = Counts::default();
    assert!(validate_dir(&d.join("nothing"), &counts).is_err());
    assert_eq!(counts.calls(), (0, 0, 1));
    fs::remove_dir_all(&d).unwrap();
}
