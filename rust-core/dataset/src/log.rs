//! The manifest log (spec/dataset.md §5.10): what `_manifest_log/` holds and how a version's
//! whole manifest is rebuilt from it. The one home of these rules: the CLI and the Python package
//! call them on what they read, the JVM through `NativeVersions`.
//!
//! * `{v:020}.json`, one **entry** per commit. Since log format 2 an entry records what the
//!   version changed — the shards it adds and removes — and the version's own fields (the
//!   manifest without `shards`): its size follows the commit, not the dataset. Entries written
//!   before hold the whole manifest (full entries); both are read.
//! * `{v:020}.checkpoint.json`, a **checkpoint**: the whole manifest of version `v`. The commit of
//!   every version that is a multiple of the dataset's checkpoint interval (and the first commit
//!   to a log without one) writes one after its entry, outside the commit's critical section. A
//!   reader of version `v` reads the newest checkpoint at or below `v` and the entries after it.
//!
//! Costs: a commit writes its changes (plus, every `interval` versions, one checkpoint); the log
//! keeps the entries of the retained versions (their changes) and at most
//! [`KEPT_CHECKPOINTS`] + 1 checkpoints younger than an hour's grace; rebuilding a version reads
//! one checkpoint and at most `interval` − 1 entries when the checkpoints of its stretch are kept.

use crate::manifest::{parse_manifest, parse_manifest_fields, Manifest, ManifestShard};
use crate::names::{
    checkpoint_file_name, manifest_log_file_name, parse_checkpoint_file_name,
    parse_manifest_log_file_name, MANIFEST_LOG_DIR,
};
use crate::DatasetError;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

pub mod follow;

/// `log_format` of a delta entry.
pub const LOG_FORMAT_DELTA: u64 = 2;
/// Versions between checkpoints when the dataset does not set `checkpoint_interval`.
/// Measured (spec/performance.md §15): rebuilding a version then reads one checkpoint and at
/// most 99 entries of one commit each, while the log's checkpoints stay a small multiple of the
/// manifest.
pub const DEFAULT_CHECKPOINT_INTERVAL: u64 = 100;
/// Checkpoints kept behind the newest beyond the oldest one (older ones are removed by the commit
/// that writes a new one).
pub const KEPT_CHECKPOINTS: usize = 2;
/// Log entries always kept behind the newest by the prune of a retention-0 commit.
pub const KEPT_VERSIONS: u64 = 20;
/// A log file is removed by a commit's prune only once it is at least this old (ms): a reader
/// that listed the log before reads it still.
pub const PRUNE_GRACE_MS: u64 = 60 * 60 * 1000;

fn log_err(problem: String) -> DatasetError {
    DatasetError::Version { problem }
}

/// A file of `_manifest_log/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "version")]
pub enum LogFile {
    Entry(u64),
    Checkpoint(u64),
}

impl LogFile {
    /// The file's name in `_manifest_log/`.
    pub fn name(self) -> String {
        match self {
            LogFile::Entry(v) => manifest_log_file_name(v),
            LogFile::Checkpoint(v) => checkpoint_file_name(v),
        }
    }

    pub fn version(self) -> u64 {
        match self {
            LogFile::Entry(v) | LogFile::Checkpoint(v) => v,
        }
    }

    /// The log file a name is, `None` for other names (temporary files); a name of 20 digits
    /// beyond the largest version is an error naming it.
    pub fn parse(name: &str) -> Result<Option<LogFile>, DatasetError> {
        if let Some(v) = parse_checkpoint_file_name(name)? {
            return Ok(Some(LogFile::Checkpoint(v)));
        }
        Ok(parse_manifest_log_file_name(name)?.map(LogFile::Entry))
    }
}

/// The files of a `_manifest_log/` listing, ascending.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogFiles {
    pub entries: Vec<u64>,
    pub checkpoints: Vec<u64>,
}

impl LogFiles {
    /// From the names of a listing (other names are skipped).
    pub fn from_names<'a>(
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<LogFiles, DatasetError> {
        let mut out = LogFiles::default();
        for n in names {
            match LogFile::parse(n)? {
                Some(LogFile::Entry(v)) => out.entries.push(v),
                Some(LogFile::Checkpoint(v)) => out.checkpoints.push(v),
                None => {}
            }
        }
        out.entries.sort_unstable();
        out.entries.dedup();
        out.checkpoints.sort_unstable();
        out.checkpoints.dedup();
        Ok(out)
    }

    pub fn latest(&self) -> Option<u64> {
        self.entries.last().copied()
    }
}

