//! Versions of a dataset (spec/dataset.md §5.8): every commit is `_manifest_log/{v:020}.json`;
//! this module resolves a version (by number or by time), checks that the shards it lists are
//! still there as written, lists the history and validates every version in the log.
//!
//! The selection and check rules are pure functions ([`select_version`], [`check_shard`],
//! [`history_of`]) so a reader that lists files through another file system (the Spark side,
//! through Hadoop) applies the same rules; the `*_dir` functions apply them to a local
//! directory (the CLI, the Python package).

use super::log::{parse_log_file, Change, LogFile, LogRecord};
use super::manifest::{parse_manifest, Manifest, Operation};
use super::names::{manifest_log_file_name, MANIFEST_LOG_DIR};
use super::DatasetError;
use safetensors_spark_format::file::{crc32c_hex, crc32c_of};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Which version to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VersionSpec {
    /// `versionAsOf`: this manifest version.
    Version(u64),
    /// `timestampAsOf`: the newest version committed at or before this time (ms since epoch).
    TimestampMs(i64),
}

/// One entry of `_manifest_log/` as a selection needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntryTime {
    pub version: u64,
    /// `committed_at_ms` of the entry, else the log file's modification time (ms).
    pub time_ms: i64,
}

fn version_err(problem: String) -> DatasetError {
    DatasetError::Version { problem }
}

/// Parses a `timestampAsOf` value: `YYYY-MM-DD`, `YYYY-MM-DD HH:MM:SS[.fff]` (also with `T`),
/// read as UTC, or RFC 3339 with an offset (`2026-11-26T12:00:00Z`, `…+01:00`). Returns ms
/// since the Unix epoch.
pub fn parse_timestamp(text: &str) -> Result<i64, DatasetError> {
    parse_time_option(text, "timestampAsOf")
}

/// [`parse_timestamp`] for the option `option` (errors name it): `startingTimestamp` of Spark's
/// `readStream` takes the same values.
pub fn parse_time_option(text: &str, option: &str) -> Result<i64, DatasetError> {
    use chrono::{DateTime, NaiveDate, NaiveDateTime};
    let t = text.trim();
    if let Ok(d) = DateTime::parse_from_rfc3339(t) {
        return Ok(d.timestamp_millis());
    }
    for f in [
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M",
        "%Y-%m-%dT%H:%M",
    ] {
        if let Ok(d) = NaiveDateTime::parse_from_str(t, f) {
            return Ok(d.and_utc().timestamp_millis());
        }
    }
    if let Ok(d) = NaiveDate::parse_from_str(t, "%Y-%m-%d") {
        if let Some(d) = d.and_hms_opt(0, 0, 0) {
            return Ok(d.and_utc().timestamp_millis());
        }
    }
    Err(version_err(format!(
        "{option} '{text}' is not a time; expected 'YYYY-MM-DD HH:MM:SS' (UTC) or ISO 8601 \
         such as '2026-11-26T12:00:00Z'"
    )))
}

/// Parses a `versionAsOf` value: a manifest version, an integer ≥ 1.
pub fn parse_version(text: &str) -> Result<u64, DatasetError> {
    match text.trim().parse::<i64>() {
        Ok(v) if v >= 1 => Ok(v as u64),
        _ => Err(version_err(format!(
            "versionAsOf '{text}' is not a version; expected an integer ≥ 1 (the manifest_version \
             of a commit, see `safetensors-spark history`)"
        ))),
    }
}

/// Chooses the version `spec` names among the log's entries (any order). A version the log does
/// not hold is an error saying whether it was never committed or is no longer kept; a time
/// before the first kept commit is an error naming that commit.
pub fn select_version(entries: &[LogEntryTime], spec: VersionSpec) -> Result<u64, DatasetError> {
    let mut sorted = entries.to_vec();
    sorted.sort_by_key(|e| e.version);
    let (Some(first), Some(last)) = (sorted.first(), sorted.last()) else {
        return Err(version_err(
            "the dataset has no manifest log (_manifest_log/), so no version can be chosen"
                .to_string(),
        ));
    };
    match spec {
        VersionSpec::Version(v) => {
            if sorted.iter().any(|e| e.version == v) {
                Ok(v)
            } else if v > last.version {
                Err(version_err(format!(
                    "version {v} was never committed; the latest version is {}",
                    last.version
                )))
            } else {
                Err(version_err(format!(
                    "version {v} is no longer in the manifest log (kept: versions {}); it was \
                     pruned or vacuumed",
                    kept_list(&sorted)
                )))
            }
        }
        VersionSpec::TimestampMs(ts) => {
            // the newest version whose commit time is at or before ts
            let best = sorted
                .iter()
                .filter(|e| e.time_ms <= ts)
                .max_by_key(|e| (e.time_ms, e.version));
            best.map(|e| e.version).ok_or_else(|| {
                version_err(format!(
                    "timestampAsOf {} is before the first kept commit (version {} at {})",
                    format_ms(ts),
                    first.version,
                    format_ms(first.time_ms)
                ))
            })
        }
    }
}

