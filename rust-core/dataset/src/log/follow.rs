//! Following a dataset's versions (spec/dataset.md §5.12): what a reader that has read every
//! row of version `after` reads next to reach version `upto` — the shards the versions between
//! added — and which versions it cannot follow. The one home of these rules: Spark's
//! `readStream` source calls them through `NativeLog.follow`, the Python package's `follow=True`
//! through `_native.follow_versions`.
//!
//! What each kind of version means to a follower:
//! * `create`, `append`, `stream_batch` (and versions of other tools' manifests with no
//!   `operation`) add shards: the follower reads them.
//! * `compaction` removes shards and adds their rows again in fewer: nothing new to read.
//! * `vacuum` lists the same shards: nothing to read.
//! * `overwrite` and `delete` remove rows the follower has read (or is reading): a **change
//!   version**. A follower fails on it naming the version, unless it asked to skip change
//!   versions ([`OnChange::Skip`]); then the version is passed over whole, its added shards too
//!   (as Delta Lake's `skipChangeCommits`).
//! * A version that changes the columns cannot be read with the columns the follower started
//!   with: an error, unless it is a skipped change version.
//!
//! Costs: the entries after `after` up to `upto` are read, each once (a delta entry is its
//! changes). An entry written before log format 2 (a whole manifest) is compared with the version
//! before it, rebuilt once by [`super::plan_state`]; after that the replay carries on in memory.

use super::{parse_log_file, plan_state, Change, LogFile, LogFiles, LogRecord, Replay, StatePlan};
use crate::manifest::{parse_manifest, ColumnMap, Manifest, ManifestShard, Operation};
use crate::names::MANIFEST_LOG_DIR;
use crate::DatasetError;
use serde::Serialize;
use std::collections::BTreeMap;

/// What a follower does on a version that removes rows (an overwrite, a delete).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnChange {
    /// An error naming the version and the option that skips it.
    Fail,
    /// The version is passed over whole: its added shards are not read either.
    Skip,
}

/// What a version gives a follower.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Followed {
    /// New rows: the shards to read.
    Rows,
    /// Nothing new (a compaction, a vacuum, a commit of no shards).
    Nothing,
    /// A change version passed over ([`OnChange::Skip`]).
    Skipped,
}

/// One version after the follower's, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FollowedVersion {
    pub version: u64,
    /// The version's `operation`; `None` for manifests that do not record it.
    pub operation: Option<Operation>,
    /// `committed_at_ms` of the version (`None` when it was not recorded).
    pub committed_at_ms: Option<u64>,
    pub followed: Followed,
    /// The shards to read, sorted by name (empty unless [`Followed::Rows`]).
    pub add: Vec<ManifestShard>,
}

/// What following needs next: log files to read, or the versions.
#[derive(Debug)]
pub enum FollowPlan {
    Read(Vec<LogFile>),
    Done(Vec<FollowedVersion>),
}

fn follow_err(problem: String) -> DatasetError {
    DatasetError::Version { problem }
}

fn operation(m: &Manifest) -> Option<Operation> {
    m.ext.as_ref().and_then(|x| x.operation)
}