/// What one version changed, as its entry records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// An entry written before log format 2 (or a checkpoint): the whole manifest.
    Full,
    /// The shards the version added and removed (whole shard records, so that history can say
    /// rows and bytes removed).
    Delta {
        add: Vec<ManifestShard>,
        remove: Vec<ManifestShard>,
    },
}

/// One entry (or checkpoint) of the log, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    pub version: u64,
    /// The version's manifest: whole for [`Change::Full`]; for a delta its own fields with
    /// `shards` empty (the totals are the version's).
    pub manifest: Manifest,
    pub change: Change,
    /// Shards the version lists.
    pub shards_count: u64,
    /// The version a delta entry was committed on (0: none before it); 0 for a whole manifest.
    pub base_version: u64,
    /// A delta entry whose `schema` is its base's (not written again: a commit that keeps the
    /// columns does not repeat them).
    pub schema_from_base: bool,
}

impl LogRecord {
    pub fn is_full(&self) -> bool {
        matches!(self.change, Change::Full)
    }

    /// The shards this record names as listed by its version: all of them for a whole manifest,
    /// the added ones for a delta.
    pub fn listed_or_added(&self) -> &[ManifestShard] {
        listed_or_added(&self.manifest, &self.change)
    }

    /// `committed_at_ms`, else `file_mtime_ms` (entries written before it was recorded).
    pub fn committed_at_ms(&self, file_mtime_ms: u64) -> u64 {
        self.manifest
            .ext
            .as_ref()
            .and_then(|x| x.committed_at_ms)
            .unwrap_or(file_mtime_ms)
    }
}

/// What a version names as listed: the whole manifest's shards, or a delta's added ones.
pub(crate) fn listed_or_added<'a>(
    manifest: &'a Manifest,
    change: &'a Change,
) -> &'a [ManifestShard] {
    match change {
        Change::Full => &manifest.shards,
        Change::Delta { add, .. } => add,
    }
}

/// A delta entry's `schema`, read from its text in column order.
#[derive(Deserialize)]
struct OrderedSchema {
    manifest: SchemaOnly,
}

#[derive(Deserialize)]
struct SchemaOnly {
    schema: crate::manifest::ColumnMap,
}

/// The delta entry as read (written by [`crate::commit::entry_text`]).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeltaEntry {
    log_format: u64,
    manifest_version: u64,
    base_version: u64,
    shards_count: u64,
    add: Vec<ManifestShard>,
    remove: Vec<ManifestShard>,
    /// The version's manifest without `shards`.
    manifest: serde_json::Map<String, serde_json::Value>,
}

/// The text of the log entry of `next` committed on top of `base` (`None`: nothing before it;
/// a base written by another tool counts as nothing, its shards are added): a delta entry
/// (spec/dataset.md §5.10) of what `next` lists that `base` does not and the reverse. A writer
/// that knows its changes commits them without the whole manifests: [`crate::commit`].
pub fn log_entry_text(base: Option<&Manifest>, next: &Manifest) -> Result<String, DatasetError> {
    let head = base.map(crate::commit::Head::of);
    crate::commit::entry_text(head.as_ref(), next, &crate::commit::diff(base, next))
}

fn entry_err(file: LogFile, e: impl std::fmt::Display) -> DatasetError {
    log_err(format!(
        "version {} ({MANIFEST_LOG_DIR}/{}): {e}",
        file.version(),
        file.name()
    ))
}

