//! Maintenance commands on hostile datasets, as real `safetensors-spark` processes on real
//! directories (spec/dataset.md §5.9): a dataset's own directories are never followed through a
//! link, only its regular files are deleted, log entries are trusted only when they agree with
//! their names, and a special file where a manifest or entry should be is refused at once.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn shard(i: u32) -> String {
    format!("part-{i:05}-0000-00000000-0000-0000-0000-{i:012}.safetensors")
}

fn part(i: u32) -> String {
    format!("part-{i:05}-0000-00000000-0000-0000-0000-{i:012}.parquet")
}

fn manifest(v: u64, shards: &[u32], at: u64, retention: u64) -> String {
    let entries: Vec<String> = shards
        .iter()
        .map(|i| {
            format!(
                r#"{{"shard_path":"{}","samples_count":1,"bytes":4,"partition":{i},"padded_samples":0,"num_tensors":1}}"#,
                shard(*i)
            )
        })
        .collect();
    format!(
        r#"{{"format_version":"1.0","safetensors_version":"1.0","total_samples":{n},"total_bytes":{b},"shards":[{s}],"schema":{{"x":{{"dtype":"F32","shape":[1]}}}},"format":"safetensors-spark-dataset","created_by":"t","manifest_version":{v},"layout":"batch","batch_size":1,"tail_strategy":"write","kv_separator":null,"padded_samples":0,"dropped_samples":0,"committed_at_ms":{at},"retention_seconds":{retention}}}"#,
        n = shards.len(),
        b = 4 * shards.len(),
        s = entries.join(",")
    )
}

