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
