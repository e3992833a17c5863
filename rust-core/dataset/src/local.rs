//! A dataset directory on the local file system: its manifest log read back, the commit of a
//! version with the protocol of spec/dataset.md §5.3 (create-if-absent by a hard link from a
//! synced temporary file, then `dataset_manifest.json` replaced by rename), and a vacuum run on
//! it ([`vacuum_dir`]) — what the CLI and the Python package use. The Spark connector runs the
//! same steps through Hadoop's file systems.

use crate::commit::{chores_need_listing, diff, entry_text, Changes, Head};
use crate::log::{
    after_commit, parse_log_file, Change, ListedFile, LogFile, LogFiles, LogRecord, Replay,
};
use crate::manifest::{parse_manifest, Manifest};
use crate::names::{INDEX_DIR_NAME, MANIFEST_FILE_NAME, MANIFEST_LOG_DIR};
use crate::own::{own_dir, remove_own_file};
use crate::vacuum::{plan_vacuum, vacuum_manifest, LogEntry, VacuumPlan, VacuumRequest};
use crate::DatasetError;
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

/// The `_manifest_log/` files (entries and checkpoints) with their paths and modification times,
/// ascending; a name that looks like an entry but holds no version is an error naming it.
fn log_files(dir: &Path) -> Result<Vec<(LogFile, PathBuf, u64)>, LocalError> {
    let Some(log_dir) = log_dir_of(dir)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for e in fs::read_dir(&log_dir).map_err(io_err(&log_dir))? {
        let e = e.map_err(io_err(&log_dir))?;
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let file = LogFile::parse(&name).map_err(|source| LocalError::Dataset {
            path: e.path(),
            source,
        })?;
        if let Some(f) = file {
            // a file pruned meanwhile is skipped (another vacuum)
            let Ok(meta) = fs::symlink_metadata(e.path()) else {
                continue;
            };
            out.push((f, e.path(), mtime_ms(&meta)));
        }
    }
    out.sort();
    Ok(out)
}

/// The log's file names as listed, without their modification times (no `stat` per name): what
/// a rebuild and the lookup of the newest version take.
fn log_names(dir: &Path) -> Result<LogFiles, LocalError> {
    let Some(log_dir) = log_dir_of(dir)? else {
        return Ok(LogFiles::default());
    };
    let mut names = Vec::new();
    for e in fs::read_dir(&log_dir).map_err(io_err(&log_dir))? {
        let e = e.map_err(io_err(&log_dir))?;
        if let Some(name) = e.file_name().to_str() {
            names.push(name.to_string());
        }
    }
    LogFiles::from_names(names.iter().map(String::as_str)).map_err(|source| LocalError::Dataset {
        path: log_dir,
        source,
    })
}

/// Whether `_manifest_log/` holds the entry of `version` (one `stat`).
fn entry_exists(log_dir: &Path, version: u64) -> bool {
    fs::symlink_metadata(log_dir.join(LogFile::Entry(version).name())).is_ok()
}

