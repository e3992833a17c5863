//! The progress bars of `report`, `validate`, `vacuum` and `compact` as real processes: drawn on
//! stderr only when it is a terminal (here a pseudo-terminal) and `--quiet` is not given, never
//! on stdout, whose JSON stays whole.
#![allow(clippy::unwrap_used, clippy::panic)]

use safetensors_spark_format::dtype::Dtype;
use safetensors_spark_format::file::write_file;
use safetensors_spark_format::header::TensorEntry;
use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const EXE: &str = env!("CARGO_BIN_EXE_safetensors-spark");

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("progress-cli-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn shard(i: u32) -> String {
    format!("part-{i:05}-0000-00000000-0000-0000-0000-{i:012}.safetensors")
}

/// A KV dataset of `n` shards of two keys each (real safetensors files), committed as version 1
/// with retention 0: `compact` merges them into one, then `vacuum` has log entries to prune.
fn kv_dataset(dir: &Path, n: u32) {
    let mut entries = Vec::new();
    for i in 0..n {
        let meta = BTreeMap::from([
            ("safetensors_spark.layout".to_string(), "kv".to_string()),
            ("safetensors_spark.samples".into(), "2".into()),
            ("safetensors_spark.padded_samples".into(), "0".into()),
            ("safetensors_spark.kv_separator".into(), "__".into()),
        ]);
        let data: Vec<u8> = [i as f32, 0.5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let t = |k: u32| TensorEntry {
            name: format!("key{i}-{k}__emb"),
            dtype: Dtype::F32,
            shape: vec![2],
        };
        let path = dir.join(shard(i));
        write_file(&path, Some(&meta), &[(t(0), &data[..]), (t(1), &data[..])]).unwrap();
        let bytes = fs::metadata(&path).unwrap().len();
        entries.push(format!(
            r#"{{"shard_path":"{}","samples_count":2,"bytes":{bytes},"partition":{i},"padded_samples":0,"num_tensors":2}}"#,
            shard(i)
        ));
    }
    let total: u64 = (0..n)
        .map(|i| fs::metadata(dir.join(shard(i))).unwrap().len())
        .sum();
    let text = format!(
        r#"{{"format_version":"1.0","safetensors_version":"1.0","total_samples":{s},"total_bytes":{total},"shards":[{e}],"schema":{{"emb":{{"dtype":"F32","shape":[2]}}}},"format":"safetensors-spark-dataset","created_by":"t","manifest_version":1,"layout":"kv","batch_size":null,"tail_strategy":null,"kv_separator":"__","padded_samples":0,"dropped_samples":0,"committed_at_ms":{at},"retention_seconds":0}}"#,
        s = 2 * n,
        e = entries.join(","),
        at = now_ms()
    );
    fs::create_dir_all(dir.join("_manifest_log")).unwrap();
    fs::write(
        dir.join("_manifest_log").join(format!("{:020}.json", 1)),
        &text,
    )
    .unwrap();
    fs::write(dir.join("dataset_manifest.json"), &text).unwrap();
}

/// `args` with stdout and stderr piped: (exit code, stdout, stderr).
fn piped(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(EXE).args(args).output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `args` with stdout piped and stderr on a pseudo-terminal of 160 columns: (exit code,
/// stdout, what reached the terminal).
fn on_terminal(args: &[&str]) -> (i32, String, String) {
    let (mut master, mut slave) = (0, 0);
    let size = libc::winsize {
        ws_row: 40,
        ws_col: 160,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes two descriptors into the two ints; name and termios may be null.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &size,
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened by openpty and are owned here alone.
    let (master, slave) = unsafe { (fs::File::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let child = {
        let mut cmd = Command::new(EXE);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(slave));
        cmd.spawn().unwrap()
        // `cmd`, and this process's copy of the terminal's slave side, dropped here
    };
    let reader = std::thread::spawn(move || {
        let mut master = master;
        let (mut out, mut buf) = (Vec::new(), [0u8; 4096]);
        // Linux answers EIO once the last slave descriptor (the child's) is closed
        while let Ok(n @ 1..) = master.read(&mut buf) {
            out.extend_from_slice(&buf[..n]);
        }
        out
    });
    let out = child.wait_with_output().unwrap();
    let term = reader.join().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&term).into_owned(),
    )
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {text:?}"))
}

/// A lake of three model files, and a dataset of three small shards to validate, compact and
/// vacuum.
struct Case {
    lake: PathBuf,
    ds: PathBuf,
}

fn case(name: &str) -> Case {
    let root = tmp(name);
    let lake = root.join("lake");
    fs::create_dir_all(&lake).unwrap();
    for i in 0..3 {
        let data = [0u8; 8];
        let e = TensorEntry {
            name: "w".into(),
            dtype: Dtype::F32,
            shape: vec![2],
        };
        write_file(
            lake.join(format!("m{i}.safetensors")),
            None,
            &[(e, &data[..])],
        )
        .unwrap();
    }
    let ds = root.join("ds");
    fs::create_dir_all(&ds).unwrap();
    kv_dataset(&ds, 3);
    Case { lake, ds }
}

#[test]
fn no_progress_when_stderr_is_not_a_terminal() {
    let c = case("piped");
    let (lake, ds) = (c.lake.to_str().unwrap(), c.ds.to_str().unwrap());
    let (code, out, err) = piped(&["report", "--json", lake]);
    assert_eq!((code, err.as_str()), (0, ""), "{out}");
    assert_eq!(out.lines().map(json).count(), 3);
    let m0 = format!("{lake}/m0.safetensors");
    let (code, out, err) = piped(&["validate", ds, &m0]);
    assert_eq!((code, err.as_str()), (0, ""), "{out}");
    assert!(out.contains("version 1: ok (3 shards"), "{out}");
    let (code, out, err) = piped(&["compact", ds]);
    assert_eq!((code, err.as_str()), (0, ""), "{out}");
    let outcome = json(&out);
    assert_eq!(outcome[0]["version"], 2, "{out}");
    assert_eq!(outcome[0]["plan"]["outputs"].as_array().unwrap().len(), 1);
    let (code, out, err) = piped(&[
        "vacuum",
        "--allow-shorter-retention",
        "--retention",
        "0",
        ds,
    ]);
    assert_eq!((code, err.as_str()), (0, ""), "{out}");
    assert_eq!(json(&out)["version"], 3, "{out}");
    // --quiet is no PATH: alone it is a usage error, as no argument was
    for args in [&["validate", "--quiet"][..], &["report", "--quiet"]] {
        let (code, out, err) = piped(args);
        assert_eq!((code, out.as_str()), (2, ""), "{args:?}");
        assert!(err.contains("usage: safetensors-spark"), "{args:?}: {err}");
    }
    fs::remove_dir_all(c.lake.parent().unwrap()).unwrap();
}

#[test]
fn progress_on_a_terminal_and_quiet_silences_it() {
    let c = case("tty");
    let (lake, ds) = (c.lake.to_str().unwrap(), c.ds.to_str().unwrap());
    let (code, out, term) = on_terminal(&["report", "--json", lake]);
    assert_eq!(code, 0, "{term}");
    assert_eq!(
        out.lines().map(json).count(),
        3,
        "stdout holds the JSON lines alone"
    );
    assert!(term.contains("report: 3/3 files"), "{term:?}");
    assert!(!out.contains("files"), "{out:?}");
    let (code, out, term) = on_terminal(&["validate", ds]);
    assert_eq!(code, 0, "{term}");
    assert!(term.contains("validate: 3/3 shards"), "{term:?}");
    assert!(out.contains("version 1: ok (3 shards"), "{out}");
    // the whole files of a lake: one bar counting files
    let m0 = format!("{lake}/m0.safetensors");
    let (code, _, term) = on_terminal(&["validate", &m0, ds]);
    assert_eq!(code, 0, "{term}");
    assert!(term.contains("validate: 1/1 files"), "{term:?}");
    let (code, out, term) = on_terminal(&["compact", ds]);
    assert_eq!(code, 0, "{term}");
    assert!(term.contains("compact: 1/1 shards"), "{term:?}");
    assert_eq!(json(&out)[0]["version"], 2, "{out}");
    let (code, out, term) = on_terminal(&[
        "vacuum",
        "--allow-shorter-retention",
        "--retention",
        "0",
        ds,
    ]);
    assert_eq!(code, 0, "{term}");
    // version 1's log entry (the compaction deleted the three replaced shards at commit)
    assert!(term.contains("vacuum: 1/1 files"), "{term:?}");
    assert_eq!(json(&out)["version"], 3, "{out}");
    // --quiet: nothing on the terminal, the same stdout
    for args in [
        vec!["report", "--quiet", "--json", lake],
        vec!["validate", "--quiet", ds, &m0],
        vec!["compact", "--quiet", ds],
        vec![
            "vacuum",
            "--quiet",
            "--allow-shorter-retention",
            "--retention",
            "0",
            ds,
        ],
    ] {
        let (code, out, term) = on_terminal(&args);
        assert_eq!((code, term.as_str()), (0, ""), "{args:?}: {out}");
        assert!(!out.is_empty(), "{args:?}");
    }
    fs::remove_dir_all(c.lake.parent().unwrap()).unwrap();
}
