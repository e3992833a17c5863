//! Retention and vacuum (spec/dataset.md §5.8.1): the rules, once. Which versions a dataset
//! retains, which files a vacuum deletes, which log entries it prunes, and the manifest of the
//! vacuum version. No I/O here: [`crate::local`] runs a vacuum on a local directory (the CLI,
//! the Python package); the Spark connector runs the same plan through Hadoop's file systems.

use crate::log::{Change, LogRecord, Replay};
use crate::manifest::{Manifest, ManifestShard, Operation, Vacuumed};
use crate::names::shard_index_part_file_name;
use crate::DatasetError;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// The retention of a dataset whose manifest does not say (7 days, like Delta Lake's).
pub const DEFAULT_RETENTION_SECONDS: u64 = 7 * 24 * 3600;

/// What a retention value may be, for errors that name the option.
pub const RETENTION_EXPECTED: &str = "a duration \"<n> <unit>\" with n a whole number ≥ 0 and unit \
seconds, minutes, hours or days (e.g. \"7 days\"), or \"0\" (superseded shards are deleted at once)";

/// Parses a retention duration (`"<n> <unit>"`, units seconds|minutes|hours|days, singular
/// allowed, case-insensitive; `"0"`) to seconds. `None` for anything else: a negative or
/// fractional number, an unknown unit, garbage, or more seconds than fit in milliseconds as u64.
pub fn parse_retention(value: &str) -> Option<u64> {
    let v = value.trim();
    if v == "0" {
        return Some(0);
    }
    let mut parts = v.split_whitespace();
    let (Some(n), Some(unit), None) = (parts.next(), parts.next(), parts.next()) else {
        return None;
    };
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = n.parse().ok()?;
    let unit = unit.to_ascii_lowercase();
    let per = match unit.strip_suffix('s').unwrap_or(&unit) {
        "second" => 1,
        "minute" => 60,
        "hour" => 3600,
        "day" => 86400,
        _ => return None,
    };
    let seconds = n.checked_mul(per)?;
    seconds.checked_mul(1000)?;
    Some(seconds)
}

/// The retention a manifest records, or the default.
pub fn retention_seconds(m: &Manifest) -> u64 {
    m.ext
        .as_ref()
        .and_then(|x| x.retention_seconds)
        .unwrap_or(DEFAULT_RETENTION_SECONDS)
}

/// Whether the commit of `next` on top of `base` deletes the shards it supersedes (and their
/// index parts, and prunes old log entries) itself: with retention 0, or when `base` is a
/// manifest with only the published fields (another tool's: no `_manifest_log/` version of this
/// connector lists its shards, so no vacuum would ever delete them). Otherwise they stay until
/// a vacuum (spec/dataset.md §5.8.1).
pub fn deletes_at_commit(base: Option<&Manifest>, next: &Manifest) -> bool {
    retention_seconds(next) == 0 || base.is_some_and(|b| b.ext.is_none())
}

/// One entry of `_manifest_log/` (or a checkpoint), parsed, with its file's modification time
/// (the commit time of entries written before `committed_at_ms` was recorded).
#[derive(Debug, Clone)]
pub struct LogEntry {
    pub version: u64,
    /// The version's manifest: whole for a full entry or a checkpoint, its own fields (no
    /// shards) for a delta entry (spec/dataset.md §5.10).
    pub manifest: Manifest,
    pub change: Change,
    /// The version a delta entry was committed on (0 for a whole manifest).
    pub base_version: u64,
    /// A delta entry that keeps its base's schema.
    pub schema_from_base: bool,
    pub file_mtime_ms: u64,
}

impl LogEntry {
    /// A parsed log file with its modification time.
    pub fn from_record(r: LogRecord, file_mtime_ms: u64) -> LogEntry {
        LogEntry {
            version: r.version,
            manifest: r.manifest,
            change: r.change,
            base_version: r.base_version,
            schema_from_base: r.schema_from_base,
            file_mtime_ms,
        }
    }

    /// A whole manifest as an entry (tests, callers that hold states).
    pub fn full(manifest: Manifest, file_mtime_ms: u64) -> LogEntry {
        LogEntry {
            version: manifest.manifest_version(),
            manifest,
            change: Change::Full,
            base_version: 0,
            schema_from_base: false,
            file_mtime_ms,
        }
    }

    /// The record for a replay.
    pub fn record(&self) -> LogRecord {
        LogRecord {
            version: self.version,
            shards_count: self.manifest.shards.len() as u64,
            manifest: self.manifest.clone(),
            change: self.change.clone(),
            base_version: self.base_version,
            schema_from_base: self.schema_from_base,
        }
    }

    /// When this version was committed.
    pub fn committed_at_ms(&self) -> u64 {
        self.manifest
            .ext
            .as_ref()
            .and_then(|x| x.committed_at_ms)
            .unwrap_or(self.file_mtime_ms)
    }

