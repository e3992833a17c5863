//! A delete run on a local dataset directory (spec/dataset.md §5.11): plan on the latest
//! version, write the rewritten shards, commit rebased on concurrent appends (the compaction's
//! runner, [`crate::compaction::local`]). What the CLI and the Python package run; the Spark
//! connector runs the same plan through Hadoop's file systems.

use super::{plan_delete_keys, plan_delete_rows};
use crate::compaction::local::{execute_plan, ExecuteOptions, IndexPartWriter};
use crate::compaction::CompactionPlan;
use crate::local::{latest, LocalError};
use crate::manifest::Manifest;
use crate::names::{
    shard_index_part_file_name, INDEX_DIR_NAME, MANIFEST_FILE_NAME, MANIFEST_LOG_DIR,
};
use crate::progress::NoProgress;
use crate::DatasetError;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What a delete is told besides what to delete.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    /// Plan only: nothing is written.
    pub dry_run: bool,
    /// Recorded as the version's `commit_message`.
    pub commit_message: Option<String>,
}

/// What a delete did (or, dry, would do).
#[derive(Debug, Clone, Serialize)]
pub struct DeleteOutcome {
    pub dataset: PathBuf,
    pub plan: CompactionPlan,
    pub dry_run: bool,
    /// The delete version committed (None when dry or when nothing matched).
    pub version: Option<u64>,
    /// The version it was committed on top of (its plan's base, or newer after appends).
    pub committed_on: Option<u64>,
    /// Rows (KV: keys) removed.
    pub rows_removed: u64,
    /// Whether the replaced shards were deleted at commit (retention 0) or left for a vacuum.
    pub replaced_deleted: bool,
}

fn ds_err(path: &Path, source: DatasetError) -> LocalError {
    LocalError::Dataset {
        path: path.to_path_buf(),
        source,
    }
}

fn base_of(dir: &Path) -> Result<Manifest, LocalError> {
    latest(dir, &[])?.ok_or_else(|| {
        ds_err(
            dir,
            DatasetError::Delete {
                problem: format!(
                    "not a dataset: no {MANIFEST_FILE_NAME} and no {MANIFEST_LOG_DIR}/"
                ),
            },
        )
    })
}

fn run(
    dir: &Path,
    base: &Manifest,
    plan: CompactionPlan,
    opts: &DeleteOptions,
    index_writer: Option<IndexPartWriter>,
    after_write: &mut dyn FnMut(&CompactionPlan),
) -> Result<DeleteOutcome, LocalError> {
    if let Some(m) = &opts.commit_message {
        crate::manifest::check_commit_message(m).map_err(|e| ds_err(dir, e))?;
    }
    let index_dir = dir.join(INDEX_DIR_NAME);
    let own_index = crate::own::own_dir(dir, INDEX_DIR_NAME).map_err(|source| LocalError::Io {
        path: index_dir.clone(),
        source,
    })?;
    let indexed = own_index.is_some()
        && base.shards.iter().any(|s| {
            shard_index_part_file_name(&s.shard_path).is_some_and(|p| index_dir.join(p).is_file())
        });
    let mut outcome = DeleteOutcome {
        dataset: dir.to_path_buf(),
        rows_removed: plan.rows_removed,
        plan,
        dry_run: opts.dry_run,
        version: None,
        committed_on: None,
        replaced_deleted: false,
    };
    if opts.dry_run || outcome.plan.replaced.is_empty() {
        return Ok(outcome);
    }
    let done = execute_plan(
        dir,
        base,
        &outcome.plan,
        ExecuteOptions {
            commit_message: opts.commit_message.clone(),
            indexed,
            index_writer,
            own_index: own_index.is_some(),
        },
        after_write,
        &NoProgress,
    )?;
    outcome.version = Some(done.version);
    outcome.committed_on = Some(done.committed_on);
    outcome.replaced_deleted = done.replaced_deleted;
    Ok(outcome)
}

/// Deletes rows of the local batch dataset `dir`: `rows` maps a shard of its latest version to
/// the indices of its real rows to delete (the readers' provenance `row_index`). `after_write`
/// runs after the new shards are placed and before the commit (tests race a commit there).
pub fn delete_rows_dir(
    dir: &Path,
    rows: &BTreeMap<String, BTreeSet<u64>>,
    opts: &DeleteOptions,
    index_writer: Option<IndexPartWriter>,
    after_write: &mut dyn FnMut(&CompactionPlan),
) -> Result<DeleteOutcome, LocalError> {
    let base = base_of(dir)?;
    let write_id = uuid::Uuid::new_v4().to_string();
    let plan = plan_delete_rows(&base, rows, &write_id).map_err(|e| ds_err(dir, e))?;
    run(dir, &base, plan, opts, index_writer, after_write)
}

/// Deletes `keys` from the local KV dataset `dir` (every listed shard's header is read to find
/// them; keys it does not hold are ignored: the outcome's `rows_removed` says how many were).
pub fn delete_keys_dir(
    dir: &Path,
    keys: &BTreeSet<String>,
    opts: &DeleteOptions,
    index_writer: Option<IndexPartWriter>,
    after_write: &mut dyn FnMut(&CompactionPlan),
) -> Result<DeleteOutcome, LocalError> {
    let base = base_of(dir)?;
    let mut headers = BTreeMap::new();
    if base.ext.as_ref().map(|x| x.mode) == Some(crate::manifest::DatasetMode::Kv) {
        for s in &base.shards {
            crate::check_shard_path(&s.shard_path).map_err(|e| ds_err(dir, e))?;
            let p = dir.join(&s.shard_path);
            let h =
                safetensors_spark_format::file::read_header(&p).map_err(|e| LocalError::Io {
                    path: p.clone(),
                    source: std::io::Error::other(e.to_string()),
                })?;
            headers.insert(s.shard_path.clone(), h);
        }
    }
    let write_id = uuid::Uuid::new_v4().to_string();
    let plan = plan_delete_keys(&base, &headers, keys, &write_id).map_err(|e| ds_err(dir, e))?;
    run(dir, &base, plan, opts, index_writer, after_write)
}