/// Where a follower given a start time begins (Spark's `readStream` option `startingTimestamp`,
/// spec/reading.md §8): the oldest kept version committed at or after `ts` (as Delta Lake's);
/// one past the latest version when every version was committed before `ts`, so the follower
/// reads only versions committed later. A time before the first kept commit starts there.
pub fn first_version_at_or_after(entries: &[LogEntryTime], ts: i64) -> Result<u64, DatasetError> {
    let Some(last) = entries.iter().map(|e| e.version).max() else {
        return Err(version_err(
            "the dataset has no manifest log (_manifest_log/), so no version can be chosen"
                .to_string(),
        ));
    };
    Ok(entries
        .iter()
        .filter(|e| e.time_ms >= ts)
        .map(|e| e.version)
        .min()
        .unwrap_or(last + 1))
}

fn kept_list(sorted: &[LogEntryTime]) -> String {
    let v: Vec<String> = sorted.iter().map(|e| e.version.to_string()).collect();
    if v.len() > 8 {
        format!("{}…{}", v[0], v[v.len() - 1])
    } else {
        v.join(", ")
    }
}

/// A time (ms since epoch) as `YYYY-MM-DD HH:MM:SS.mmm UTC`.
pub fn format_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || format!("{ms} ms"),
        |d| d.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string(),
    )
}

/// What a version's shard looks like on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundShard {
    pub bytes: u64,
    /// The file's CRC-32C, when it was computed.
    pub crc32c: Option<String>,
}

/// Checks one shard that `version` lists against what is on disk (`None`: missing): it must
/// exist with its recorded size, and its CRC-32C must match when both are known.
pub fn check_shard(
    version: u64,
    listed: &super::ManifestShard,
    found: Option<&FoundShard>,
) -> Result<(), DatasetError> {
    let name = &listed.shard_path;
    let Some(f) = found else {
        return Err(version_err(format!(
            "version {version} lists shard {name}, which is missing (vacuumed or deleted)"
        )));
    };
    if f.bytes != listed.bytes {
        return Err(version_err(format!(
            "version {version} lists shard {name} with {} bytes, the file has {}",
            listed.bytes, f.bytes
        )));
    }
    if let (Some(want), Some(got)) = (&listed.crc32c, &f.crc32c) {
        if !want.eq_ignore_ascii_case(got) {
            return Err(version_err(format!(
                "version {version}: shard {name} has CRC-32C {got}, the manifest records {want} \
                 (the file changed or is corrupt)"
            )));
        }
    }
    Ok(())
}

/// The CRC-32C of a local file, as the manifest writes it.
pub fn file_crc32c(path: &Path) -> Result<String, DatasetError> {
    let f = safetensors_spark_format::file::open_regular(path).map_err(|e| io_err(path, e))?;
    crc32c_of(std::io::BufReader::with_capacity(1 << 20, f))
        .map(crc32c_hex)
        .map_err(|e| io_err(path, e))
}

fn io_err(path: &Path, e: std::io::Error) -> DatasetError {
    version_err(format!("{}: {e}", path.display()))
}

