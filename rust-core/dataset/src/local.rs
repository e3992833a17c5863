//! A dataset directory on the local file system: its manifest log read back, the commit of a
//! version with the protocol of spec/dataset.md §5.3 (create-if-absent by a hard link from a
//! synced temporary file, then `dataset_manifest.json` replaced by rename), and a vacuum run on
//! it ([`vacuum_dir`]) — what the CLI and the Python package use. The Spark connector runs the
//! same steps through Hadoop's file systems.

use crate::manifest::{parse_manifest, Manifest};
use crate::names::{
    parse_manifest_log_file_name, INDEX_DIR_NAME, MANIFEST_FILE_NAME, MANIFEST_LOG_DIR,
};
use crate::own::{check_log_entry, own_dir, remove_own_file};
use crate::vacuum::{plan_vacuum, vacuum_manifest, LogEntry, VacuumPlan, VacuumRequest};
use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::MAX_COMMIT_ATTEMPTS;

/// Why a local vacuum failed: the file it was at, and what happened.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: {source}")]
    Dataset {
        path: PathBuf,
        source: crate::DatasetError,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> LocalError + '_ {
    move |source| LocalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn mtime_ms(meta: &fs::Metadata) -> u64 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64)
}

fn read_manifest(path: &Path) -> Result<Manifest, LocalError> {
    let text = crate::own::read_manifest_text(path).map_err(io_err(path))?;
    parse_manifest(&text).map_err(|source| LocalError::Dataset {
        path: path.to_path_buf(),
        source,
    })
}

/// The dataset's own `_manifest_log/` (`None` when absent; a symbolic link is refused, §5.9).
fn log_dir_of(dir: &Path) -> Result<Option<PathBuf>, LocalError> {
    own_dir(dir, MANIFEST_LOG_DIR).map_err(io_err(&dir.join(MANIFEST_LOG_DIR)))
}