/// The log's newest version. From `known` (a version the caller read, whose entry is still
/// there) it probes `{v+1}.json`, `{v+2}.json`, `{v+4}.json`… and bisects (entries are created in
/// version order and pruned from the oldest, so the kept ones follow each other): a few `stat`s
/// however long the log. Without `known`, or when its entry is gone, the log is listed (names
/// only). `None`: no entry.
pub fn newest_version(dir: &Path, known: Option<u64>) -> Result<Option<u64>, LocalError> {
    let Some(log_dir) = log_dir_of(dir)? else {
        return Ok(None);
    };
    if let Some(k) = known.filter(|k| *k > 0 && entry_exists(&log_dir, *k)) {
        let (mut lo, mut step) = (k, 1u64);
        let mut hi = loop {
            let probe = lo.saturating_add(step);
            if probe == lo || !entry_exists(&log_dir, probe) {
                break probe;
            }
            lo = probe;
            step = step.saturating_mul(2);
        };
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if entry_exists(&log_dir, mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        return Ok(Some(lo));
    }
    Ok(log_names(dir)?.latest())
}

fn read_log_file(dir: &Path, file: LogFile) -> Result<LogRecord, LocalError> {
    let path = dir.join(MANIFEST_LOG_DIR).join(file.name());
    let text = crate::own::read_manifest_text(&path).map_err(io_err(&path))?;
    parse_log_file(file, &text).map_err(|source| LocalError::Dataset { path, source })
}

/// Every `_manifest_log/` entry, parsed (a damaged one, or one that disagrees with its name,
/// fails naming it), ascending. Entries hold what their version changed (or, written before log
/// format 2, a whole manifest): reading them all costs the log's size, which grows with the
/// commits, not with commits × shards.
pub fn read_log(dir: &Path) -> Result<Vec<LogEntry>, LocalError> {
    let mut out = Vec::new();
    for (file, _, mtime) in log_files(dir)? {
        if let LogFile::Entry(_) = file {
            out.push(LogEntry::from_record(read_log_file(dir, file)?, mtime));
        }
    }
    Ok(out)
}

/// The `_manifest_log/` entries after version `after`, parsed, ascending: what a commit that
/// planned on `after` checks for conflicts, without reading the log's past.
pub fn read_log_since(dir: &Path, after: u64) -> Result<Vec<LogEntry>, LocalError> {
    let mut out = Vec::new();
    for (file, _, mtime) in log_files(dir)? {
        if let LogFile::Entry(v) = file {
            if v > after {
                out.push(LogEntry::from_record(read_log_file(dir, file)?, mtime));
            }
        }
    }
    Ok(out)
}

/// The newest checkpoint at or below `version` (whole manifest), where a replay of the entries
/// from `version` on starts; `None` when the log has none there.
pub fn start_checkpoint(dir: &Path, version: u64) -> Result<Option<Manifest>, LocalError> {
    let files = log_names(dir)?;
    match files.checkpoints.iter().rev().find(|c| **c <= version) {
        Some(c) => Ok(Some(read_log_file(dir, LogFile::Checkpoint(*c))?.manifest)),
        None => Ok(None),
    }
}

/// The whole manifest of `version` rebuilt from the local log (spec/dataset.md §5.10): its
/// newest checkpoint at or below it and the entries after that.
pub fn manifest_at(dir: &Path, version: u64) -> Result<Manifest, LocalError> {
    // a checkpoint another commit removed after the listing: list again (a newer one is there)
    let mut attempt = 0;
    loop {
        attempt += 1;
        let files = log_names(dir)?;
        let result = crate::log::rebuild(&files, version, &mut |f| {
            let path = dir.join(MANIFEST_LOG_DIR).join(f.name());
            crate::own::read_manifest_text(&path).map_err(|e| DatasetError::Version {
                problem: if e.kind() == io::ErrorKind::NotFound {
                    format!("{}: {}", path.display(), crate::log::GONE)
                } else {
                    format!("{}: {e}", path.display())
                },
            })
        });
        match result {
            Err(e) if attempt < 3 && crate::log::is_gone(&e) => continue,
            other => {
                return other.map_err(|source| LocalError::Dataset {
                    path: dir.join(MANIFEST_LOG_DIR),
                    source,
                })
            }
        }
    }
}

/// The latest committed manifest: `dataset_manifest.json` when it is at least as new as the
/// log's newest entry, else that entry's version rebuilt (§5.3 step 1). `None` when the
/// directory has neither. `log` is the parsed log when the caller has it (saves a listing).
pub fn latest(dir: &Path, log: &[LogEntry]) -> Result<Option<Manifest>, LocalError> {
    let published = dir.join(MANIFEST_FILE_NAME);
    let pub_manifest = if published.exists() {
        Some(read_manifest(&published)?)
    } else {
        None
    };
    let newest = match log.last() {
        Some(l) => Some(l.version),
        None => newest_version(dir, pub_manifest.as_ref().map(Manifest::manifest_version))?,
    };
    match (newest, pub_manifest) {
        (Some(v), p) if p.as_ref().is_none_or(|p| p.manifest_version() < v) => {
            match log
                .last()
                .filter(|l| matches!(l.change, crate::log::Change::Full))
            {
                Some(l) => Ok(Some(l.manifest.clone())),
                None => manifest_at(dir, v).map(Some),
            }
        }
        (_, p) => Ok(p),
    }
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

/// Creates `_manifest_log/{file}` with `text` only if it does not exist (a hard link from a
/// synced temporary file): false when another writer created it first.
fn create_log_file(dir: &Path, file: LogFile, text: &str, id: &str) -> Result<bool, LocalError> {
    let log_dir = match log_dir_of(dir)? {
        Some(d) => d,
        None => {
            let d = dir.join(MANIFEST_LOG_DIR);
            fs::create_dir_all(&d).map_err(io_err(&d))?;
            d
        }
    };
    let name = file.name();
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

fn dataset_err(dir: &Path) -> impl FnOnce(DatasetError) -> LocalError + '_ {
    move |source| LocalError::Dataset {
        path: dir.to_path_buf(),
        source,
    }
}

/// The latest committed manifest of the local dataset `dir` (`None` when it has none).
pub fn latest_manifest(dir: &Path) -> Result<Option<Manifest>, LocalError> {
    latest(dir, &[])
}

/// Commits `next` (its `manifest_version`) on top of `base` (`None`: the first commit, or a base
/// written by another tool): creates its `_manifest_log/` entry — what `next` changes against
/// `base` (spec/dataset.md §5.10) — only if that version is free. False when another writer
/// committed that version first. Once created, the version's checkpoint is written when due and
/// superseded checkpoints are removed ([`after_commit`]); `dataset_manifest.json` is not
/// touched: see [`publish_version`]. A writer that knows what it adds and removes commits with
/// [`commit_changes`] instead, without the whole manifests.
pub fn commit_version(
    dir: &Path,
    base: Option<&Manifest>,
    next: &Manifest,
    id: &str,
) -> Result<bool, LocalError> {
    let head = base.map(Head::of);
    commit_entry(dir, head.as_ref(), next, &diff(base, next), Some(next), id)
}

/// The newest committed version's [`Head`]: what a commit on top of it needs, read from its own
/// log entry (found from `known`, a version the caller read: [`newest_version`]) — a cost that
/// follows that version's change, not the dataset. A version whose entry is an older kind (a
/// whole manifest, or a delta that keeps its base's schema) is read whole ([`latest`]). `None`
/// when the directory holds no dataset.
pub fn latest_head(dir: &Path, known: Option<u64>) -> Result<Option<Head>, LocalError> {
    if let Some(v) = newest_version(dir, known)? {
        match read_log_file(dir, LogFile::Entry(v)) {
            Ok(r) => {
                if let Some(h) = Head::of_record(r) {
                    return Ok(Some(h));
                }
            }
            // pruned since (a writer far behind): read the latest whole
            Err(LocalError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(latest(dir, &[])?.as_ref().map(Head::of))
}

/// Commits version `next` (its own fields; its `shards` are not read) on top of `base` with the
/// shards it adds and removes, as [`commit_version`] does: the entry, and the checks and chores of
/// the commit, cost what the commit changes; `_manifest_log/` is listed only when the chores may
/// have work ([`chores_need_listing`]: a checkpoint version, or a base not read from a delta
/// entry). A checkpoint due is the version rebuilt from the log. Publish with [`publish_changes`].
pub fn commit_changes(
    dir: &Path,
    base: Option<&Head>,
    next: &Manifest,
    changes: &Changes,
    id: &str,
) -> Result<bool, LocalError> {
    commit_entry(dir, base, next, changes, None, id)
}

fn commit_entry(
    dir: &Path,
    base: Option<&Head>,
    next: &Manifest,
    changes: &Changes,
    whole: Option<&Manifest>,
    id: &str,
) -> Result<bool, LocalError> {
    let version = next.manifest_version();
    let text = entry_text(base, next, changes).map_err(dataset_err(dir))?;
    if !create_log_file(dir, LogFile::Entry(version), &text, id)? {
        return Ok(false);
    }
    if !chores_need_listing(version, next, base, false) {
        return Ok(true);
    }
    let listed: Vec<ListedFile> = log_files(dir)?
        .into_iter()
        .map(|(file, _, modified_ms)| ListedFile { file, modified_ms })
        .collect();
    let chores = after_commit(&listed, version, next, false, now_ms());
    if chores.write_checkpoint {
        let rebuilt;
        let whole = match whole {
            Some(w) => w,
            None => {
                rebuilt = manifest_at(dir, version)?;
                &rebuilt
            }
        };
        let text = whole.to_json_pretty().map_err(dataset_err(dir))?;
        // another process may have written it already: the same version's same manifest
        create_log_file(dir, LogFile::Checkpoint(version), &text, id)?;
    }
    if let Some(log_dir) = log_dir_of(dir)? {
        for f in chores.delete {
            // best effort: a file another process removed first is gone either way
            let _ = remove_own_file(&log_dir, &f.name());
        }
    }
    Ok(true)
}

/// Publishes version `next` committed by [`commit_changes`] on `base_version`: its whole
/// manifest is `dataset_manifest.json` (when that is `base_version`) with `changes` applied, else
/// the version rebuilt from the log; then [`publish_version`]. Returns the whole manifest. Costs
/// the dataset's shards, outside the commit's critical section.
pub fn publish_changes(
    dir: &Path,
    base_version: u64,
    next: &Manifest,
    changes: &Changes,
    id: &str,
) -> Result<Manifest, LocalError> {
    let published = dir.join(MANIFEST_FILE_NAME);
    let base = match published.exists() {
        true => Some(read_manifest(&published)?),
        false => None,
    };
    let whole = match base.filter(|b| b.manifest_version() == base_version && base_version > 0) {
        Some(b) => {
            let mut replay = Replay::from_manifest(&b);
            let mut fields = next.clone();
            fields.shards.clear();
            let record = LogRecord {
                version: next.manifest_version(),
                manifest: fields,
                change: Change::Delta {
                    add: changes.add.clone(),
                    remove: changes.remove.clone(),
                },
                shards_count: 0,
                base_version,
                schema_from_base: false,
            };
            replay
                .apply(&record)
                .and_then(|()| replay.manifest())
                .map_err(dataset_err(dir))?
        }
        None => manifest_at(dir, next.manifest_version())?,
    };
    publish_version(dir, &whole, id)?;
    Ok(whole)
}

/// Replaces `dataset_manifest.json` with the committed `next`, then with the newest version while
/// a newer one appears (§5.3 step 4), so the last to publish leaves the newest manifest.
pub fn publish_version(dir: &Path, next: &Manifest, id: &str) -> Result<(), LocalError> {
    let mut current = next.clone();
    loop {
        let text = current.to_json_pretty().map_err(dataset_err(dir))?;
        let tmp = dir.join(format!(".{MANIFEST_FILE_NAME}.{id}.tmp"));
        let target = dir.join(MANIFEST_FILE_NAME);
        write_synced(&tmp, text.as_bytes())
            .and_then(|()| fs::rename(&tmp, &target))
            .and_then(|()| sync_dir(dir))
            .map_err(io_err(&target))?;
        match newest_version(dir, Some(current.manifest_version()))? {
            Some(n) if n > current.manifest_version() => current = manifest_at(dir, n)?,
            _ => return Ok(()),
        }
    }
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
    // the oldest checkpoint at or below the first entry is where the replay starts
    let checkpoint_versions = log_names(dir)?.checkpoints;
    let first = log.first().map_or(0, |l| l.version);
    let start: Vec<LogEntry> = start_checkpoint(dir, first)?
        .map(|m| LogEntry::full(m, 0))
        .into_iter()
        .collect();
    let plan = plan_vacuum(
        &log,
        &start,
        &checkpoint_versions,
        &current,
        &regular_files(dir)?,
        &index_files,
        req,
    )
    .map_err(dataset_err(dir))?;
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
    // the retained versions' replay starts from this checkpoint once the log below is gone
    if let Some(m) = &plan.checkpoint {
        let text = m.to_json_pretty().map_err(dataset_err(dir))?;
        let id = format!("vacuum-{}-{}", std::process::id(), now_ms());
        create_log_file(dir, LogFile::Checkpoint(m.manifest_version()), &text, &id)?;
    }
    for v in &plan.prune_versions {
        match &log_dir {
            Some(d) => remove(d, &LogFile::Entry(*v).name(), 0)?,
            None => progress.advance(1, 0),
        }
    }
    if let Some(d) = &log_dir {
        for v in &plan.prune_checkpoints {
            remove_own_file(d, &LogFile::Checkpoint(*v).name()).map_err(io_err(d))?;
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
        let version = next.manifest_version();
        if commit_version(dir, Some(&base), &next, &id)? {
            publish_version(dir, &next, &id)?;
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
