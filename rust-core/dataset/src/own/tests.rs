#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use std::os::unix::fs::symlink;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("own-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

/// §5.9: a linked own directory is refused naming it; absent is `None`; a real one is used.
#[test]
fn own_dirs_are_never_followed_through_a_link() {
    let d = tmp("dirs");
    let elsewhere = tmp("dirs-elsewhere");
    assert!(own_dir(&d, "_manifest_log").unwrap().is_none());
    symlink(&elsewhere, d.join("_manifest_log")).unwrap();
    let e = own_dir(&d, "_manifest_log").unwrap_err().to_string();
    assert!(
        e.starts_with("is a symbolic link") && e.contains("§5.9"),
        "{e}"
    );
    assert!(!is_own_subdir(&d.join("_manifest_log")));
    fs::create_dir(d.join("_tensor_index.parquet")).unwrap();
    assert!(own_dir(&d, "_tensor_index.parquet").unwrap().is_some());
    assert!(is_own_subdir(&d.join("_tensor_index.parquet")));
    fs::write(d.join("f"), b"x").unwrap();
    assert!(own_dir(&d, "f")
        .unwrap_err()
        .to_string()
        .contains("not a directory"));
    fs::remove_dir_all(&d).unwrap();
    fs::remove_dir_all(&elsewhere).unwrap();
}

/// Only a regular file is removed: a link to a file elsewhere stays, and so does its target.
#[test]
fn only_regular_files_are_removed() {
    let d = tmp("remove");
    let elsewhere = tmp("remove-elsewhere");
    fs::write(elsewhere.join("target"), b"keep").unwrap();
    symlink(elsewhere.join("target"), d.join("link")).unwrap();
    fs::write(d.join("mine"), b"x").unwrap();
    assert!(!is_own_file(&d.join("link")) && is_own_file(&d.join("mine")));
    assert!(!remove_own_file(&d, "link").unwrap());
    assert!(!remove_own_file(&d, "absent").unwrap());
    assert!(remove_own_file(&d, "mine").unwrap());
    assert!(d.join("link").exists() && elsewhere.join("target").exists());
    assert!(!d.join("mine").exists());
    fs::remove_dir_all(&d).unwrap();
    fs::remove_dir_all(&elsewhere).unwrap();
}

/// A FIFO is refused at once (never waited on), a link to /dev/zero is refused (never read
/// without bound), a regular file is read.
#[test]
fn manifests_are_read_through_the_regular_file_rule() {
    let d = tmp("read");
    let fifo = d.join("fifo.json");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    symlink("/dev/zero", d.join("zero.json")).unwrap();
    fs::write(d.join("ok.json"), "{}").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (f, z) = (fifo.clone(), d.join("zero.json"));
    std::thread::spawn(move || {
        let a = read_manifest_text(&f).map_err(|e| e.to_string());
        let b = read_manifest_text(&z).map_err(|e| e.to_string());
        tx.send((a, b)).unwrap();
    });
    let (a, b) = rx.recv_timeout(std::time::Duration::from_secs(20)).unwrap();
    assert_eq!(a.unwrap_err(), "not a regular file (FIFO)");
    assert_eq!(b.unwrap_err(), "not a regular file (character device)");
    assert_eq!(read_manifest_text(&d.join("ok.json")).unwrap(), "{}");
    fs::remove_dir_all(&d).unwrap();
}

#[test]
fn log_entry_names_beyond_the_largest_version_are_errors_naming_them() {
    use crate::names::parse_manifest_log_file_name as log_entry_version;
    assert_eq!(
        log_entry_version("00000000000000000002.json").unwrap(),
        Some(2)
    );
    assert_eq!(
        log_entry_version(".00000000000000000002.json.x.tmp").unwrap(),
        None
    );
    assert_eq!(log_entry_version("notes.json").unwrap(), None);
    let e = log_entry_version("99999999999999999999.json")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("_manifest_log/99999999999999999999.json: not a version number"),
        "{e}"
    );
}