/// The versions in a local dataset's `_manifest_log/`, ascending (none when there is no log).
/// A `_manifest_log/` that is a symbolic link is refused (spec/dataset.md §5.9), and so is a
/// name that looks like an entry but holds no version.
pub fn log_versions_dir(dir: &Path) -> Result<Vec<u64>, DatasetError> {
    let Some(log) = crate::own::own_dir(dir, MANIFEST_LOG_DIR)
        .map_err(|e| io_err(&dir.join(MANIFEST_LOG_DIR), e))?
    else {
        return Ok(Vec::new());
    };
    let rd = std::fs::read_dir(&log).map_err(|e| io_err(&log, e))?;
    let mut out = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| io_err(&log, e))?;
        if let Some(v) = entry
            .file_name()
            .to_str()
            .map(crate::names::parse_manifest_log_file_name)
            .transpose()?
            .flatten()
        {
            out.push(v);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The whole manifest of `version` of a local dataset, rebuilt from its log (spec/dataset.md
/// §5.10), agreeing with its name.
pub fn read_log_entry_dir(dir: &Path, version: u64) -> Result<Manifest, DatasetError> {
    crate::local::manifest_at(dir, version).map_err(|e| match e {
        crate::local::LocalError::Dataset { source, .. } => source,
        other => version_err(other.to_string()),
    })
}

/// Parses a whole manifest of version `version` (a rebuilt version, a checkpoint, an entry
/// written before log format 2) and checks that it is that version: an error naming the entry
/// otherwise. The rule for a version's manifest read by the JVM and the Python package.
pub fn parse_log_entry(version: u64, text: &str) -> Result<Manifest, DatasetError> {
    let m = parse_manifest(text).map_err(|e| {
        version_err(format!(
            "version {version} ({MANIFEST_LOG_DIR}/{}): {e}",
            manifest_log_file_name(version)
        ))
    })?;
    crate::own::check_log_entry(version, &m)?;
    Ok(m)
}

/// Commit time of a log entry: its `committed_at_ms`, else the file's modification time.
fn entry_time(dir: &Path, version: u64, m: &Manifest) -> Result<i64, DatasetError> {
    if let Some(t) = m.ext.as_ref().and_then(|x| x.committed_at_ms) {
        return Ok(i64::try_from(t).unwrap_or(i64::MAX));
    }
    let path = dir
        .join(MANIFEST_LOG_DIR)
        .join(manifest_log_file_name(version));
    let modified = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .map_err(|e| io_err(&path, e))?;
    Ok(match modified.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    })
}

/// Resolves `spec` in a local dataset and checks the version's shards (size always; CRC-32C when
/// `verify` and the manifest records one). Returns the version and its manifest; never a
/// manifest listing a shard that is not there as written.
pub fn open_version_dir(
    dir: &Path,
    spec: VersionSpec,
    verify: bool,
) -> Result<(u64, Manifest), DatasetError> {
    let versions = log_versions_dir(dir)?;
    let mut times = Vec::new();
    let mut loaded = BTreeMap::new();
    for v in &versions {
        match spec {
            VersionSpec::Version(_) => times.push(LogEntryTime {
                version: *v,
                time_ms: 0,
            }),
            VersionSpec::TimestampMs(_) => {
                // the entry's own fields say when (a delta entry is small)
                let r = read_record_dir(dir, *v)?;
                times.push(LogEntryTime {
                    version: *v,
                    time_ms: entry_time(dir, *v, &r.manifest)?,
                });
                if r.is_full() {
                    loaded.insert(*v, r.manifest);
                }
            }
        }
    }
    let v = select_version(&times, spec)?;
    let m = match loaded.remove(&v) {
        Some(m) => m,
        None => read_log_entry_dir(dir, v)?,
    };
    check_version_dir(dir, v, &m, verify)?;
    Ok((v, m))
}

/// Checks every shard `m` (version `version`) lists against the local directory.
pub fn check_version_dir(
    dir: &Path,
    version: u64,
    m: &Manifest,
    verify: bool,
) -> Result<(), DatasetError> {
    for s in &m.shards {
        let path = dir.join(&s.shard_path);
        let found = match std::fs::metadata(&path) {
            Ok(md) if md.is_file() => Some(FoundShard {
                bytes: md.len(),
                crc32c: None,
            }),
            Ok(_) => None,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err(&path, e)),
        };
        check_shard(version, s, found.as_ref())?;
        if verify && s.crc32c.is_some() {
            let crc = file_crc32c(&path)?;
            check_shard(
                version,
                s,
                Some(&FoundShard {
                    bytes: s.bytes,
                    crc32c: Some(crc),
                }),
            )?;
        }
    }
    Ok(())
}