/// Parses a log file's text and checks that it agrees with its name (an error naming the file
/// otherwise): a checkpoint or a full entry is a whole manifest, a delta entry its changes.
pub fn parse_log_file(file: LogFile, text: &str) -> Result<LogRecord, DatasetError> {
    let version = file.version();
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| entry_err(file, e))?;
    let is_delta = value.get("log_format").is_some();
    let record = if is_delta {
        if matches!(file, LogFile::Checkpoint(_)) {
            return Err(entry_err(file, "a checkpoint must hold a whole manifest"));
        }
        let d: DeltaEntry = serde_json::from_value(value).map_err(|e| entry_err(file, e))?;
        if d.log_format != LOG_FORMAT_DELTA {
            return Err(entry_err(
                file,
                format!(
                    "log_format {} is not one this version reads (only {LOG_FORMAT_DELTA}); \
                     upgrade safetensors-spark",
                    d.log_format
                ),
            ));
        }
        if d.base_version >= d.manifest_version {
            return Err(entry_err(
                file,
                format!(
                    "base_version {} is not before manifest_version {}",
                    d.base_version, d.manifest_version
                ),
            ));
        }
        let mut fields = d.manifest;
        let schema_from_base = !fields.contains_key("schema");
        if schema_from_base && d.base_version == 0 {
            return Err(entry_err(
                file,
                "a first entry (base_version 0) must give the schema",
            ));
        }
        fields.insert("shards".into(), serde_json::Value::Array(Vec::new()));
        let own = serde_json::Value::Object(fields).to_string();
        let mut manifest = parse_manifest_fields(&own).map_err(|e| entry_err(file, e))?;
        if !schema_from_base {
            // the columns in their written order, from the text (the map above sorts them)
            let ordered: OrderedSchema =
                serde_json::from_str(text).map_err(|e| entry_err(file, e))?;
            manifest.schema = ordered.manifest.schema;
        }
        if manifest.manifest_version() != d.manifest_version {
            return Err(entry_err(
                file,
                "the entry's manifest_version fields disagree",
            ));
        }
        for s in d.add.iter().chain(&d.remove) {
            crate::check_shard_path(&s.shard_path).map_err(|e| entry_err(file, e))?;
        }
        LogRecord {
            version,
            manifest,
            change: Change::Delta {
                add: d.add,
                remove: d.remove,
            },
            shards_count: d.shards_count,
            base_version: d.base_version,
            schema_from_base,
        }
    } else {
        let manifest = parse_manifest(text).map_err(|e| entry_err(file, e))?;
        LogRecord {
            version,
            shards_count: manifest.shards.len() as u64,
            manifest,
            change: Change::Full,
            base_version: 0,
            schema_from_base: false,
        }
    };
    crate::own::check_log_entry(version, &record.manifest)?;
    Ok(record)
}

/// A version's state being rebuilt: its shards by name (in manifest order) and the newest
/// record's own fields.
#[derive(Debug, Default)]
pub struct Replay {
    shards: BTreeMap<String, ManifestShard>,
    header: Option<Manifest>,
}

impl Replay {
    /// Starts from a whole manifest (a checkpoint or a full entry).
    pub fn from_manifest(m: &Manifest) -> Replay {
        let mut header = m.clone();
        let shards = std::mem::take(&mut header.shards)
            .into_iter()
            .map(|s| (s.shard_path.clone(), s))
            .collect();
        Replay {
            shards,
            header: Some(header),
        }
    }

    /// The version reached (0 before any record).
    pub fn version(&self) -> u64 {
        self.header.as_ref().map_or(0, Manifest::manifest_version)
    }

    /// The shards listed now, by name.
    pub fn shards(&self) -> &BTreeMap<String, ManifestShard> {
        &self.shards
    }

    /// The columns of the version reached (`None` before any record).
    pub fn schema(&self) -> Option<&crate::manifest::ColumnMap> {
        self.header.as_ref().map(|h| &h.schema)
    }

    /// Applies the next version's record: a full one replaces the state, a delta one must follow
    /// the version reached and agree with it (its removed shards listed as recorded, its added
    /// ones not listed yet): a log that does not is damaged, and the error names the entry.
    pub fn apply(&mut self, r: &LogRecord) -> Result<(), DatasetError> {
        match &r.change {
            Change::Full => {
                *self = Replay::from_manifest(&r.manifest);
                return Ok(());
            }
            Change::Delta { add, remove } => {
                let file = LogFile::Entry(r.version);
                let reached = self.version();
                if reached != r.base_version {
                    return Err(entry_err(
                        file,
                        format!(
                            "was committed on version {}, but the replay reached version \
                             {reached}: the entries between are missing",
                            r.base_version
                        ),
                    ));
                }
                for s in remove {
                    if self.shards.get(&s.shard_path) != Some(s) {
                        return Err(entry_err(
                            file,
                            format!(
                                "removes shard {}, which version {reached} does not list as \
                                 recorded: the log is damaged",
                                s.shard_path
                            ),
                        ));
                    }
                    self.shards.remove(&s.shard_path);
                }
                for s in add {
                    if self
                        .shards
                        .insert(s.shard_path.clone(), s.clone())
                        .is_some()
                    {
                        return Err(entry_err(
                            file,
                            format!(
                                "adds shard {}, which version {reached} lists already: the log is \
                                 damaged",
                                s.shard_path
                            ),
                        ));
                    }
                }
                let mut header = r.manifest.clone();
                if r.schema_from_base {
                    match &self.header {
                        Some(h) => header.schema = h.schema.clone(),
                        None => {
                            return Err(entry_err(file, "keeps its base's schema, but has no base"))
                        }
                    }
                }
                self.header = Some(header);
            }
        }
        Ok(())
    }