/// Commits version `v` listing `shards` (created, 4 bytes each) into `dir`.
fn commit(dir: &Path, v: u64, shards: &[u32], at: u64, retention: u64) {
    let text = manifest(v, shards, at, retention);
    fs::create_dir_all(dir.join("_manifest_log")).unwrap();
    fs::write(
        dir.join("_manifest_log").join(format!("{v:020}.json")),
        &text,
    )
    .unwrap();
    fs::write(dir.join("dataset_manifest.json"), &text).unwrap();
    for i in shards {
        fs::write(dir.join(shard(*i)), b"abcd").unwrap();
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hostile-cli-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

/// Runs the command with a time limit: a command that would hang (a FIFO) fails the test.
fn run(args: &[&str]) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_safetensors-spark"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(30) {
            child.kill().unwrap();
            panic!("safetensors-spark {args:?} did not finish in 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn vacuum0(ds: &str) -> (i32, String, String) {
    run(&[
        "vacuum",
        "--retention",
        "0",
        "--allow-shorter-retention",
        ds,
    ])
}

/// Issue #39 item 1: `_tensor_index.parquet` a link to a directory elsewhere that holds a file
/// named like a superseded shard's index part. The vacuum refuses the link and deletes nothing,
/// the outside file included.
#[test]
fn vacuum_never_follows_a_linked_index_directory() {
    let d = tmp("index-link");
    let elsewhere = tmp("index-elsewhere");
    let t = now_ms();
    commit(&d, 1, &[1], t - 10, 0);
    commit(&d, 2, &[2], t - 5, 0);
    fs::write(elsewhere.join(part(1)), b"not yours").unwrap();
    symlink(&elsewhere, d.join("_tensor_index.parquet")).unwrap();
    let (code, out, err) = vacuum0(d.to_str().unwrap());
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("_tensor_index.parquet: is a symbolic link"),
        "{err}"
    );
    assert!(elsewhere.join(part(1)).exists(), "the outside file is kept");
    assert!(d.join(shard(1)).exists(), "nothing is deleted");
    // the directory itself: the superseded shard and its part go, a link named like a part stays
    fs::remove_file(d.join("_tensor_index.parquet")).unwrap();
    fs::create_dir(d.join("_tensor_index.parquet")).unwrap();
    fs::write(d.join("_tensor_index.parquet").join(part(1)), b"p").unwrap();
    let (code, _, err) = vacuum0(d.to_str().unwrap());
    assert_eq!(code, 0, "{err}");
    assert!(!d.join(shard(1)).exists() && !d.join("_tensor_index.parquet").join(part(1)).exists());
    assert!(d.join(shard(2)).exists() && elsewhere.join(part(1)).exists());
    fs::remove_dir_all(&d).unwrap();
    fs::remove_dir_all(&elsewhere).unwrap();
}

/// Issue #39 item 2: dataset B whose `_manifest_log` links to A's. Vacuum, history and
/// validate of B refuse the link; A's log keeps every version and gets no vacuum version.
#[test]
fn a_linked_manifest_log_is_refused_and_the_other_dataset_is_untouched() {
    let a = tmp("log-a");
    let b = tmp("log-b");
    let t = now_ms();
    commit(&a, 1, &[1], t - 10, 0);
    commit(&a, 2, &[2], t - 5, 0);
    fs::write(b.join("dataset_manifest.json"), manifest(2, &[2], t - 5, 0)).unwrap();
    fs::write(b.join(shard(2)), b"abcd").unwrap();
    symlink(a.join("_manifest_log"), b.join("_manifest_log")).unwrap();
    let bs = b.to_str().unwrap();
    for args in [
        vec![
            "vacuum",
            "--retention",
            "0",
            "--allow-shorter-retention",
            bs,
        ],
        vec!["history", bs],
        vec!["validate", bs],
    ] {
        let (code, out, err) = run(&args);
        assert_ne!(code, 0, "{args:?}: {out}");
        assert!(
            format!("{out}{err}").contains("_manifest_log: is a symbolic link"),
            "{args:?}: {out}{err}"
        );
    }
    let log: Vec<_> = fs::read_dir(a.join("_manifest_log"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(log.len(), 2, "A's log is untouched: {log:?}");
    assert!(a
        .join("_manifest_log")
        .join(format!("{:020}.json", 1))
        .exists());
    fs::remove_dir_all(&a).unwrap();
    fs::remove_dir_all(&b).unwrap();
}

/// Issue #39 item 5: an entry copied over another is refused naming it (never read as the
/// version its name says), and a stray entry whose number is beyond any version is named.
#[test]
fn log_entries_that_disagree_with_their_names_are_named() {
    let d = tmp("lying");
    let t = now_ms();
    commit(&d, 1, &[1], t - 10, 0);
    commit(&d, 2, &[2], t - 5, 0);
    commit(&d, 3, &[3], t, 0);
    let log = d.join("_manifest_log");
    fs::copy(
        log.join(format!("{:020}.json", 3)),
        log.join(format!("{:020}.json", 2)),
    )
    .unwrap();
    let ds = d.to_str().unwrap();
    for args in [vec!["history", ds], vec!["validate", ds], vacuum_args(ds)] {
        let (code, out, err) = run(&args);
        assert_ne!(code, 0, "{args:?}: {out}");
        assert!(
            format!("{out}{err}").contains(
                "_manifest_log/00000000000000000002.json: holds manifest_version 3, not 2"
            ),
            "{args:?}: {out}{err}"
        );
    }
    assert!(d.join(shard(1)).exists(), "the vacuum deleted nothing");
    fs::copy(
        log.join(format!("{:020}.json", 1)),
        log.join(format!("{:020}.json", 2)),
    )
    .unwrap();
    fs::write(
        log.join(format!("{:020}.json", 2)),
        manifest(2, &[2], t - 5, 0),
    )
    .unwrap();
    fs::write(log.join("99999999999999999999.json"), "{}").unwrap();
    let (code, out, err) = run(&["history", ds]);
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("_manifest_log/99999999999999999999.json: not a version number"),
        "{err}"
    );
    fs::remove_dir_all(&d).unwrap();
}

fn vacuum_args(ds: &str) -> Vec<&str> {
    vec![
        "vacuum",
        "--retention",
        "0",
        "--allow-shorter-retention",
        ds,
    ]
}

/// Issue #39 item 7: a FIFO where the manifest should be, a log entry that links to
/// /dev/zero: every command refuses it at once (run() fails the test after 30 s).
#[test]
fn special_files_where_a_manifest_or_entry_should_be_are_refused_at_once() {
    let d = tmp("special");
    let t = now_ms();
    commit(&d, 1, &[1], t - 10, 0);
    commit(&d, 2, &[2], t - 5, 0);
    let ds = d.to_str().unwrap();
    let entry = d.join("_manifest_log").join(format!("{:020}.json", 1));
    fs::remove_file(&entry).unwrap();
    symlink("/dev/zero", &entry).unwrap();
    for args in [vacuum_args(ds), vec!["history", ds], vec!["validate", ds]] {
        let (code, out, err) = run(&args);
        assert_ne!(code, 0, "{args:?}: {out}");
        assert!(
            format!("{out}{err}").contains("not a regular file (character device)"),
            "{args:?}: {out}{err}"
        );
    }
    fs::remove_file(&entry).unwrap();
    fs::remove_dir_all(d.join("_manifest_log")).unwrap();
    fs::remove_file(d.join("dataset_manifest.json")).unwrap();
    assert!(Command::new("mkfifo")
        .arg(d.join("dataset_manifest.json"))
        .status()
        .unwrap()
        .success());
    for args in [vacuum_args(ds), vec!["validate", ds], vec!["compact", ds]] {
        let (code, out, err) = run(&args);
        assert_ne!(code, 0, "{args:?}: {out}");
        assert!(
            format!("{out}{err}").contains("not a regular file (FIFO)"),
            "{args:?}: {out}{err}"
        );
    }
    fs::remove_dir_all(&d).unwrap();
}

/// Issue #39 item 12: a retained older version lists shards the latest does not. A vacuum with
/// the dataset's retention (1 hour, not 0) keeps them and version 1 still validates; once
/// outside the retention they go.
#[test]
fn vacuum_keeps_the_shards_a_retained_older_version_needs() {
    let d = tmp("retained");
    let t = now_ms();
    commit(&d, 1, &[1, 2], t - 7_200_000, 3600);
    // version 2 (an overwrite) replaced both, committed a minute ago: version 1 was current
    // inside the last hour, so it is retained
    commit(&d, 2, &[3], t - 60_000, 3600);
    let ds = d.to_str().unwrap();
    let (code, out, err) = run(&["vacuum", ds]);
    assert_eq!(code, 0, "{err}");
    assert!(
        d.join(shard(1)).exists() && d.join(shard(2)).exists(),
        "{out}"
    );
    let (code, out, _) = run(&["validate", ds]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("version 1: ok (2 shards"), "{out}");
    // a retention of one second: version 1 is outside it now, its shards go
    let (code, out, err) = run(&[
        "vacuum",
        "--retention",
        "1 seconds",
        "--allow-shorter-retention",
        ds,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        !d.join(shard(1)).exists() && !d.join(shard(2)).exists(),
        "{out}"
    );
    assert!(d.join(shard(3)).exists());
    fs::remove_dir_all(&d).unwrap();
}

/// Issue #39 item 11: `validate DATASET` prints one line per version, a damaged entry as its own
/// version's error, not only the first damage; a directory that is no dataset says what to run.
#[test]
fn validate_reports_every_version_and_says_what_to_run_on_a_plain_directory() {
    let d = tmp("validate");
    let t = now_ms();
    commit(&d, 1, &[1], t - 10, 0);
    commit(&d, 2, &[2], t - 5, 0);
    commit(&d, 3, &[3], t, 0);
    fs::write(
        d.join("_manifest_log").join(format!("{:020}.json", 2)),
        "{ not json",
    )
    .unwrap();
    let ds = d.to_str().unwrap();
    let (code, out, _) = run(&["validate", ds]);
    assert_eq!(code, 1, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].ends_with("version 1: ok (1 shards, 0 with CRC-32C verified)"),
        "{out}"
    );
    assert!(
        lines[1].contains("version 2 (_manifest_log/00000000000000000002.json)"),
        "{out}"
    );
    assert!(
        lines[2].ends_with("version 3: ok (1 shards, 0 with CRC-32C verified)"),
        "{out}"
    );
    let plain = tmp("validate-plain");
    fs::write(plain.join("model.safetensors"), b"x").unwrap();
    let (code, out, _) = run(&["validate", plain.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("not a dataset") && out.contains("safetensors-spark report"),
        "{out}"
    );
    fs::remove_dir_all(&d).unwrap();
    fs::remove_dir_all(&plain).unwrap();
}