/// Classifies one version for a follower (the rules of the module's documentation).
fn classify(
    r: &LogRecord,
    add: Vec<ManifestShard>,
    remove: &[ManifestShard],
    schema_changed: bool,
    on_change: OnChange,
    skip_option: &str,
) -> Result<FollowedVersion, DatasetError> {
    let op = operation(&r.manifest);
    let mut out = FollowedVersion {
        version: r.version,
        operation: op,
        committed_at_ms: r.manifest.ext.as_ref().and_then(|x| x.committed_at_ms),
        followed: Followed::Nothing,
        add: Vec::new(),
    };
    let what = op.map_or_else(
        || "a version".to_string(),
        |o| {
            let s = serde_json::to_value(o).ok();
            format!(
                "a version of operation {}",
                s.as_ref().and_then(|v| v.as_str()).unwrap_or("?")
            )
        },
    );
    let rewrite = matches!(op, Some(Operation::Compaction | Operation::Vacuum));
    if !remove.is_empty() && !rewrite {
        if on_change == OnChange::Skip {
            out.followed = Followed::Skipped;
            return Ok(out);
        }
        let rows: u64 = remove.iter().map(|s| s.samples_count).sum();
        return Err(follow_err(format!(
            "version {} is {what} that removes {} shard(s) holding {rows} row(s), which a reader \
             following the dataset read or is reading: it cannot be followed. Set {skip_option}=true \
             to pass over versions that change existing rows (their added shards are passed over \
             too), or start again from version {} or later",
            r.version,
            remove.len(),
            r.version
        )));
    }
    if schema_changed {
        return Err(follow_err(format!(
            "version {} is {what} that changes the dataset's columns; a reader following it with \
             the columns it started with cannot read it: start again from version {} or later",
            r.version, r.version
        )));
    }
    if !add.is_empty() && !rewrite {
        out.followed = Followed::Rows;
        out.add = add;
    }
    Ok(out)
}

/// What a reader at version `after` reads to reach version `upto` (`after` < `upto`; `after` 0:
/// from the start), from the log `files` lists and the texts `read` so far: every version
/// between, classified. Callers read what [`FollowPlan::Read`] names and call again. `skip_option`
/// is the name of the caller's option that asks for [`OnChange::Skip`] (errors name it).
pub fn plan_follow(
    files: &LogFiles,
    after: u64,
    upto: u64,
    read: &BTreeMap<LogFile, String>,
    on_change: OnChange,
    skip_option: &str,
) -> Result<FollowPlan, DatasetError> {
    if upto <= after {
        return Ok(FollowPlan::Done(Vec::new()));
    }
    if let Some(latest) = files.latest() {
        if upto > latest {
            return Err(follow_err(format!(
                "version {upto} was never committed; the latest version is {latest}"
            )));
        }
    }
    let wanted: Vec<LogFile> = (after + 1..=upto).map(LogFile::Entry).collect();
    let kept: std::collections::BTreeSet<u64> = files.entries.iter().copied().collect();
    if let Some(gone) = wanted.iter().find(|f| !kept.contains(&f.version())) {
        return Err(follow_err(format!(
            "version {} is no longer in {MANIFEST_LOG_DIR}/ (kept: {}): it was vacuumed or pruned \
             before a reader following the dataset from version {after} read it; start again \
             from a kept version",
            gone.version(),
            super::kept(files)
        )));
    }
    // the columns of version `after`, which the follower reads with: from its own entry when
    // that gives them (a whole manifest, or a delta entry that writes its schema), else rebuilt
    let own = LogFile::Entry(after);
    let own_kept = after > 0 && kept.contains(&after);
    let unread: Vec<LogFile> = wanted
        .iter()
        .chain(own_kept.then_some(&own))
        .filter(|f| !read.contains_key(f))
        .copied()
        .collect();
    if !unread.is_empty() {
        return Ok(FollowPlan::Read(unread));
    }
    let records = wanted
        .iter()
        .map(|f| parse_log_file(*f, &read[f]))
        .collect::<Result<Vec<_>, _>>()?;
    let mut columns: Option<ColumnMap> = None;
    if after > 0 {
        if own_kept {
            let r = parse_log_file(own, &read[&own])?;
            if !r.schema_from_base {
                columns = known(r.manifest.schema);
            }
        }
        if columns.is_none() {
            // (a version no longer rebuildable: its columns are not known, the first entry's
            // are taken as the follower's)
            match plan_state(files, after, read) {
                Ok(StatePlan::Read(need)) => return Ok(FollowPlan::Read(need)),
                Ok(StatePlan::Done(m)) => columns = known(m.schema),
                Err(_) => {}
            }
        }
    }
    // the state before the first whole-manifest entry, when there is one: its changes are
    // its difference from the version before
    let mut state: Option<Replay> = None;
    if let Some(first_full) = records.iter().find(|r| r.is_full()) {
        let before = first_full.version - 1;
        let before_state = if before == 0 {
            Replay::default()
        } else {
            match plan_state(files, before, read)? {
                StatePlan::Read(need) => return Ok(FollowPlan::Read(need)),
                StatePlan::Done(m) => Replay::from_manifest(&m),
            }
        };
        // the replay starts there; delta entries before it need no state
        state = Some(before_state);
    }
    let mut previous = columns.clone();
    let mut out = Vec::with_capacity(records.len());
    for r in &records {
        let tracked = state.as_ref().filter(|s| s.version() + 1 == r.version);
        let (add, remove) = match &r.change {
            Change::Delta { add, remove } => {
                let mut add = add.clone();
                add.sort_by(|a, b| a.shard_path.cmp(&b.shard_path));
                (add, remove.clone())
            }
            Change::Full => {
                let Some(s) = tracked else {
                    return Err(follow_err(format!(
                        "version {}'s entry ({MANIFEST_LOG_DIR}/{}) holds a whole manifest, and \
                         the version before it could not be rebuilt to compare it with",
                        r.version,
                        LogFile::Entry(r.version).name()
                    )));
                };
                let before: Vec<ManifestShard> = s.shards().values().cloned().collect();
                let c = crate::commit::shard_changes(&before, &r.manifest.shards);
                let mut add = c.add;
                add.sort_by(|a, b| a.shard_path.cmp(&b.shard_path));
                (add, c.remove)
            }
        };
        // an entry that leaves its schema to its base keeps its base's columns; the follower
        // reads with the columns of its version (from the start, or from an empty version: the
        // first version's that has any)
        let now = if r.schema_from_base {
            previous.clone()
        } else {
            known(r.manifest.schema.clone())
        };
        if columns.is_none() {
            columns = now.clone();
        }
        let schema_changed = matches!((&columns, &now), (Some(a), Some(b)) if a != b);
        previous = now;
        out.push(classify(
            r,
            add,
            &remove,
            schema_changed,
            on_change,
            skip_option,
        )?);
        if let Some(s) = state.as_mut() {
            if s.version() + 1 == r.version || r.is_full() {
                s.apply(r)?;
            }
        }
    }
    Ok(FollowPlan::Done(out))
}