    /// The whole manifest of the version reached, validated (its totals against its shards).
    pub fn manifest(&self) -> Result<Manifest, DatasetError> {
        let Some(h) = &self.header else {
            return Err(log_err("no version was replayed".into()));
        };
        let mut m = h.clone();
        m.shards = self.shards.values().cloned().collect();
        m.validate().map_err(|e| {
            log_err(format!(
                "version {} rebuilt from {MANIFEST_LOG_DIR}/: {e}",
                m.manifest_version()
            ))
        })?;
        Ok(m)
    }
}

/// What rebuilding a version needs next: files to read, or the manifest.
#[derive(Debug)]
pub enum StatePlan {
    Read(Vec<LogFile>),
    Done(Box<Manifest>),
}

/// Rebuilds the whole manifest of `version` from the log `files` lists, given the `read` files'
/// texts so far: the newest checkpoint at or below `version` and the entries after it; without
/// one, the version's own entry (a full entry is enough), else every entry up to it. Callers
/// read what [`StatePlan::Read`] names and call again (at most twice more); a version that cannot
/// be rebuilt is an error saying why.
pub fn plan_state(
    files: &LogFiles,
    version: u64,
    read: &BTreeMap<LogFile, String>,
) -> Result<StatePlan, DatasetError> {
    let checkpoint = files
        .checkpoints
        .iter()
        .rev()
        .find(|c| **c <= version)
        .copied();
    let mut needed: Vec<LogFile> = Vec::new();
    match checkpoint {
        Some(c) => {
            needed.push(LogFile::Checkpoint(c));
            needed.extend(
                files
                    .entries
                    .iter()
                    .filter(|e| **e > c && **e <= version)
                    .map(|e| LogFile::Entry(*e)),
            );
        }
        None => {
            let own = LogFile::Entry(version);
            if !files.entries.contains(&version) {
                return Err(missing(files, version));
            }
            match read.get(&own) {
                None => return Ok(StatePlan::Read(vec![own])),
                Some(t) => {
                    let r = parse_log_file(own, t)?;
                    if r.is_full() {
                        return Ok(StatePlan::Done(Box::new(r.manifest)));
                    }
                }
            }
            needed.extend(
                files
                    .entries
                    .iter()
                    .filter(|e| **e <= version)
                    .map(|e| LogFile::Entry(*e)),
            );
        }
    }
    let missing_texts: Vec<LogFile> = needed
        .iter()
        .filter(|f| !read.contains_key(f))
        .copied()
        .collect();
    if !missing_texts.is_empty() {
        return Ok(StatePlan::Read(missing_texts));
    }
    let mut replay = Replay::default();
    for f in &needed {
        let r = parse_log_file(*f, &read[f])?;
        // a delta starts a replay only when nothing came before it
        if replay.header.is_none() && !r.is_full() && r.base_version != 0 {
            continue;
        }
        if replay.header.is_some() && r.version <= replay.version() {
            continue;
        }
        replay.apply(&r)?;
    }
    if replay.version() != version {
        return Err(log_err(format!(
            "version {version} cannot be rebuilt from {MANIFEST_LOG_DIR}/: no checkpoint at or \
             below it and the entries before it are not all kept (kept: {})",
            kept(files)
        )));
    }
    Ok(StatePlan::Done(Box::new(replay.manifest()?)))
}

fn kept(files: &LogFiles) -> String {
    match (files.entries.first(), files.entries.last()) {
        (Some(a), Some(b)) => format!("versions {a}…{b}, checkpoints {:?}", files.checkpoints),
        _ => "nothing".into(),
    }
}

fn missing(files: &LogFiles, version: u64) -> DatasetError {
    match files.latest() {
        Some(l) if version > l => log_err(format!(
            "version {version} was never committed; the latest version is {l}"
        )),
        _ => log_err(format!(
            "version {version} is no longer in the manifest log (kept: {}); it was pruned or \
             vacuumed",
            kept(files)
        )),
    }
}

/// [`plan_state`] for callers that list and read through their own file systems (the JVM, the
/// Python package): the log's file `names` as listed and the texts read so far by name.
pub fn plan_state_by_names(
    names: &[String],
    version: u64,
    texts: BTreeMap<String, String>,
) -> Result<StatePlan, DatasetError> {
    let (files, read) = files_and_texts(names, texts)?;
    plan_state(&files, version, &read)
}

/// A listing's names and the texts read so far by name, as the plans take them.
pub(crate) fn files_and_texts(
    names: &[String],
    texts: BTreeMap<String, String>,
) -> Result<(LogFiles, BTreeMap<LogFile, String>), DatasetError> {
    let files = LogFiles::from_names(names.iter().map(String::as_str))?;
    let mut read = BTreeMap::new();
    for (name, text) in texts {
        if let Some(f) = LogFile::parse(&name)? {
            read.insert(f, text);
        }
    }
    Ok((files, read))
}