/// One row of a dataset's history: a version in the log and what it changed against the
/// version before it in the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryRow {
    pub version: u64,
    /// `committed_at_ms`, else the log file's modification time.
    pub committed_at_ms: i64,
    /// `operation` (`null` in manifests written before it was recorded).
    pub operation: Option<Operation>,
    pub rows_added: u64,
    pub rows_removed: u64,
    pub bytes_added: u64,
    pub bytes_removed: u64,
    pub shards_added: u64,
    pub shards_removed: u64,
    pub total_rows: u64,
    pub total_bytes: u64,
    pub created_by: Option<String>,
    pub app_id: Option<String>,
    pub commit_message: Option<String>,
}

/// The history of a local dataset: one row per version in its log, oldest first.
pub fn history_dir(dir: &Path) -> Result<Vec<HistoryRow>, DatasetError> {
    let versions = log_versions_dir(dir)?;
    if versions.is_empty() {
        return Err(version_err(format!(
            "{} has no manifest log ({MANIFEST_LOG_DIR}/): not a dataset written by this connector",
            dir.display()
        )));
    }
    let mut loaded = Vec::with_capacity(versions.len());
    for v in versions {
        let r = read_record_dir(dir, v)?;
        let t = entry_time(dir, v, &r.manifest)?;
        loaded.push((t, r));
    }
    Ok(history_of(&loaded))
}

/// Log entry `version` of a local dataset, parsed (delta or whole), agreeing with its name.
fn read_record_dir(dir: &Path, version: u64) -> Result<LogRecord, DatasetError> {
    let file = LogFile::Entry(version);
    let path = dir.join(MANIFEST_LOG_DIR).join(file.name());
    let text = crate::own::read_manifest_text(&path).map_err(|e| io_err(&path, e))?;
    parse_log_file(file, &text)
}

/// History rows of log records (ascending, with their commit times): a delta entry says what it
/// added and removed; a whole manifest (entries written before log format 2) is compared with
/// the version before it (the first with an empty dataset). One pass: the cost grows with the
/// log, never with versions × shards beyond those whole entries themselves.
pub fn history_of(records: &[(i64, LogRecord)]) -> Vec<HistoryRow> {
    let mut out = Vec::with_capacity(records.len());
    let mut state: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (t, r) in records {
        let (mut ra, mut ba, mut sa, mut rr, mut br, mut sr) = (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
        match &r.change {
            Change::Delta { add, remove } => {
                for s in remove {
                    rr += s.samples_count;
                    br += s.bytes;
                    sr += 1;
                    state.remove(&s.shard_path);
                }
                for s in add {
                    ra += s.samples_count;
                    ba += s.bytes;
                    sa += 1;
                    state.insert(s.shard_path.clone(), (s.samples_count, s.bytes));
                }
            }
            Change::Full => {
                let now: BTreeMap<String, (u64, u64)> = r
                    .manifest
                    .shards
                    .iter()
                    .map(|s| (s.shard_path.clone(), (s.samples_count, s.bytes)))
                    .collect();
                for (name, (rows, bytes)) in &now {
                    if !state.contains_key(name) {
                        ra += rows;
                        ba += bytes;
                        sa += 1;
                    }
                }
                for (name, (rows, bytes)) in &state {
                    if !now.contains_key(name) {
                        rr += rows;
                        br += bytes;
                        sr += 1;
                    }
                }
                state = now;
            }
        }
        let m = &r.manifest;
        let x = m.ext.as_ref();
        out.push(HistoryRow {
            version: r.version,
            committed_at_ms: *t,
            operation: x.and_then(|x| x.operation),
            rows_added: ra,
            rows_removed: rr,
            bytes_added: ba,
            bytes_removed: br,
            shards_added: sa,
            shards_removed: sr,
            total_rows: m.total_samples,
            total_bytes: m.total_bytes,
            created_by: x.map(|x| x.created_by.clone()),
            app_id: x.and_then(|x| x.app_id.clone()),
            commit_message: x.and_then(|x| x.commit_message.clone()),
        });
    }
    out
}

/// The outcome of [`validate_dir`] for one version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionCheck {
    pub version: u64,
    pub shards: u64,
    /// Shards whose CRC-32C was verified (the others were written before checksums).
    pub verified: u64,
    /// `None`: every shard is there as written.
    pub error: Option<String>,
}