/// A version's columns as the follower compares them: none for an empty dataset (`schema: {}`,
/// an overwrite or delete that left no shard), whose next rows may bring any columns.
fn known(schema: ColumnMap) -> Option<ColumnMap> {
    (!schema.0.is_empty()).then_some(schema)
}

/// [`plan_follow`] for callers that list and read through their own file systems (the JVM, the
/// Python package): the log's file `names` as listed and the texts read so far by name.
pub fn plan_follow_by_names(
    names: &[String],
    after: u64,
    upto: u64,
    texts: BTreeMap<String, String>,
    on_change: OnChange,
    skip_option: &str,
) -> Result<FollowPlan, DatasetError> {
    let (files, read) = super::files_and_texts(names, texts)?;
    plan_follow(&files, after, upto, &read, on_change, skip_option)
}

/// The manifest a follower reads a batch of followed shards with: `base` (a version's whole
/// manifest: the dataset's columns, mode and settings) listing only `shards` (records as
/// [`FollowedVersion::add`] or a version's own list gives them), sorted by name, its totals
/// those of the shards. Spark's `readStream` reads each micro-batch through the batch read path
/// with it. No shards, or a shard listed twice, is an error: a batch reads each shard once.
pub fn manifest_listing(base: &str, shards: Vec<ManifestShard>) -> Result<String, DatasetError> {
    let mut m = parse_manifest(base)?;
    let mut shards = shards;
    shards.sort_by(|a, b| a.shard_path.cmp(&b.shard_path));
    if shards.is_empty() {
        return Err(follow_err(
            "a batch of followed shards lists no shard".into(),
        ));
    }
    if let Some(w) = shards
        .windows(2)
        .find(|w| w[0].shard_path == w[1].shard_path)
    {
        return Err(follow_err(format!(
            "a batch of followed shards lists {} twice",
            w[0].shard_path
        )));
    }
    m.shards = shards;
    m.recompute_totals();
    m.validate()?;
    m.to_json_pretty()
}
