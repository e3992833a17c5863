//! The one rule for a local dataset's own files (spec/dataset.md §5.9), used by every local
//! maintenance command and reader (vacuum, compaction, history, versions, validate, the Python
//! package through `_native`):
//!
//! * the dataset's own directories (`_manifest_log/`, `_tensor_index.parquet/`, the partition
//!   directories of a `partitionBy` root) are never followed through a symbolic link
//!   ([`own_dir`], [`is_own_subdir`]);
//! * a command deletes only regular files (not links) directly in such a directory
//!   ([`remove_own_file`]): with the directories checked, the file's real path is inside the
//!   dataset directory;
//! * a manifest, a log entry or an index part is opened through the project's regular-file rule
//!   (`format::file::open_regular`: never a FIFO, socket or device) and read only up to a size
//!   bound ([`read_manifest_text`]);
//! * a log entry is trusted only when its content agrees with its name ([`check_log_entry`]).

use crate::manifest::Manifest;
use crate::names::{manifest_log_file_name, MANIFEST_LOG_DIR};
use crate::DatasetError;
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// The largest manifest or log entry read (bytes): 1 GiB, several million shard entries.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 30;

/// The error for a dataset directory that is a symbolic link (the caller names the path).
fn linked() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "is a symbolic link; a dataset's own directories are never followed through a link \
         (spec/dataset.md §5.9): replace it with the directory itself",
    )
}

/// The dataset's own directory `dir/name` (`_manifest_log`, `_tensor_index.parquet`): `None`
/// when it does not exist; an error when it is a symbolic link or not a directory (the error
/// does not repeat the path: callers name it, `{path}: {error}`).
pub fn own_dir(dir: &Path, name: &str) -> io::Result<Option<PathBuf>> {
    let path = dir.join(name);
    match fs::symlink_metadata(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
        Ok(m) if m.file_type().is_symlink() => Err(linked()),
        Ok(m) if !m.is_dir() => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "is not a directory",
        )),
        Ok(_) => Ok(Some(path)),
    }
}

/// Whether `path` is a directory that is not a symbolic link (a partition directory of a
/// `partitionBy` root is one only then: a link is never followed into another dataset).
pub fn is_own_subdir(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

/// Whether `path` is a regular file itself (not a symbolic link, even to a file): the only kind
/// of file a maintenance command deletes.
pub fn is_own_file(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
}

/// Removes `dir/name` only when it is a regular file (a symbolic link, even to a file, is left
/// alone). `dir` is the dataset directory or one of its own directories ([`own_dir`]). `Ok(false)`
/// when there was nothing of ours to delete.
pub fn remove_own_file(dir: &Path, name: &str) -> io::Result<bool> {
    let path = dir.join(name);
    match fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_file() => match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        },
        Ok(_) => Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Reads a manifest or log entry as UTF-8 text: a regular file (`open_regular`: a FIFO or a
/// device is refused, never read) of at most [`MAX_MANIFEST_BYTES`].
pub fn read_manifest_text(path: &Path) -> io::Result<String> {
    let f = safetensors_spark_format::file::open_regular(path)?;
    let len = f.metadata()?.len();
    if len > MAX_MANIFEST_BYTES {
        return Err(too_large(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // the file may grow after the check: read one byte past the bound at most
    f.take(MAX_MANIFEST_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(too_large(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

fn too_large(len: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{len} bytes: larger than a manifest may be ({MAX_MANIFEST_BYTES} bytes)"),
    )
}

/// A log entry is trusted only when its content agrees with its name: the entry
/// `_manifest_log/{version}.json` must hold `manifest_version` = `version`. An entry copied over
/// another (`…3.json` over `…2.json`) is an error naming it.
pub fn check_log_entry(version: u64, m: &Manifest) -> Result<(), DatasetError> {
    let found = m.manifest_version();
    if found == version {
        return Ok(());
    }
    Err(DatasetError::Version {
        problem: format!(
            "{MANIFEST_LOG_DIR}/{}: holds manifest_version {found}, not {version}: the entry \
             does not agree with its name (copied or edited), so it is not trusted",
            manifest_log_file_name(version)
        ),
    })
}

#[cfg(test)]
mod tests;