    /// The shards this entry names as listed by its version: all of them for a whole manifest,
    /// the added ones for a delta.
    pub fn listed_or_added(&self) -> &[ManifestShard] {
        crate::log::listed_or_added(&self.manifest, &self.change)
    }
}

/// What a vacuum is asked to do.
#[derive(Debug, Clone, Default)]
pub struct VacuumRequest {
    /// Retention for this vacuum; `None`: the dataset's.
    pub retention_seconds: Option<u64>,
    /// Allows a retention shorter than the dataset's (like Delta's `retentionDurationCheck`).
    pub allow_shorter_retention: bool,
    /// Now, in ms since the Unix epoch.
    pub now_ms: u64,
}

/// A file a vacuum deletes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VacuumFile {
    pub name: String,
    pub bytes: u64,
}

/// What a vacuum deletes: shards, then their index parts, then log entries, then it commits a
/// `vacuum` version on top of `base_version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VacuumPlan {
    pub base_version: u64,
    pub retention_seconds: u64,
    /// Versions retained (the latest always).
    pub retained_versions: Vec<u64>,
    /// Shards to delete (names relative to the dataset directory), with their sizes.
    pub shards: Vec<VacuumFile>,
    /// Index parts to delete (names inside `_tensor_index.parquet/`).
    pub index_parts: Vec<VacuumFile>,
    /// Log entries to delete (never the latest version).
    pub prune_versions: Vec<u64>,
    /// Checkpoints to delete (those below the oldest retained version).
    pub prune_checkpoints: Vec<u64>,
    /// The checkpoint of the oldest retained version, written before anything of the log is
    /// pruned when the log has none there (replays of the retained versions start from it).
    #[serde(skip)]
    pub checkpoint: Option<Manifest>,
}

impl VacuumPlan {
    /// `vacuumed` of the vacuum version: files and bytes of shards and index parts deleted.
    pub fn vacuumed(&self) -> Vacuumed {
        Vacuumed {
            files: (self.shards.len() + self.index_parts.len()) as u64,
            bytes: self
                .shards
                .iter()
                .chain(&self.index_parts)
                .map(|f| f.bytes)
                .sum(),
        }
    }
}

fn vacuum_err(problem: impl Into<String>) -> DatasetError {
    DatasetError::Vacuum {
        problem: problem.into(),
    }
}