/// The versions of the `_manifest_log/` entries with their file paths, ascending; a name that
/// looks like an entry but holds no version is an error naming it.
fn log_entries(dir: &Path) -> Result<Vec<(u64, PathBuf)>, LocalError> {
    let Some(log_dir) = log_dir_of(dir)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for e in fs::read_dir(&log_dir).map_err(io_err(&log_dir))? {
        let e = e.map_err(io_err(&log_dir))?;
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let version =
            parse_manifest_log_file_name(&name).map_err(|source| LocalError::Dataset {
                path: e.path(),
                source,
            })?;
        if let Some(v) = version {
            out.push((v, e.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Every `_manifest_log/` entry, parsed (a damaged one, or one whose `manifest_version`
/// disagrees with its name, fails naming it), ascending.
pub fn read_log(dir: &Path) -> Result<Vec<LogEntry>, LocalError> {
    let mut out = Vec::new();
    for (version, path) in log_entries(dir)? {
        let meta = fs::metadata(&path).map_err(io_err(&path))?;
        let manifest = read_manifest(&path)?;
        check_log_entry(version, &manifest).map_err(|source| LocalError::Dataset {
            path: path.clone(),
            source,
        })?;
        out.push(LogEntry {
            version,
            manifest,
            file_mtime_ms: mtime_ms(&meta),
        });
    }
    Ok(out)
}

/// The latest committed manifest: the newest log entry, or `dataset_manifest.json` when it is
/// newer (§5.3 step 1). `None` when the directory has neither.
pub fn latest(dir: &Path, log: &[LogEntry]) -> Result<Option<Manifest>, LocalError> {
    let published = dir.join(MANIFEST_FILE_NAME);
    let pub_manifest = if published.exists() {
        Some(read_manifest(&published)?)
    } else {
        None
    };
    Ok(match (log.last(), pub_manifest) {
        (Some(l), p) if p.as_ref().is_none_or(|p| p.manifest_version() < l.version) => {
            Some(l.manifest.clone())
        }
        (_, p) => p,
    })
}

/// Regular files directly in `dir` (not links, not directories), by name, with their sizes.
fn regular_files(dir: &Path) -> Result<BTreeMap<String, u64>, LocalError> {
    let mut out = BTreeMap::new();
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io_err(dir)(e)),
    };
    for e in entries {
        let e = e.map_err(io_err(dir))?;
        let meta = fs::symlink_metadata(e.path()).map_err(io_err(&e.path()))?;
        if let (true, Some(name)) = (meta.file_type().is_file(), e.file_name().to_str()) {
            out.insert(name.to_string(), meta.len());
        }
    }
    Ok(out)
}

fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

/// Creates `_manifest_log/{version}.json` with `text` only if it does not exist (a hard link
/// from a synced temporary file): false when another writer created that version first.
pub fn try_commit(dir: &Path, version: u64, text: &str, id: &str) -> Result<bool, LocalError> {
    let log_dir = match log_dir_of(dir)? {
        Some(d) => d,
        None => {
            let d = dir.join(MANIFEST_LOG_DIR);
            fs::create_dir_all(&d).map_err(io_err(&d))?;
            d
        }
    };
    let name = crate::names::manifest_log_file_name(version);
    let tmp = log_dir.join(format!(".{name}.{id}.tmp"));
    let target = log_dir.join(&name);
    let result = write_synced(&tmp, text.as_bytes())
        .and_then(|()| fs::hard_link(&tmp, &target))
        .and_then(|()| sync_dir(&log_dir));
    let _ = fs::remove_file(&tmp);
    match result {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(io_err(&target)(e)),
    }
}

/// Replaces `dataset_manifest.json` with `text` (version `version`), then with the newest log
/// entry while a newer one appears (§5.3 step 4).
pub fn publish(dir: &Path, version: u64, text: &str, id: &str) -> Result<(), LocalError> {
    let (mut v, mut t) = (version, text.to_string());
    loop {
        let tmp = dir.join(format!(".{MANIFEST_FILE_NAME}.{id}.tmp"));
        let target = dir.join(MANIFEST_FILE_NAME);
        write_synced(&tmp, t.as_bytes())
            .and_then(|()| fs::rename(&tmp, &target))
            .and_then(|()| sync_dir(dir))
            .map_err(io_err(&target))?;
        match log_entries(dir)?.pop() {
            Some((n, p)) if n > v => {
                t = crate::own::read_manifest_text(&p).map_err(io_err(&p))?;
                v = n;
            }
            _ => return Ok(()),
        }
    }
}

/// The latest committed manifest of the local dataset `dir` (`None` when it has none): the
/// stable entry point for tools that commit versions themselves (benchmarks, tests).
pub fn latest_manifest(dir: &Path) -> Result<Option<Manifest>, LocalError> {
    latest(dir, &read_log(dir)?)
}

/// Commits `next` (its `manifest_version`) on top of `base` (`None`: the first commit): creates
/// its `_manifest_log/` entry only if that version is free. False when another writer committed
/// that version first. `dataset_manifest.json` is not touched: see [`publish_version`].
pub fn commit_version(
    dir: &Path,
    base: Option<&Manifest>,
    next: &Manifest,
    id: &str,
) -> Result<bool, LocalError> {
    let _ = base;
    let text = next.to_json_pretty().map_err(|source| LocalError::Dataset {
        path: dir.to_path_buf(),
        source,
    })?;
    try_commit(dir, next.manifest_version(), &text, id)
}

/// Replaces `dataset_manifest.json` with the committed `next` (then with newer versions while
/// they appear, §5.3 step 4).
pub fn publish_version(dir: &Path, next: &Manifest, id: &str) -> Result<(), LocalError> {
    let text = next.to_json_pretty().map_err(|source| LocalError::Dataset {
        path: dir.to_path_buf(),
        source,
    })?;
    publish(dir, next.manifest_version(), &text, id)
}

/// What a vacuum did (or, dry, would do).
#[derive(Debug, Clone, serde::Serialize)]
pub struct VacuumOutcome {
    pub plan: VacuumPlan,
    pub dry_run: bool,
    /// The vacuum version committed (None when dry).
    pub version: Option<u64>,
}

/// Vacuums the local dataset `dir` (spec/dataset.md §5.8.1). `after_plan` runs between the plan
/// and its execution (tests use it to race a writer against the vacuum). `progress` is told the
/// files the plan deletes (shards, index parts, log entries) and the bytes of its shards and
/// index parts, and each file as it is deleted; a dry run tells it nothing.
pub fn vacuum_dir(
    dir: &Path,
    req: &VacuumRequest,
    dry_run: bool,
    after_plan: &mut dyn FnMut(&VacuumPlan),
    progress: &dyn crate::progress::Progress,
) -> Result<VacuumOutcome, LocalError> {
    let log = read_log(dir)?;
    let Some(current) = latest(dir, &log)? else {
        return Err(LocalError::Dataset {
            path: dir.join(MANIFEST_FILE_NAME),
            source: crate::DatasetError::Vacuum {
                problem: "no manifest: not a dataset".to_string(),
            },
        });
    };
    // the index directory is never followed through a link (§5.9): a vacuum refuses it
    let index_dir = own_dir(dir, INDEX_DIR_NAME).map_err(io_err(&dir.join(INDEX_DIR_NAME)))?;
    let index_files = match &index_dir {
        Some(d) => regular_files(d)?,
        None => BTreeMap::new(),
    };
    let plan =
        plan_vacuum(&log, &current, &regular_files(dir)?, &index_files, req).map_err(|source| {
            LocalError::Dataset {
                path: dir.to_path_buf(),
                source,
            }
        })?;
    if dry_run {
        return Ok(VacuumOutcome {
            plan,
            dry_run,
            version: None,
        });
    }
    after_plan(&plan);
    let _finish = crate::progress::FinishOnDrop(progress);
    let vacuumed = plan.vacuumed();
    progress.start(
        vacuumed.files + plan.prune_versions.len() as u64,
        vacuumed.bytes,
    );
    // only regular files directly in the dataset's own directories (§5.9)
    let remove = |d: &Path, name: &str, bytes: u64| {
        remove_own_file(d, name).map_err(io_err(&d.join(name)))?;
        progress.advance(1, bytes);
        Ok::<(), LocalError>(())
    };
    for s in &plan.shards {
        remove(dir, &s.name, s.bytes)?;
    }
    // index parts without an index directory: nothing to delete there
    let parts_dir = index_dir.as_deref();
    for s in &plan.index_parts {
        match parts_dir {
            Some(d) => remove(d, &s.name, s.bytes)?,
            None => progress.advance(1, s.bytes),
        }
    }
    let log_dir = log_dir_of(dir)?;
    for v in &plan.prune_versions {
        match &log_dir {
            Some(d) => remove(d, &crate::names::manifest_log_file_name(*v), 0)?,
            None => progress.advance(1, 0),
        }
    }
    let id = format!("vacuum-{}-{}", std::process::id(), now_ms());
    for _ in 0..MAX_COMMIT_ATTEMPTS {
        let log = read_log(dir)?;
        let Some(base) = latest(dir, &log)? else {
            break;
        };
        let next = vacuum_manifest(&base, plan.vacuumed(), now_ms(), None).map_err(|source| {
            LocalError::Dataset {
                path: dir.to_path_buf(),
                source,
            }
        })?;
        let text = next
            .to_json_pretty()
            .map_err(|source| LocalError::Dataset {
                path: dir.to_path_buf(),
                source,
            })?;
        let version = next.manifest_version();
        if try_commit(dir, version, &text, &id)? {
            publish(dir, version, &text, &id)?;
            return Ok(VacuumOutcome {
                plan,
                dry_run,
                version: Some(version),
            });
        }
    }
    Err(LocalError::Io {
        path: dir.to_path_buf(),
        source: io::Error::other(format!(
            "the vacuum's files are deleted, but {MAX_COMMIT_ATTEMPTS} attempts to commit its \
             version each found a newer version committed by another writer"
        )),
    })
}