/// Checks every version in a local dataset's log: each listed shard exists with its size and,
/// where the manifest records one, its CRC-32C. A shard listed by several versions is read once.
/// A dataset without a log is checked through `dataset_manifest.json` alone (version 0 when the
/// manifest has none).
///
/// `progress` is told the distinct shards the versions list and their bytes (as the manifests
/// record them), and each shard as it is checked; shards a version's error left unchecked are
/// advanced at the end, so the advances add up to the totals.
pub fn validate_dir(
    dir: &Path,
    progress: &dyn crate::progress::Progress,
) -> Result<Vec<VersionCheck>, DatasetError> {
    let _finish = crate::progress::FinishOnDrop(progress);
    // a damaged entry is its version's error line; the other versions are still checked. The
    // versions are replayed once, in order, from the checkpoint below the oldest entry.
    let mut records: Vec<LogRecord> = Vec::new();
    let mut damaged: Vec<VersionCheck> = Vec::new();
    for v in log_versions_dir(dir)? {
        match read_record_dir(dir, v) {
            Ok(r) => records.push(r),
            Err(e) => damaged.push(VersionCheck {
                version: v,
                shards: 0,
                verified: 0,
                error: Some(e.to_string()),
            }),
        }
    }
    let mut replay = crate::log::Replay::default();
    if let Some(first) = records.first().filter(|r| !r.is_full() && r.version > 1) {
        let start = crate::local::start_checkpoint(dir, first.version)
            .map_err(|e| version_err(e.to_string()))?;
        if let Some(c) = start {
            replay = crate::log::Replay::from_manifest(&c);
        }
    }
    if records.is_empty() && damaged.is_empty() {
        let path = dir.join(super::names::MANIFEST_FILE_NAME);
        if !path.exists() && std::fs::symlink_metadata(&path).is_err() {
            return Err(version_err(format!(
                "{}: not a dataset (no {} and no {MANIFEST_LOG_DIR}/); to check the safetensors \
                 files below it, run `safetensors-spark report {}` or `safetensors-spark \
                 validate FILE...`",
                dir.display(),
                super::names::MANIFEST_FILE_NAME,
                dir.display()
            )));
        }
        let text = crate::own::read_manifest_text(&path).map_err(|e| io_err(&path, e))?;
        let m =
            parse_manifest(&text).map_err(|e| version_err(format!("{}: {e}", path.display())))?;
        records.push(LogRecord {
            version: m.manifest_version(),
            shards_count: m.shards.len() as u64,
            manifest: m,
            change: Change::Full,
            base_version: 0,
            schema_from_base: false,
        });
    }
    // progress: each distinct shard once, with the size its first listing records
    let mut distinct: BTreeMap<String, u64> = BTreeMap::new();
    for s in replay.shards().values() {
        distinct.entry(s.shard_path.clone()).or_insert(s.bytes);
    }
    for r in &records {
        for s in r.listed_or_added() {
            distinct.entry(s.shard_path.clone()).or_insert(s.bytes);
        }
    }
    progress.start(distinct.len() as u64, distinct.values().sum());
    // file → (size, crc) on disk, computed once
    let mut seen: BTreeMap<String, Option<FoundShard>> = BTreeMap::new();
    let mut out = damaged;
    for r in &records {
        let v = r.version;
        // an entry the start checkpoint already holds is checked, not applied again
        let covered = replay.version() >= v && !r.is_full();
        if let Err(e) = if covered { Ok(()) } else { replay.apply(r) } {
            out.push(VersionCheck {
                version: v,
                shards: r.shards_count,
                verified: 0,
                error: Some(e.to_string()),
            });
            replay = crate::log::Replay::default();
            continue;
        }
        let mut error = None;
        let mut verified = 0;
        for s in replay.shards().values() {
            let want_crc = s.crc32c.is_some();
            let first = !seen.contains_key(&s.shard_path);
            let entry = seen.entry(s.shard_path.clone()).or_insert(None);
            let path = dir.join(&s.shard_path);
            if entry
                .as_ref()
                .is_none_or(|f| want_crc && f.crc32c.is_none())
            {
                *entry = match std::fs::metadata(&path) {
                    Ok(md) if md.is_file() => Some(FoundShard {
                        bytes: md.len(),
                        crc32c: if want_crc {
                            Some(file_crc32c(&path)?)
                        } else {
                            None
                        },
                    }),
                    _ => None,
                };
            }
            if first {
                let bytes = distinct.get(s.shard_path.as_str()).copied().unwrap_or(0);
                progress.advance(1, bytes);
            }
            if let Err(e) = check_shard(v, s, entry.as_ref()) {
                error = Some(e.to_string());
                break;
            }
            if want_crc {
                verified += 1;
            }
        }
        out.push(VersionCheck {
            version: v,
            shards: replay.shards().len() as u64,
            verified,
            error,
        });
    }
    // the shards only versions with an error listed after it were not checked
    let (left, left_bytes) = distinct
        .iter()
        .filter(|(p, _)| !seen.contains_key(p.as_str()))
        .fold((0u64, 0u64), |(n, b), (_, bytes)| (n + 1, b + bytes));
    if left > 0 {
        progress.advance(left, left_bytes);
    }
    out.sort_by_key(|c| c.version);
    Ok(out)
}