/// Whether an error of [`rebuild`]'s reader is a file that is gone (removed by a commit after the
/// listing): callers list again and retry.
pub fn is_gone(e: &DatasetError) -> bool {
    matches!(e, DatasetError::Version { problem } if problem.contains(GONE))
}

/// The words a reader's error holds for a log file that is gone (see [`is_gone`]).
pub const GONE: &str = "is gone (removed after the log was listed)";

/// Rebuilds `version` reading files through `read_file` (the local directory's reader, tests).
pub fn rebuild(
    files: &LogFiles,
    version: u64,
    read_file: &mut dyn FnMut(LogFile) -> Result<String, DatasetError>,
) -> Result<Manifest, DatasetError> {
    let mut read = BTreeMap::new();
    loop {
        match plan_state(files, version, &read)? {
            StatePlan::Done(m) => return Ok(*m),
            StatePlan::Read(need) => {
                for f in need {
                    let t = read_file(f)?;
                    read.insert(f, t);
                }
            }
        }
    }
}

/// The checkpoint interval of a dataset: its manifest's `checkpoint_interval`, else the default.
pub fn checkpoint_interval(m: &Manifest) -> u64 {
    m.ext
        .as_ref()
        .and_then(|x| x.checkpoint_interval)
        .filter(|n| *n >= 1)
        .unwrap_or(DEFAULT_CHECKPOINT_INTERVAL)
}

/// A listed log file with its modification time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedFile {
    pub file: LogFile,
    pub modified_ms: u64,
}

/// What the committer of `version` (its manifest `next`) does after its entry exists, outside
/// the commit's critical section (spec/dataset.md §5.10).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AfterCommit {
    /// Write `next` as the checkpoint of `version`.
    pub write_checkpoint: bool,
    /// Log files to delete (best effort; a reader that finds one gone lists again).
    pub delete: Vec<LogFile>,
}

/// The after-commit chores of `version` given the log's listing (taken after its entry was
/// created): a checkpoint when `version` is a multiple of the interval or the log has none yet;
/// with `prune_entries` (retention 0: nothing is kept for time travel), the entries and
/// checkpoints below the newest checkpoint that is [`KEPT_VERSIONS`] or more behind, once older
/// than [`PRUNE_GRACE_MS`] (a writer's base); and, at once, the checkpoints superseded by more
/// than [`KEPT_CHECKPOINTS`] newer ones (the oldest is kept: it is where a replay of the oldest
/// versions starts; a reader that finds a checkpoint gone lists again).
pub fn after_commit(
    listing: &[ListedFile],
    version: u64,
    next: &Manifest,
    prune_entries: bool,
    now_ms: u64,
) -> AfterCommit {
    let interval = checkpoint_interval(next);
    let mut checkpoints: Vec<u64> = listing
        .iter()
        .filter_map(|f| match f.file {
            LogFile::Checkpoint(v) => Some(v),
            LogFile::Entry(_) => None,
        })
        .collect();
    checkpoints.sort_unstable();
    let write_checkpoint = version.is_multiple_of(interval) || checkpoints.is_empty();
    if write_checkpoint && !checkpoints.contains(&version) {
        checkpoints.push(version);
        checkpoints.sort_unstable();
    }
    let old = |f: &ListedFile| f.modified_ms.saturating_add(PRUNE_GRACE_MS) <= now_ms;
    let mut delete = BTreeSet::new();
    if prune_entries {
        if let Some(floor) = checkpoints
            .iter()
            .rev()
            .find(|c| **c + KEPT_VERSIONS <= version)
            .copied()
        {
            for f in listing
                .iter()
                .filter(|f| f.file.version() < floor && old(f))
            {
                delete.insert(f.file);
            }
        }
    }
    // superseded checkpoints go at once: a reader that listed one and finds it gone lists again
    // and replays from a newer one ([`rebuild`] and the JVM's and Python's loops retry)
    if checkpoints.len() > KEPT_CHECKPOINTS + 1 {
        let keep_from = checkpoints[checkpoints.len() - KEPT_CHECKPOINTS - 1];
        let oldest = checkpoints[0];
        for f in listing {
            if let LogFile::Checkpoint(c) = f.file {
                if c != oldest && c < keep_from {
                    delete.insert(f.file);
                }
            }
        }
    }
    AfterCommit {
        write_checkpoint,
        delete: delete.into_iter().collect(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
pub(crate) mod tests;
