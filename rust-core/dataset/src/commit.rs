//! What a commit writes to the manifest log, at the cost of what it changes (spec/dataset.md
//! §5.10): its base is a [`Head`] (the base version's own fields and shard count, never its shard
//! list), its change the shards it adds and removes as the writer knows them ([`Changes`]), and
//! the after-commit chores list `_manifest_log/` only when they may have work
//! ([`chores_need_listing`]). A caller that holds two whole manifests diffs them ([`diff`]); the
//! entry is the same either way.

use crate::log::{checkpoint_interval, Change, LogRecord, LOG_FORMAT_DELTA};
use crate::manifest::{Manifest, ManifestShard};
use crate::DatasetError;
use serde::Serialize;
use std::collections::BTreeMap;

fn commit_err(problem: String) -> DatasetError {
    DatasetError::Version { problem }
}

/// What a commit needs of its base version: its own fields (the manifest without `shards`,
/// schema included) and how many shards it lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The base's manifest with `shards` empty (its totals are the version's).
    pub manifest: Manifest,
    pub shards_count: u64,
    /// Read from the base's own delta entry (a log this connector continues), not from a whole
    /// manifest: the log then holds a checkpoint already, and a commit on it has no chores
    /// between checkpoint versions ([`chores_need_listing`]).
    pub from_delta_entry: bool,
}

impl Head {
    /// The head of a whole manifest.
    pub fn of(m: &Manifest) -> Head {
        Head {
            manifest: Manifest::clone_without_shards(m),
            shards_count: m.shards.len() as u64,
            from_delta_entry: false,
        }
    }

    /// The head of a version read from its own log entry: `None` for an entry that keeps its
    /// base's schema (written before entries always gave it) — the caller reads the whole base.
    pub fn of_record(r: LogRecord) -> Option<Head> {
        match r.change {
            Change::Delta { .. } if !r.schema_from_base => Some(Head {
                manifest: r.manifest,
                shards_count: r.shards_count,
                from_delta_entry: true,
            }),
            Change::Delta { .. } => None,
            Change::Full => Some(Head::of(&r.manifest)),
        }
    }

    pub fn version(&self) -> u64 {
        self.manifest.manifest_version()
    }

    /// The own fields of the version `changes` make on top of this one: the version one more,
    /// the totals (rows, bytes, padding) moved by what they add and remove; the writer stamps
    /// the rest (operation, time, message). `None` when they remove more than the base holds.
    pub fn next_fields(&self, changes: &Changes) -> Option<Manifest> {
        let mut m = self.manifest.clone();
        let moved = |base: u64, f: &dyn Fn(&ManifestShard) -> u64| {
            let plus: u64 = changes.add.iter().map(f).sum();
            let minus: u64 = changes.remove.iter().map(f).sum();
            (base + plus).checked_sub(minus)
        };
        m.total_samples = moved(m.total_samples, &|s| s.samples_count)?;
        m.total_bytes = moved(m.total_bytes, &|s| s.bytes)?;
        if let Some(x) = &mut m.ext {
            x.padded_samples = moved(x.padded_samples, &ManifestShard::padded)?;
            x.manifest_version += 1;
        }
        Some(m)
    }
}

/// The shards a version adds and removes (whole records: a removed one as its base lists it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub add: Vec<ManifestShard>,
    pub remove: Vec<ManifestShard>,
}

/// A manifest of another tool (version 0) is no version of the log: an entry on it starts the
/// log, and its shards are added.
fn log_base<T>(base: Option<T>, version: impl Fn(&T) -> u64) -> Option<T> {
    base.filter(|b| version(b) > 0)
}

/// What `next` changes against `base` (`None`, or a base of version 0: nothing before): the
/// shards `next` lists and `base` does not, and the reverse. A shard listed by both with other
/// facts (never written by this connector: names are unique per write) is removed and added.
pub fn diff(base: Option<&Manifest>, next: &Manifest) -> Changes {
    let base = log_base(base, |b| b.manifest_version());
    shard_changes(base.map_or(&[][..], |b| &b.shards), &next.shards)
}

/// What a list of shards `after` changes against `before`: the shards `after` lists and
/// `before` does not (or lists with other facts), in `after`'s order, and the reverse, in
/// `before`'s.
pub fn shard_changes(before: &[ManifestShard], after: &[ManifestShard]) -> Changes {
    let by_name = |list: &[ManifestShard]| -> BTreeMap<String, ManifestShard> {
        list.iter()
            .map(|s| (s.shard_path.clone(), s.clone()))
            .collect()
    };
    let (b, a) = (by_name(before), by_name(after));
    Changes {
        add: after
            .iter()
            .filter(|s| b.get(&s.shard_path) != Some(*s))
            .cloned()
            .collect(),
        remove: before
            .iter()
            .filter(|s| a.get(&s.shard_path) != Some(*s))
            .cloned()
            .collect(),
    }
}