/// One log entry as a caller that lists the log through its own file system passes it (the
/// Spark side, the Python package): its version, the file's modification time and, when read,
/// its text.
#[derive(Debug, Clone, Deserialize)]
pub struct ListedLogEntry {
    pub version: u64,
    pub modified_ms: i64,
    #[serde(default)]
    pub text: Option<String>,
}

/// A listed entry's text, parsed (delta or whole) and checked against its name.
fn parse_listed(e: &ListedLogEntry) -> Result<Option<LogRecord>, DatasetError> {
    e.text
        .as_deref()
        .map(|t| parse_log_file(LogFile::Entry(e.version), t))
        .transpose()
}

/// Checks the shards of log entry `version` (its text `text`, read by the caller's file system)
/// against `found` (shard name → file size; absent: missing), after checking that the entry
/// agrees with its name ([`parse_log_entry`]): what a versioned read of the JVM and the Python
/// package asks before it reads a row.
pub fn check_entry_shards(
    text: &str,
    version: u64,
    found: &BTreeMap<String, u64>,
) -> Result<Manifest, DatasetError> {
    let m = parse_log_entry(version, text)?;
    check_listed_shards(&m, version, found)?;
    Ok(m)
}

fn listed_time(e: &ListedLogEntry, m: Option<&Manifest>) -> i64 {
    m.and_then(|m| m.ext.as_ref())
        .and_then(|x| x.committed_at_ms)
        .map_or(e.modified_ms, |t| i64::try_from(t).unwrap_or(i64::MAX))
}

/// [`select_version`] over listed entries (their texts are needed for a timestamp).
pub fn select_listed(entries: &[ListedLogEntry], spec: VersionSpec) -> Result<u64, DatasetError> {
    select_version(&listed_times(entries)?, spec)
}

/// The commit times of listed entries ([`listed_time`]).
fn listed_times(entries: &[ListedLogEntry]) -> Result<Vec<LogEntryTime>, DatasetError> {
    let mut times = Vec::with_capacity(entries.len());
    for e in entries {
        let r = parse_listed(e)?;
        times.push(LogEntryTime {
            version: e.version,
            time_ms: listed_time(e, r.as_ref().map(|r| &r.manifest)),
        });
    }
    Ok(times)
}

/// [`first_version_at_or_after`] over listed entries (every text given) for the value of the
/// option `option` (errors name it).
pub fn starting_listed(
    entries: &[ListedLogEntry],
    timestamp: &str,
    option: &str,
) -> Result<u64, DatasetError> {
    let ts = parse_time_option(timestamp, option)?;
    first_version_at_or_after(&listed_times(entries)?, ts)
}

/// The values of the options `versionAsOf` / `timestampAsOf` (Python: `version=` /
/// `timestamp=`) as a [`VersionSpec`]: exactly one.
pub fn version_spec(
    version: Option<&str>,
    timestamp: Option<&str>,
) -> Result<VersionSpec, DatasetError> {
    match (version, timestamp) {
        (Some(v), None) => Ok(VersionSpec::Version(parse_version(v)?)),
        (None, Some(t)) => Ok(VersionSpec::TimestampMs(parse_timestamp(t)?)),
        _ => Err(version_err(
            "give one of versionAsOf (version=) and timestampAsOf (timestamp=), not both"
                .to_string(),
        )),
    }
}

/// Checks every shard `m` (version `version`) lists against `found` (shard name → file size;
/// absent: missing).
pub fn check_listed_shards(
    m: &Manifest,
    version: u64,
    found: &BTreeMap<String, u64>,
) -> Result<(), DatasetError> {
    for s in &m.shards {
        let f = found.get(&s.shard_path).map(|b| FoundShard {
            bytes: *b,
            crc32c: None,
        });
        check_shard(version, s, f.as_ref())?;
    }
    Ok(())
}