/// The plan of a vacuum. `log`: the `_manifest_log/` entries (any order; delta or full);
/// `checkpoints`: the log's checkpoints (whole manifests; the oldest is where a replay of the
/// oldest entries starts, so callers may pass that one only, with `checkpoint_versions` listing
/// them all); `latest`: the dataset's latest committed manifest (rebuilt, or
/// `dataset_manifest.json` when newer); `shard_files`: the regular files of the dataset directory
/// with their sizes; `index_files`: the regular files of `_tensor_index.parquet/` with their sizes.
///
/// A shard is deleted only when some log version lists it, no retained version lists it, it
/// passed [`crate::check_shard_path`] (every parsed manifest's names did) and it is a file of the
/// directory: a file no version lists (a foreign file, an in-flight writer's shard) is never
/// a candidate. The work grows with the shards the log names and its versions, never with their
/// product: the versions are replayed once, in order.
#[allow(clippy::too_many_arguments)]
pub fn plan_vacuum(
    log: &[LogEntry],
    checkpoints: &[LogEntry],
    checkpoint_versions: &[u64],
    latest: &Manifest,
    shard_files: &BTreeMap<String, u64>,
    index_files: &BTreeMap<String, u64>,
    req: &VacuumRequest,
) -> Result<VacuumPlan, DatasetError> {
    if latest.ext.is_none() {
        return Err(vacuum_err(
            "the dataset's manifest has only the published fields (written by another tool); \
             vacuum works on datasets this connector wrote",
        ));
    }
    let dataset_retention = retention_seconds(latest);
    let retention = req.retention_seconds.unwrap_or(dataset_retention);
    if retention < dataset_retention && !req.allow_shorter_retention {
        return Err(vacuum_err(format!(
            "retention {retention} s is shorter than the dataset's retention {dataset_retention} s \
             (retention_seconds in its manifest): versions inside the dataset's retention would \
             lose their shards; pass allow_shorter_retention (CLI --allow-shorter-retention, \
             Spark allowShorterRetention) to do it anyway"
        )));
    }
    let latest_version = latest.manifest_version();
    let mut log: Vec<&LogEntry> = log.iter().filter(|l| l.version <= latest_version).collect();
    log.sort_by_key(|l| l.version);
    let cutoff = req.now_ms.saturating_sub(retention.saturating_mul(1000));
    let mut retained = BTreeSet::from([latest_version]);
    for (i, l) in log.iter().enumerate() {
        if l.version == latest_version {
            continue;
        }
        // v was the current state until the next version was committed (the next one in the log;
        // if entries between are missing, a later time: more is retained, never less)
        let superseded_at = log.get(i + 1).map_or(u64::MAX, |n| n.committed_at_ms());
        if superseded_at > cutoff {
            retained.insert(l.version);
        }
    }
    // every version from the oldest retained one on is kept (a clock that went back between
    // commits retains more, never less)
    let oldest_retained = retained.first().copied().unwrap_or(latest_version);
    // replay from the newest checkpoint at or below the first entry (or from nothing: the
    // first entry then starts the dataset or is a whole manifest)
    let first = log.first().map_or(latest_version, |l| l.version);
    let start: Option<&LogEntry> = checkpoints
        .iter()
        .filter(|c| c.version <= first)
        .max_by_key(|c| c.version);
    let mut replay = start.map_or_else(Replay::default, |c| Replay::from_manifest(&c.manifest));
    let mut replayable = true;
    let mut old_listed: BTreeSet<&str> = BTreeSet::new();
    let mut keep: BTreeSet<String> = latest.shards.iter().map(|s| s.shard_path.clone()).collect();
    if let Some(c) = start {
        if c.version < oldest_retained {
            old_listed.extend(c.manifest.shards.iter().map(|s| s.shard_path.as_str()));
        } else {
            keep.extend(c.manifest.shards.iter().map(|s| s.shard_path.clone()));
        }
    }
    let mut state_at_oldest: Option<Manifest> = None;
    for l in &log {
        if start.is_some_and(|c| l.version <= c.version) {
            continue;
        }
        if replayable {
            let starts_here =
                matches!(l.change, Change::Full) || replay.version() == l.base_version;
            if starts_here {
                if let Err(e) = replay.apply(&l.record()) {
                    return Err(vacuum_err(e.to_string()));
                }
            } else {
                // the entries before this one are gone and no checkpoint covers them: the
                // versions from here on are not rebuilt (nothing of the log is pruned)
                replayable = false;
            }
        }
        if l.version < oldest_retained {
            old_listed.extend(l.listed_or_added().iter().map(|s| s.shard_path.as_str()));
        } else {
            keep.extend(l.listed_or_added().iter().map(|s| s.shard_path.clone()));
        }
        if l.version == oldest_retained && replayable {
            state_at_oldest = Some(replay.manifest().map_err(|e| vacuum_err(e.to_string()))?);
            keep.extend(replay.shards().keys().cloned());
        }
    }
    let candidates: Vec<&str> = old_listed
        .into_iter()
        .filter(|n| !keep.contains(*n))
        .collect();
    let mut shards = Vec::new();
    let mut index_parts = Vec::new();
    for name in candidates {
        crate::check_shard_path(name)?;
        if let Some(bytes) = shard_files.get(name) {
            shards.push(VacuumFile {
                name: name.to_string(),
                bytes: *bytes,
            });
        }
        if let Some(part) = shard_index_part_file_name(name) {
            if let Some(bytes) = index_files.get(&part) {
                index_parts.push(VacuumFile {
                    name: part,
                    bytes: *bytes,
                });
            }
        }
    }
    // the log below the oldest retained version goes only when that version can be rebuilt
    // without it: a checkpoint there (kept, or written by this vacuum) or a full entry
    let oldest_is_full = log
        .iter()
        .any(|l| l.version == oldest_retained && matches!(l.change, Change::Full));
    let has_checkpoint = checkpoint_versions.contains(&oldest_retained);
    let (prune_versions, prune_checkpoints, checkpoint) =
        if oldest_is_full || has_checkpoint || state_at_oldest.is_some() {
            (
                log.iter()
                    .map(|l| l.version)
                    .filter(|v| *v < oldest_retained)
                    .collect(),
                checkpoint_versions
                    .iter()
                    .copied()
                    .filter(|v| *v < oldest_retained)
                    .collect(),
                if oldest_is_full || has_checkpoint {
                    None
                } else {
                    state_at_oldest
                },
            )
        } else {
            (Vec::new(), Vec::new(), None)
        };
    Ok(VacuumPlan {
        base_version: latest_version,
        retention_seconds: retention,
        retained_versions: retained.into_iter().collect(),
        shards,
        index_parts,
        prune_versions,
        prune_checkpoints,
        checkpoint,
    })
}

/// The manifest of a vacuum version on top of `base` (the latest committed manifest when the
/// vacuum commits, which may be newer than its plan's base): the same shards, the next
/// `manifest_version`, `operation: vacuum`, `vacuumed`, `committed_at_ms`.
pub fn vacuum_manifest(
    base: &Manifest,
    vacuumed: Vacuumed,
    committed_at_ms: u64,
    app_id: Option<String>,
) -> Result<Manifest, DatasetError> {
    let mut out = base.clone();
    let Some(x) = &mut out.ext else {
        return Err(vacuum_err(
            "the dataset's manifest has only the published fields (written by another tool)",
        ));
    };
    x.manifest_version += 1;
    x.committed_at_ms = Some(committed_at_ms);
    x.operation = Some(Operation::Vacuum);
    x.commit_message = None;
    x.app_id = app_id;
    x.vacuumed = Some(vacuumed);
    out.validate()?;
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