/// The next version of an append of `new` (this write's manifest: its shards and columns) on top
/// of the version whose head is `base`, a streaming micro-batch's when `batch` is given: the
/// rules of [`crate::manifest::next_manifest`] / [`crate::manifest::next_stream_manifest`]
/// (the write must fit the dataset; a batch the base records already is refused) applied without
/// the base's shard list. Returns the version's own fields (its `shards` are the ones it adds,
/// its totals the whole version's) and its changes, for [`entry_text`]: a cost that follows the
/// write and the columns, never the shards the dataset holds. The version's whole manifest is the
/// base's with the changes applied ([`crate::log::Replay`]), made after the commit. `None` for a
/// write of no rows (no shard to add): the version's columns are then the base's by the rule of
/// a whole manifest (a version without shards has none), so the caller commits on the whole base.
pub fn next_append_on_head(
    base: &Head,
    new: &Manifest,
    batch: Option<&crate::manifest::StreamBatch>,
) -> Result<Option<(Manifest, Changes)>, DatasetError> {
    if new.shards.is_empty() {
        return Ok(None);
    }
    let fields = &base.manifest;
    let mut next = match batch {
        Some(b) => crate::manifest::next_stream_manifest(Some(fields), new, &[], b)?,
        None => crate::manifest::next_manifest(Some(fields), new, true, &[])?,
    };
    // the base lists none of its shards here: what `next` lists is what the version adds
    let changes = Changes {
        add: std::mem::take(&mut next.shards),
        remove: Vec::new(),
    };
    let moved = base.next_fields(&changes).ok_or_else(|| {
        commit_err(format!(
            "version {} does not follow from its base's totals",
            next.manifest_version()
        ))
    })?;
    next.total_samples = moved.total_samples;
    next.total_bytes = moved.total_bytes;
    if let (Some(x), Some(m)) = (&mut next.ext, &moved.ext) {
        x.padded_samples = m.padded_samples;
    }
    next.shards = changes.add.clone();
    Ok(Some((next, changes)))
}

/// The delta entry as written (the field order is the reader's, `log::DeltaEntry`).
#[derive(Serialize)]
struct Entry<'a> {
    log_format: u64,
    manifest_version: u64,
    base_version: u64,
    shards_count: u64,
    add: &'a [ManifestShard],
    remove: &'a [ManifestShard],
    manifest: Fields<'a>,
}

/// A version's own fields as an entry writes them: `schema` through its own serialiser, which
/// keeps the columns in their written order (a JSON map value would sort them).
#[derive(Serialize)]
struct Fields<'a> {
    schema: &'a crate::manifest::ColumnMap,
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

/// The text of the log entry of version `next` committed on `base` with `changes` (spec/dataset.md
/// §5.10). `next` gives the version's own fields (its `shards`, if any, are not read): what it
/// costs follows the change and the columns, not the shards the dataset holds. Its totals must be
/// the base's plus what `changes` adds minus what it removes, and its version must follow the
/// base's: an error says which does not.
pub fn entry_text(
    base: Option<&Head>,
    next: &Manifest,
    changes: &Changes,
) -> Result<String, DatasetError> {
    let base = log_base(base, |b| b.version());
    let version = next.manifest_version();
    let base_version = base.map_or(0, Head::version);
    if version <= base_version {
        return Err(commit_err(format!(
            "version {version} cannot be committed on version {base_version}"
        )));
    }
    let sum = |s: &[ManifestShard]| {
        s.iter().fold((0u64, 0u64, 0u64), |(n, r, b), x| {
            (n + 1, r + x.samples_count, b + x.bytes)
        })
    };
    let (base_shards, base_rows, base_bytes) = base.map_or((0, 0, 0), |b| {
        (
            b.shards_count,
            b.manifest.total_samples,
            b.manifest.total_bytes,
        )
    });
    let (add, remove) = (sum(&changes.add), sum(&changes.remove));
    let total = |b: u64, plus: u64, minus: u64| (b + plus).checked_sub(minus);
    let shards_count = total(base_shards, add.0, remove.0);
    if shards_count.is_none()
        || total(base_rows, add.1, remove.1) != Some(next.total_samples)
        || total(base_bytes, add.2, remove.2) != Some(next.total_bytes)
    {
        return Err(commit_err(format!(
            "version {version} does not follow from version {base_version} and its changes: \
             totals {} rows / {} bytes, but the base's {base_rows} / {base_bytes} plus {} / {} \
             added minus {} / {} removed (of {base_shards} shards)",
            next.total_samples, next.total_bytes, add.1, add.2, remove.1, remove.2
        )));
    }
    // the version's own fields, schema included (a commit on this version reads them from this
    // entry alone), without its shards
    let mut fields = match serde_json::to_value(Manifest::clone_without_shards(next)) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => {
            return Err(commit_err(
                "a manifest did not serialise as an object".into(),
            ))
        }
    };
    fields.remove("shards");
    fields.remove("schema");
    let entry = Entry {
        log_format: LOG_FORMAT_DELTA,
        manifest_version: version,
        base_version,
        shards_count: shards_count.unwrap_or(0),
        add: &changes.add,
        remove: &changes.remove,
        manifest: Fields {
            schema: &next.schema,
            rest: fields,
        },
    };
    let mut s = serde_json::to_string(&entry).map_err(|e| commit_err(e.to_string()))?;
    s.push('\n');
    Ok(s)
}

/// Whether the committer of `version` (its own fields `next`, committed on `base`) lists
/// `_manifest_log/` for its chores ([`crate::log::after_commit`]): only when they may have work —
/// `version` is a multiple of the checkpoint interval (a checkpoint to write, superseded ones to
/// remove), the log may hold no checkpoint yet (the first commit, or a base not read from a
/// delta entry: an older log), or `prune_entries` (retention 0). Otherwise the chores are none:
/// the log's newest checkpoint is behind, and no checkpoint is superseded between two multiples.
pub fn chores_need_listing(
    version: u64,
    next: &Manifest,
    base: Option<&Head>,
    prune_entries: bool,
) -> bool {
    prune_entries
        || version.is_multiple_of(checkpoint_interval(next))
        || !base.is_some_and(|b| b.from_delta_entry && b.version() > 0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
