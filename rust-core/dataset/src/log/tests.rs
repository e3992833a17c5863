use super::*;
use crate::local::{
    commit_version, latest_manifest, manifest_at, publish_version, read_log, vacuum_dir,
};
use crate::manifest::parse_manifest;
use crate::names::MANIFEST_FILE_NAME;
use crate::vacuum::VacuumRequest;
use std::fs;
use std::path::{Path, PathBuf};

pub(crate) fn shard(i: u64) -> String {
    format!("part-{i:05}-0000-00000000-0000-0000-0000-{i:012}.safetensors")
}

/// A batch manifest of version `v` listing `shards` (1 row, 4 bytes each), committed at `at`.
pub(crate) fn manifest(v: u64, shards: &[u64], at: u64, retention: Option<u64>) -> Manifest {
    let entries: Vec<String> = shards
        .iter()
        .map(|i| {
            format!(
                r#"{{"shard_path":"{}","samples_count":1,"bytes":4,"partition":{i},"padded_samples":0,"num_tensors":1}}"#,
                shard(*i)
            )
        })
        .collect();
    let retention = retention.map_or(String::new(), |r| format!(r#","retention_seconds":{r}"#));
    parse_manifest(&format!(
        r#"{{"format_version":"1.0","safetensors_version":"1.0","total_samples":{n},"total_bytes":{b},"shards":[{s}],"schema":{{"x":{{"dtype":"F32","shape":[1]}}}},"format":"safetensors-spark-dataset","created_by":"t","manifest_version":{v},"layout":"batch","batch_size":1,"tail_strategy":"write","kv_separator":null,"padded_samples":0,"dropped_samples":0,"operation":"append","committed_at_ms":{at}{retention}}}"#,
        n = shards.len(),
        b = 4 * shards.len(),
        s = entries.join(",")
    ))
    .unwrap()
}

pub(crate) fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "sts-log-{name}-{}-{}",
        std::process::id(),
        crate::local::now_ms()
    ));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

/// Appends version `v` holding shards 1..=v (one new shard a version) through the commit path.
fn append(dir: &Path, v: u64, at: u64) -> Manifest {
    let base = latest_manifest(dir).unwrap();
    assert_eq!(base.as_ref().map_or(0, Manifest::manifest_version), v - 1);
    let shards: Vec<u64> = (1..=v).collect();
    let next = manifest(v, &shards, at, None);
    fs::write(dir.join(shard(v)), b"abcd").unwrap();
    assert!(commit_version(dir, base.as_ref(), &next, "t").unwrap());
    publish_version(dir, &next, "t").unwrap();
    next
}