/// [`history_of`] listed entries (every text given), oldest first.
pub fn history_listed(entries: &[ListedLogEntry]) -> Result<Vec<HistoryRow>, DatasetError> {
    let mut sorted: Vec<&ListedLogEntry> = entries.iter().collect();
    sorted.sort_by_key(|e| e.version);
    let mut loaded = Vec::with_capacity(sorted.len());
    for e in sorted {
        let Some(r) = parse_listed(e)? else {
            return Err(version_err(format!(
                "the history needs the text of version {}",
                e.version
            )));
        };
        loaded.push((listed_time(e, Some(&r.manifest)), r));
    }
    Ok(history_of(&loaded))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::manifest::ManifestShard;

    fn e(version: u64, time_ms: i64) -> LogEntryTime {
        LogEntryTime { version, time_ms }
    }

    #[test]
    fn selects_by_version_and_by_time() {
        let log = [e(3, 3000), e(4, 4000), e(5, 5000)];
        assert_eq!(select_version(&log, VersionSpec::Version(4)).unwrap(), 4);
        let never = select_version(&log, VersionSpec::Version(9))
            .unwrap_err()
            .to_string();
        assert!(
            never.contains("version 9 was never committed; the latest version is 5"),
            "{never}"
        );
        let gone = select_version(&log, VersionSpec::Version(2))
            .unwrap_err()
            .to_string();
        assert!(
            gone.contains("version 2 is no longer in the manifest log (kept: versions 3, 4, 5)"),
            "{gone}"
        );
        assert_eq!(
            select_version(&log, VersionSpec::TimestampMs(4000)).unwrap(),
            4
        );
        assert_eq!(
            select_version(&log, VersionSpec::TimestampMs(4999)).unwrap(),
            4
        );
        assert_eq!(
            select_version(&log, VersionSpec::TimestampMs(i64::MAX)).unwrap(),
            5
        );
        let before = select_version(&log, VersionSpec::TimestampMs(2999))
            .unwrap_err()
            .to_string();
        assert!(
            before.contains(
                "before the first kept commit (version 3 at 1970-01-01 00:00:03.000 UTC)"
            ),
            "{before}"
        );
        assert!(select_version(&[], VersionSpec::Version(1)).is_err());
    }

    #[test]
    fn parses_option_values() {
        assert_eq!(parse_version(" 7 ").unwrap(), 7);
        for bad in ["0", "-1", "x", "1.5", ""] {
            let m = parse_version(bad).unwrap_err().to_string();
            assert!(m.contains("expected an integer ≥ 1"), "{m}");
        }
        let t = 1_795_694_400_000; // 2026-11-26 12:00:00 UTC
        assert_eq!(parse_timestamp("2026-11-26 12:00:00").unwrap(), t);
        assert_eq!(parse_timestamp("2026-11-26T12:00:00Z").unwrap(), t);
        assert_eq!(parse_timestamp("2026-11-26T13:00:00+01:00").unwrap(), t);
        assert_eq!(parse_timestamp("2026-11-26 12:00:00.250").unwrap(), t + 250);
        assert_eq!(parse_timestamp("2026-11-26").unwrap(), t - 12 * 3_600_000);
        assert!(parse_timestamp("yesterday")
            .unwrap_err()
            .to_string()
            .contains("'yesterday' is not a time"));
        assert!(version_spec(Some("1"), Some("2026-11-26")).is_err());
        assert!(parse_time_option("soon", "startingTimestamp")
            .unwrap_err()
            .to_string()
            .contains("startingTimestamp 'soon' is not a time"));
    }

    #[test]
    fn a_follower_starts_at_the_first_version_at_or_after_a_time() {
        let log = [e(2, 200), e(3, 300), e(4, 400)];
        // a commit exactly at the time is included; between commits: the next one
        assert_eq!(first_version_at_or_after(&log, 300).unwrap(), 3);
        assert_eq!(first_version_at_or_after(&log, 301).unwrap(), 4);
        // before the first kept commit: from it; after the latest: only later versions
        assert_eq!(first_version_at_or_after(&log, 5).unwrap(), 2);
        assert_eq!(first_version_at_or_after(&log, 401).unwrap(), 5);
        assert!(first_version_at_or_after(&[], 1)
            .unwrap_err()
            .to_string()
            .contains("no manifest log"));
    }

    fn shard(name: &str, bytes: u64, crc: Option<&str>) -> ManifestShard {
        ManifestShard {
            shard_path: name.into(),
            samples_count: 1,
            bytes,
            partition: Some(0),
            padded_samples: Some(0),
            num_tensors: Some(1),
            crc32c: crc.map(str::to_string),
            added_version: None,
        }
    }

    #[test]
    fn shard_checks_name_version_and_shard() {
        let s = shard("part-00000-0000-a.safetensors", 10, Some("0000abcd"));
        let missing = check_shard(3, &s, None).unwrap_err().to_string();
        assert!(
            missing
                .contains("version 3 lists shard part-00000-0000-a.safetensors, which is missing"),
            "{missing}"
        );
        let f = |bytes, crc: Option<&str>| FoundShard {
            bytes,
            crc32c: crc.map(str::to_string),
        };
        let size = check_shard(3, &s, Some(&f(9, None)))
            .unwrap_err()
            .to_string();
        assert!(size.contains("with 10 bytes, the file has 9"), "{size}");
        let crc = check_shard(3, &s, Some(&f(10, Some("deadbeef"))))
            .unwrap_err()
            .to_string();
        assert!(crc.contains("version 3: shard part-00000-0000-a.safetensors has CRC-32C deadbeef, the manifest records 0000abcd"), "{crc}");
        check_shard(3, &s, Some(&f(10, Some("0000ABCD")))).unwrap();
        // written before checksums: size only
        check_shard(
            3,
            &shard("part-00000-0000-a.safetensors", 10, None),
            Some(&f(10, Some("1"))),
        )
        .unwrap();
    }

    /// Every commit records its time, operation and writer, and they survive the manifest's
    /// text (they were parsed before, but not written).
    #[test]
    fn commits_record_operation_time_and_writer() {
        use crate::manifest::{
            next_manifest, next_stream_manifest, stamp_commit, CommitInfo, ManifestExt,
            StreamBatch, MANIFEST_FORMAT,
        };
        use crate::DatasetMode;
        let ext = ManifestExt {
            format: MANIFEST_FORMAT.into(),
            created_by: "t".into(),
            manifest_version: 1,
            mode: DatasetMode::Kv,
            batch_size: None,
            tail_strategy: None,
            kv_separator: Some("__".into()),
            padded_samples: 0,
            dropped_samples: 0,
            stream_commits: Default::default(),
            committed_at_ms: None,
            operation: None,
            commit_message: None,
            app_id: None,
            retention_seconds: None,
            vacuumed: None,
            checkpoint_interval: None,
        };
        let write = Manifest::empty(ext);
        let info = CommitInfo {
            committed_at_ms: 1_795_694_400_000,
            commit_message: Some("first \"load\"".into()),
            app_id: Some("local-1".into()),
        };
        let mut v1 = next_manifest(None, &write, false, &[]).unwrap();
        stamp_commit(&mut v1, &info).unwrap();
        let back = parse_manifest(&v1.to_json_pretty().unwrap()).unwrap();
        let x = back.ext.as_ref().unwrap();
        assert_eq!(x.operation, Some(Operation::Create));
        assert_eq!(x.committed_at_ms, Some(1_795_694_400_000));
        assert_eq!(x.commit_message.as_deref(), Some("first \"load\""));
        assert_eq!(x.app_id.as_deref(), Some("local-1"));
        let op = |m: &Manifest| m.ext.as_ref().unwrap().operation;
        let v2 = next_manifest(Some(&back), &write, true, &[]).unwrap();
        assert_eq!(op(&v2), Some(Operation::Append));
        // the next commit records its own writer, not the base's
        assert_eq!(v2.ext.as_ref().unwrap().commit_message, None);
        assert_eq!(
            op(&next_manifest(Some(&v2), &write, false, &[]).unwrap()),
            Some(Operation::Overwrite)
        );
        let batch = StreamBatch {
            query_id: "q".into(),
            batch_id: 0,
        };
        assert_eq!(
            op(&next_stream_manifest(Some(&v2), &write, &[], &batch).unwrap()),
            Some(Operation::StreamBatch)
        );
        let long = CommitInfo {
            commit_message: Some("x".repeat(70_000)),
            ..info
        };
        let err = stamp_commit(&mut v1, &long).unwrap_err().to_string();
        assert!(
            err.contains("commit_message is 70000 bytes; at most 65536"),
            "{err}"
        );
    }
}