fn log_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir.join(MANIFEST_LOG_DIR))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir.join(MANIFEST_LOG_DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn an_entry_records_what_its_version_changed_and_replays_to_it() {
    let base = manifest(3, &[1, 2, 3], 10, None);
    let next = manifest(4, &[2, 3, 4, 5], 11, None);
    let text = log_entry_text(Some(&base), &next).unwrap();
    let r = parse_log_file(LogFile::Entry(4), &text).unwrap();
    let Change::Delta { add, remove } = &r.change else {
        panic!("a delta")
    };
    assert_eq!(
        add.iter().map(|s| s.shard_path.clone()).collect::<Vec<_>>(),
        vec![shard(4), shard(5)]
    );
    assert_eq!(remove.len(), 1);
    assert_eq!(remove[0].shard_path, shard(1));
    assert_eq!((r.base_version, r.shards_count), (3, 4));
    assert!(r.manifest.shards.is_empty());
    assert_eq!(r.manifest.total_samples, 4);
    let mut replay = Replay::from_manifest(&base);
    replay.apply(&r).unwrap();
    assert_eq!(replay.manifest().unwrap(), next);
    // the entry holds not the shards it keeps; it gives the schema (a commit on it reads its
    // base from this entry alone)
    assert!(!text.contains(&shard(2)), "{text}");
    assert!(!r.schema_from_base && text.contains("\"schema\""), "{text}");
    // a first entry gives it
    let first = log_entry_text(None, &base).unwrap();
    assert!(first.contains("\"schema\""), "{first}");
    let e = parse_log_file(
        LogFile::Entry(3),
        &first.replace("\"schema\"", "\"schema_x\""),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("unknown field") || e.contains("must give the schema"),
        "{e}"
    );
}

#[test]
fn a_damaged_or_misplaced_entry_is_an_error_naming_it() {
    let base = manifest(3, &[1, 2], 10, None);
    let next = manifest(4, &[2, 3], 11, None);
    let text = log_entry_text(Some(&base), &next).unwrap();
    // under another version's name
    let e = parse_log_file(LogFile::Entry(5), &text)
        .unwrap_err()
        .to_string();
    assert!(e.contains("holds manifest_version 4, not 5"), "{e}");
    // applied to a state that does not list the removed shard as recorded
    let r = parse_log_file(LogFile::Entry(4), &text).unwrap();
    let mut other = Replay::from_manifest(&manifest(3, &[2, 7], 10, None));
    let e = other.apply(&r).unwrap_err().to_string();
    assert!(e.contains(&format!("removes shard {}", shard(1))), "{e}");
    assert!(e.contains("00000000000000000004.json"), "{e}");
    // applied after a gap
    let mut gap = Replay::from_manifest(&manifest(2, &[1, 2], 10, None));
    let e = gap.apply(&r).unwrap_err().to_string();
    assert!(
        e.contains("committed on version 3, but the replay reached version 2"),
        "{e}"
    );
    // a log format from the future, an unknown field, a bad shard name
    for (bad, want) in [
        (
            text.replace("\"log_format\":2", "\"log_format\":3"),
            "log_format 3",
        ),
        (
            text.replace("\"log_format\":2", "\"log_format\":2,\"x\":1"),
            "unknown field",
        ),
        (
            text.replace(&shard(3), "../evil.safetensors"),
            "not a shard file name",
        ),
    ] {
        let e = parse_log_file(LogFile::Entry(4), &bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{want}: {e}");
    }
    // a checkpoint must be whole
    let e = parse_log_file(LogFile::Checkpoint(4), &text)
        .unwrap_err()
        .to_string();
    assert!(e.contains("a checkpoint must hold a whole manifest"), "{e}");
}

#[test]
fn log_file_names_parse_both_kinds() {
    assert_eq!(
        LogFile::parse("00000000000000000100.checkpoint.json").unwrap(),
        Some(LogFile::Checkpoint(100))
    );
    assert_eq!(
        LogFile::parse("00000000000000000007.json").unwrap(),
        Some(LogFile::Entry(7))
    );
    assert_eq!(
        LogFile::parse(".00000000000000000007.json.x.tmp").unwrap(),
        None
    );
    assert!(LogFile::parse("99999999999999999999.checkpoint.json").is_err());
    assert_eq!(
        LogFile::Checkpoint(5).name(),
        "00000000000000000005.checkpoint.json"
    );
}

/// Issue 38's bound: after 200 appends of one shard each, everything the log keeps is at most
/// 10× the final manifest (the full-copy log kept 102×).
#[test]
fn two_hundred_appends_keep_a_log_within_ten_manifests() {
    let dir = tmp("growth");
    let mut last = None;
    for v in 1..=200 {
        last = Some(append(&dir, v, 1000 + v));
    }
    let manifest_bytes = fs::metadata(dir.join(MANIFEST_FILE_NAME)).unwrap().len();
    let log = log_bytes(&dir);
    eprintln!(
        "200 appends: log {log} bytes, manifest {manifest_bytes} bytes ({:.1}x)",
        log as f64 / manifest_bytes as f64
    );
    assert!(
        log <= 10 * manifest_bytes,
        "log {log} bytes, manifest {manifest_bytes} bytes"
    );
    // checkpoints at the first version and every 100th
    let cps: Vec<String> = names(&dir)
        .into_iter()
        .filter(|n| n.ends_with(".checkpoint.json"))
        .collect();
    assert_eq!(
        cps,
        vec![
            "00000000000000000001.checkpoint.json",
            "00000000000000000100.checkpoint.json",
            "00000000000000000200.checkpoint.json"
        ]
    );
    // every version rebuilds to what was committed
    assert_eq!(manifest_at(&dir, 200).unwrap(), last.unwrap());
    for v in [1, 2, 99, 100, 101, 150] {
        let want: Vec<u64> = (1..=v).collect();
        assert_eq!(
            manifest_at(&dir, v).unwrap(),
            manifest(v, &want, 1000 + v, None)
        );
    }
    // with dataset_manifest.json stale, the latest version is rebuilt from the log
    fs::write(
        dir.join(MANIFEST_FILE_NAME),
        manifest(150, &(1..=150).collect::<Vec<_>>(), 1150, None)
            .to_json_pretty()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        latest_manifest(&dir).unwrap().unwrap().manifest_version(),
        200
    );
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_version_without_a_checkpoint_below_replays_from_the_first_entry() {
    let dir = tmp("nocp");
    for v in 1..=5 {
        append(&dir, v, 1000 + v);
    }
    fs::remove_file(
        dir.join(MANIFEST_LOG_DIR)
            .join(LogFile::Checkpoint(1).name()),
    )
    .unwrap();
    let files = LogFiles::from_names(names(&dir).iter().map(String::as_str)).unwrap();
    assert!(files.checkpoints.is_empty());
    // first the version's own entry, then every entry up to it
    let plan = plan_state(&files, 4, &BTreeMap::new()).unwrap();
    assert!(matches!(&plan, StatePlan::Read(f) if f == &vec![LogFile::Entry(4)]));
    assert_eq!(
        manifest_at(&dir, 4).unwrap(),
        manifest(4, &[1, 2, 3, 4], 1004, None)
    );
    // the first entry gone too: not rebuilt, and the error says why
    fs::remove_file(dir.join(MANIFEST_LOG_DIR).join(LogFile::Entry(1).name())).unwrap();
    let e = manifest_at(&dir, 4).unwrap_err().to_string();
    assert!(e.contains("version 4 cannot be rebuilt"), "{e}");
    let _ = fs::remove_dir_all(&dir);
}

/// A dataset whose log holds whole manifests (written before log format 2) reads as before, and
/// its first commit now continues the log with a checkpoint and a delta entry.
#[test]
fn an_old_full_copy_log_is_read_and_continued() {
    let dir = tmp("legacy");
    let log = dir.join(MANIFEST_LOG_DIR);
    fs::create_dir_all(&log).unwrap();
    for v in 1..=3 {
        let m = manifest(v, &(1..=v).collect::<Vec<_>>(), 1000 + v, None);
        fs::write(dir.join(shard(v)), b"abcd").unwrap();
        fs::write(
            log.join(LogFile::Entry(v).name()),
            m.to_json_pretty().unwrap(),
        )
        .unwrap();
        fs::write(dir.join(MANIFEST_FILE_NAME), m.to_json_pretty().unwrap()).unwrap();
    }
    assert_eq!(
        manifest_at(&dir, 2).unwrap(),
        manifest(2, &[1, 2], 1002, None)
    );
    append(&dir, 4, 1004);
    append(&dir, 5, 1005);
    assert!(names(&dir).contains(&LogFile::Checkpoint(4).name()));
    let r = read_log(&dir).unwrap();
    assert!(matches!(r[2].change, Change::Full));
    assert!(matches!(r[3].change, Change::Delta { .. }));
    assert_eq!(
        manifest_at(&dir, 5).unwrap(),
        manifest(5, &[1, 2, 3, 4, 5], 1005, None)
    );
    assert_eq!(
        manifest_at(&dir, 3).unwrap(),
        manifest(3, &[1, 2, 3], 1003, None)
    );
    let h = crate::versions::history_dir(&dir).unwrap();
    assert_eq!(
        h.iter().map(|r| r.shards_added).collect::<Vec<_>>(),
        vec![1, 1, 1, 1, 1]
    );
    let _ = fs::remove_dir_all(&dir);
}

/// A vacuum that prunes the log below the oldest retained version first writes that version's
/// checkpoint, so the retained versions still rebuild.
#[test]
fn vacuum_writes_the_checkpoint_the_retained_versions_replay_from() {
    let dir = tmp("vacuum");
    let now = crate::local::now_ms();
    // versions 1..=4 add a shard each; version 5 overwrites with one new shard
    for v in 1..=4 {
        append(&dir, v, now - 10_000 + v);
    }
    let base = latest_manifest(&dir).unwrap().unwrap();
    let next = manifest(5, &[9], now - 5_000, None);
    fs::write(dir.join(shard(9)), b"abcd").unwrap();
    assert!(commit_version(&dir, Some(&base), &next, "t").unwrap());
    publish_version(&dir, &next, "t").unwrap();
    append_on(&dir, &next, 6, now - 4_000);
    let req = VacuumRequest {
        retention_seconds: Some(0),
        allow_shorter_retention: true,
        now_ms: now,
    };
    let out = vacuum_dir(&dir, &req, false, &mut |_| {}, &crate::progress::NoProgress).unwrap();
    // shards 1..=4 only versions 1..=4 listed: deleted; the log below version 6 pruned
    assert_eq!(out.plan.shards.len(), 4);
    assert!(!dir.join(shard(1)).exists());
    assert!(dir.join(shard(9)).exists());
    let listed = names(&dir);
    assert!(
        listed.contains(&LogFile::Checkpoint(6).name()),
        "{listed:?}"
    );
    assert!(!listed.contains(&LogFile::Entry(5).name()), "{listed:?}");
    assert!(
        !listed.contains(&LogFile::Checkpoint(1).name()),
        "{listed:?}"
    );
    // the retained version and the vacuum version rebuild
    assert_eq!(manifest_at(&dir, 6).unwrap().shards.len(), 2);
    assert_eq!(manifest_at(&dir, 7).unwrap().shards.len(), 2);
    let e = manifest_at(&dir, 4).unwrap_err().to_string();
    assert!(e.contains("version 4"), "{e}");
    let _ = fs::remove_dir_all(&dir);
}

fn append_on(dir: &Path, base: &Manifest, v: u64, at: u64) {
    let mut next = base.clone();
    let mut add = manifest(v, &[v + 100], at, None);
    next.shards.push(add.shards.remove(0));
    next.recompute_totals();
    next.ext = add.ext.take();
    fs::write(dir.join(shard(v + 100)), b"abcd").unwrap();
    assert!(commit_version(dir, Some(base), &next, "t").unwrap());
    publish_version(dir, &next, "t").unwrap();
}

#[test]
fn after_commit_writes_checkpoints_and_prunes_only_what_replays_do_not_need() {
    let m = manifest(250, &[1], 1, None);
    let old = 0;
    let now = PRUNE_GRACE_MS + 10;
    let mut listing: Vec<ListedFile> = (1..=250)
        .map(|v| ListedFile {
            file: LogFile::Entry(v),
            modified_ms: old,
        })
        .collect();
    for c in [1, 100, 200] {
        listing.push(ListedFile {
            file: LogFile::Checkpoint(c),
            modified_ms: old,
        });
    }
    // not a multiple of the interval: no checkpoint; three checkpoints kept (oldest + 2)
    let a = after_commit(&listing, 250, &m, false, now);
    assert_eq!(a, AfterCommit::default());
    // the newest, KEPT_CHECKPOINTS behind it and the oldest stay: at 300 all four
    let a = after_commit(&listing, 300, &manifest(300, &[1], 1, None), false, now);
    assert!(a.write_checkpoint);
    assert!(a.delete.is_empty(), "{:?}", a.delete);
    listing.push(ListedFile {
        file: LogFile::Checkpoint(300),
        modified_ms: now,
    });
    // at 400 the one superseded by three newer goes (old enough), the oldest stays
    let a = after_commit(&listing, 400, &manifest(400, &[1], 1, None), false, now);
    assert_eq!(a.delete, vec![LogFile::Checkpoint(100)]);
    // retention 0: the log below the newest checkpoint KEPT_VERSIONS behind goes, if old enough
    let a = after_commit(&listing, 320, &manifest(320, &[1], 1, None), true, now);
    assert!(a.delete.contains(&LogFile::Entry(199)));
    assert!(a.delete.contains(&LogFile::Checkpoint(200)));
    assert!(a.delete.contains(&LogFile::Entry(250)));
    // the checkpoint 300 is young: everything below it may go, it stays
    assert!(!a.delete.contains(&LogFile::Checkpoint(300)));
    // nothing younger than the grace period
    let a = after_commit(&listing, 320, &manifest(320, &[1], 1, None), true, 5);
    assert!(a.delete.is_empty());
    // an interval of the dataset's own
    let mut m7 = manifest(14, &[1], 1, None);
    m7.ext.as_mut().unwrap().checkpoint_interval = Some(7);
    assert!(after_commit(&listing, 14, &m7, false, now).write_checkpoint);
}

/// A checkpoint removed between a reader's listing and its read (a commit superseded it) is
/// "gone": the reader lists again and rebuilds from the newer one.
#[test]
fn a_checkpoint_removed_after_the_listing_is_gone_and_a_new_listing_rebuilds() {
    let dir = tmp("gone");
    for v in 1..=5 {
        append(&dir, v, 1000 + v);
    }
    let listed = LogFiles::from_names(names(&dir).iter().map(String::as_str)).unwrap();
    // a newer checkpoint appears, the one listed goes
    let m5 = manifest_at(&dir, 5).unwrap();
    fs::write(
        dir.join(MANIFEST_LOG_DIR)
            .join(LogFile::Checkpoint(5).name()),
        m5.to_json_pretty().unwrap(),
    )
    .unwrap();
    fs::remove_file(
        dir.join(MANIFEST_LOG_DIR)
            .join(LogFile::Checkpoint(1).name()),
    )
    .unwrap();
    let e = rebuild(&listed, 5, &mut |f| {
        let path = dir.join(MANIFEST_LOG_DIR).join(f.name());
        fs::read_to_string(&path).map_err(|e| DatasetError::Version {
            problem: if e.kind() == std::io::ErrorKind::NotFound {
                format!("{}: {GONE}", path.display())
            } else {
                e.to_string()
            },
        })
    })
    .unwrap_err();
    assert!(is_gone(&e), "{e}");
    assert_eq!(manifest_at(&dir, 5).unwrap(), m5);
    let _ = fs::remove_dir_all(&dir);
}

/// [`follow::plan_follow`] over a local dataset, reading what it asks for.
fn follow_dir(
    dir: &Path,
    after: u64,
    upto: u64,
    on: follow::OnChange,
) -> Result<Vec<follow::FollowedVersion>, DatasetError> {
    let files = LogFiles::from_names(names(dir).iter().map(String::as_str)).unwrap();
    let mut read = BTreeMap::new();
    for _ in 0..4 {
        match follow::plan_follow(&files, after, upto, &read, on, "skip_change_commits")? {
            follow::FollowPlan::Done(v) => return Ok(v),
            follow::FollowPlan::Read(need) => {
                for f in need {
                    let t = fs::read_to_string(dir.join(MANIFEST_LOG_DIR).join(f.name())).unwrap();
                    read.insert(f, t);
                }
            }
        }
    }
    panic!("plan_follow did not end");
}

/// Commits `next` (its operation set) on the latest version.
fn commit_op(dir: &Path, mut next: Manifest, op: crate::manifest::Operation) {
    let base = latest_manifest(dir).unwrap();
    next.ext.as_mut().unwrap().operation = Some(op);
    for s in &next.shards {
        fs::write(dir.join(&s.shard_path), b"abcd").unwrap();
    }
    assert!(commit_version(dir, base.as_ref(), &next, "t").unwrap());
    publish_version(dir, &next, "t").unwrap();
}

fn added(v: &follow::FollowedVersion) -> Vec<String> {
    v.add.iter().map(|s| s.shard_path.clone()).collect()
}

#[test]
fn a_follower_reads_added_shards_passes_over_compaction_and_stops_at_a_delete() {
    use crate::manifest::Operation;
    use follow::{Followed, OnChange};
    let dir = tmp("follow");
    for v in 1..=4 {
        append(&dir, v, 1000 + v);
    }
    // 5: a compaction merges shards 1 and 2 into 10; 6: a delete rewrites 3 as 11; 7: an append
    commit_op(
        &dir,
        manifest(5, &[3, 4, 10], 1005, None),
        Operation::Compaction,
    );
    commit_op(
        &dir,
        manifest(6, &[4, 10, 11], 1006, None),
        Operation::Delete,
    );
    commit_op(
        &dir,
        manifest(7, &[4, 10, 11, 12], 1007, None),
        Operation::Append,
    );

    let v = follow_dir(&dir, 0, 4, OnChange::Fail).unwrap();
    assert_eq!(v.len(), 4);
    for (i, f) in v.iter().enumerate() {
        assert_eq!(f.version, i as u64 + 1);
        assert_eq!(f.followed, Followed::Rows);
        assert_eq!(added(f), vec![shard(i as u64 + 1)]);
        assert_eq!(f.committed_at_ms, Some(1001 + i as u64));
    }
    let v = follow_dir(&dir, 4, 5, OnChange::Fail).unwrap();
    assert_eq!(v[0].followed, Followed::Nothing);
    assert!(v[0].add.is_empty());
    let e = follow_dir(&dir, 4, 7, OnChange::Fail)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "version 6 is a version of operation delete that removes 1 shard(s) holding 1 row(s)"
        ) && e.contains("skip_change_commits=true"),
        "{e}"
    );
    let v = follow_dir(&dir, 4, 7, OnChange::Skip).unwrap();
    let kinds: Vec<_> = v.iter().map(|f| f.followed.clone()).collect();
    assert_eq!(
        kinds,
        vec![Followed::Nothing, Followed::Skipped, Followed::Rows]
    );
    assert!(
        v[1].add.is_empty(),
        "a skipped version's adds are passed over"
    );
    assert_eq!(added(&v[2]), vec![shard(12)]);
    assert!(follow_dir(&dir, 7, 7, OnChange::Fail).unwrap().is_empty());
    let e = follow_dir(&dir, 7, 8, OnChange::Fail)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("version 8 was never committed; the latest version is 7"),
        "{e}"
    );
    // an entry gone (pruned) between the follower's version and the target
    fs::remove_file(dir.join(MANIFEST_LOG_DIR).join(LogFile::Entry(2).name())).unwrap();
    let e = follow_dir(&dir, 1, 3, OnChange::Fail)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("version 2 is no longer in _manifest_log/"),
        "{e}"
    );
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_follower_compares_whole_manifest_entries_with_the_version_before() {
    use follow::{Followed, OnChange};
    let dir = tmp("follow-legacy");
    let log = dir.join(MANIFEST_LOG_DIR);
    fs::create_dir_all(&log).unwrap();
    // versions 1..=3 in the full-copy format; 3 overwrites with shard 7
    for (v, shards) in [(1, vec![1]), (2, vec![1, 2]), (3, vec![7])] {
        let mut m = manifest(v, &shards, 1000 + v, None);
        if v == 3 {
            m.ext.as_mut().unwrap().operation = Some(crate::manifest::Operation::Overwrite);
        }
        fs::write(
            log.join(LogFile::Entry(v).name()),
            m.to_json_pretty().unwrap(),
        )
        .unwrap();
        fs::write(dir.join(MANIFEST_FILE_NAME), m.to_json_pretty().unwrap()).unwrap();
    }
    append_on(&dir, &latest_manifest(&dir).unwrap().unwrap(), 4, 1004);
    let v = follow_dir(&dir, 1, 2, OnChange::Fail).unwrap();
    assert_eq!(added(&v[0]), vec![shard(2)]);
    let e = follow_dir(&dir, 1, 4, OnChange::Fail)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("version 3 is a version of operation overwrite that removes 2 shard(s)"),
        "{e}"
    );
    let v = follow_dir(&dir, 2, 4, OnChange::Skip).unwrap();
    assert_eq!(v[0].followed, Followed::Skipped);
    assert_eq!(added(&v[1]), vec![shard(104)]);
    // from the start: version 1's entry is whole, compared with nothing
    let v = follow_dir(&dir, 0, 1, OnChange::Fail).unwrap();
    assert_eq!(added(&v[0]), vec![shard(1)]);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_follower_refuses_a_version_that_changes_the_columns() {
    use follow::OnChange;
    let dir = tmp("follow-schema");
    append(&dir, 1, 1001);
    let mut next = manifest(2, &[1, 2], 1002, None);
    next.schema = crate::manifest::parse_manifest(
        &manifest(2, &[1, 2], 1002, None)
            .to_json_pretty()
            .unwrap()
            .replace(r#""dtype": "F32""#, r#""dtype": "F16""#),
    )
    .unwrap()
    .schema;
    assert_ne!(
        next.schema,
        manifest(2, &[1, 2], 1002, None).schema,
        "the test changes the columns"
    );
    let columns = next.schema.clone();
    commit_op(&dir, next, crate::manifest::Operation::Append);
    let e = follow_dir(&dir, 1, 2, OnChange::Skip)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("version 2 is a version of operation append that changes the dataset's columns"),
        "{e}"
    );
    // versions 3 (an overwrite back to the first columns, skipped) and 4 (an append with them):
    // a follower of version 2 passes over 3 and refuses 4, whose columns are not version 2's
    let mut over = manifest(3, &[9], 1003, None);
    commit_op(&dir, over.clone(), crate::manifest::Operation::Overwrite);
    over = manifest(4, &[9, 10], 1004, None);
    commit_op(&dir, over, crate::manifest::Operation::Append);
    let e = follow_dir(&dir, 2, 4, OnChange::Skip)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("version 4 is a version of operation append that changes the dataset's columns"),
        "{e}"
    );
    // a follower of version 3 reads version 4 (its own columns)
    let v = follow_dir(&dir, 3, 4, OnChange::Fail).unwrap();
    assert_eq!(added(&v[0]), vec![shard(10)]);
    assert_ne!(columns, manifest(4, &[1], 1, None).schema);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_follower_of_an_emptied_dataset_takes_the_columns_of_the_next_rows() {
    use follow::{Followed, OnChange};
    let dir = tmp("follow-empty");
    append(&dir, 1, 1001);
    append(&dir, 2, 1002);
    // 3: an overwrite that leaves nothing (no shard, no columns); 4: an append
    let mut text: serde_json::Value =
        serde_json::from_str(&manifest(3, &[1], 1003, None).to_json_pretty().unwrap()).unwrap();
    text["shards"] = serde_json::json!([]);
    text["schema"] = serde_json::json!({});
    text["total_samples"] = serde_json::json!(0);
    text["total_bytes"] = serde_json::json!(0);
    let empty = parse_manifest(&text.to_string()).unwrap();
    commit_op(&dir, empty, crate::manifest::Operation::Overwrite);
    commit_op(
        &dir,
        manifest(4, &[4], 1004, None),
        crate::manifest::Operation::Append,
    );
    // a follower of version 1 passes over the skipped overwrite and reads the append
    let v = follow_dir(&dir, 1, 4, OnChange::Skip).unwrap();
    let kinds: Vec<_> = v.iter().map(|f| f.followed.clone()).collect();
    assert_eq!(
        kinds,
        vec![Followed::Rows, Followed::Skipped, Followed::Rows]
    );
    assert_eq!(added(&v[2]), vec![shard(4)]);
    // a follower of the empty version itself has no columns yet: the append's are its own
    let v = follow_dir(&dir, 3, 4, OnChange::Fail).unwrap();
    assert_eq!(added(&v[0]), vec![shard(4)]);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_batch_of_followed_shards_reads_through_a_manifest_listing_only_them() {
    let base = manifest(4, &[1, 2, 3], 10, None).to_json_pretty().unwrap();
    let mut picked: Vec<ManifestShard> = manifest(9, &[2, 7], 20, None).shards;
    picked.reverse();
    let text = follow::manifest_listing(&base, picked).unwrap();
    let m = parse_manifest(&text).unwrap();
    // the batch's shards, sorted, with their totals; the base's columns and version kept
    let names: Vec<&str> = m.shards.iter().map(|s| s.shard_path.as_str()).collect();
    assert_eq!(names, vec![shard(2), shard(7)]);
    assert_eq!((m.total_samples, m.total_bytes), (2, 8));
    assert_eq!(m.manifest_version(), 4);
    let one = manifest(9, &[2], 20, None).shards;
    let twice = vec![one[0].clone(), one[0].clone()];
    assert!(follow::manifest_listing(&base, twice)
        .unwrap_err()
        .to_string()
        .contains("twice"));
    assert!(follow::manifest_listing(&base, Vec::new())
        .unwrap_err()
        .to_string()
        .contains("no shard"));
}
