//! A compaction run on a local dataset directory (spec/dataset.md §5.8.2): plan on the latest
//! version, write the merged shards (temporary sibling, fsync, rename) and their index parts,
//! then commit with the create-if-absent protocol of §5.3, rebased on whatever version is
//! latest by then (appends committed meanwhile are kept; a shard it replaces that is gone fails
//! it, and it deletes only its own new files). What the CLI and the Python package run; the
//! Spark connector runs the same steps through Hadoop's file systems.

use super::{
    compaction_manifest, conflict, merge_output, plan_compaction, CompactionPlan, CompactionRequest,
};
use crate::local::{commit_version, latest, now_ms, publish_version, read_log_since, LocalError};
use crate::manifest::{CommitInfo, Manifest};
use crate::names::{
    shard_index_part_file_name, INDEX_DIR_NAME, MANIFEST_FILE_NAME, MANIFEST_LOG_DIR,
};
use crate::own::{is_own_subdir, remove_own_file};
use crate::progress::{FinishOnDrop, NoProgress, Progress};
use crate::vacuum::deletes_at_commit;
use crate::{DatasetError, MAX_COMMIT_ATTEMPTS};
use serde::Serialize;
use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Writes the index part of a new shard: `(part path, the dataset's manifest, shard name, shard
/// bytes)`. The CLI passes [`write_index_part`]; the Python extension, built without the index
/// writer, passes none and refuses an indexed dataset.
pub type IndexPartWriter = fn(&Path, &Manifest, &str, &[u8]) -> Result<(), String>;

/// The index part writer of the `index` feature.
#[cfg(feature = "index")]
pub fn write_index_part(
    part: &Path,
    base: &Manifest,
    shard: &str,
    bytes: &[u8],
) -> Result<(), String> {
    let rows = super::index_rows(base, shard, bytes).map_err(|e| e.to_string())?;
    crate::index::write_index_part(part, rows)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// What a compaction is told besides its request.
#[derive(Debug, Clone, Default)]
pub struct CompactionOptions {
    pub request: CompactionRequest,
    pub dry_run: bool,
    /// Recorded as the version's `commit_message`.
    pub commit_message: Option<String>,
}

/// What a compaction did (or, dry, would do) to one dataset directory.
#[derive(Debug, Clone, Serialize)]
pub struct CompactionOutcome {
    pub dataset: PathBuf,
    pub plan: CompactionPlan,
    pub dry_run: bool,
    /// The compaction version committed (None when dry or when there was nothing to merge).
    pub version: Option<u64>,
    /// The version it was committed on top of (its plan's base, or newer after appends).
    pub committed_on: Option<u64>,
    /// Whether the replaced shards were deleted at commit (retention 0) or left for vacuum.
    pub replaced_deleted: bool,
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> LocalError + '_ {
    move |source| LocalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn ds_err(path: &Path, source: DatasetError) -> LocalError {
    LocalError::Dataset {
        path: path.to_path_buf(),
        source,
    }
}

fn write_new(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = safetensors_spark_format::file::temp_sibling(path);
    let r = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if r.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    r
}

/// Compacts the local dataset `dir`. `after_write` runs after the merged shards are in place and
/// before the commit (tests race an append there).
pub fn compact_dir(
    dir: &Path,
    opts: &CompactionOptions,
    index_writer: Option<IndexPartWriter>,
    after_write: &mut dyn FnMut(&CompactionPlan),
) -> Result<CompactionOutcome, LocalError> {
    compact_one(dir, opts, index_writer, after_write, &NoProgress).map(|(o, _)| o)
}

/// The manifest's shard sizes by name.
fn shard_sizes(base: &Manifest) -> HashMap<&str, u64> {
    base.shards
        .iter()
        .map(|s| (s.shard_path.as_str(), s.bytes))
        .collect()
}

/// The bytes a new shard is made from: each of its input shards whole, as the manifest records
/// its size (a shard feeding two outputs is read for each).
fn output_bytes(sizes: &HashMap<&str, u64>, out: &super::PlannedShard) -> u64 {
    out.inputs
        .iter()
        .map(|i| sizes.get(i.shard.as_str()).copied().unwrap_or(0))
        .sum()
}

/// [`compact_dir`], advancing `progress` by each new shard written (and the bytes read for it);
/// also returns the plan's work for [`Progress`]: the shards it writes and the bytes it reads.
fn compact_one(
    dir: &Path,
    opts: &CompactionOptions,
    index_writer: Option<IndexPartWriter>,
    after_write: &mut dyn FnMut(&CompactionPlan),
    progress: &dyn Progress,
) -> Result<(CompactionOutcome, (u64, u64)), LocalError> {
    let Some(base) = latest(dir, &[])? else {
        return Err(ds_err(
            dir,
            DatasetError::Compaction {
                problem: format!(
                    "not a dataset: no {MANIFEST_FILE_NAME} and no {MANIFEST_LOG_DIR}/"
                ),
            },
        ));
    };
    let write_id = uuid::Uuid::new_v4().to_string();
    let plan = plan_compaction(&base, &opts.request, &write_id).map_err(|e| ds_err(dir, e))?;
    if let Some(m) = &opts.commit_message {
        crate::manifest::check_commit_message(m).map_err(|e| ds_err(dir, e))?;
    }
    // the index directory is never followed through a link (spec/dataset.md §5.9)
    let index_dir = dir.join(INDEX_DIR_NAME);
    let own_index = crate::own::own_dir(dir, INDEX_DIR_NAME).map_err(io_err(&index_dir))?;
    let indexed = own_index.is_some()
        && base.shards.iter().any(|s| {
            shard_index_part_file_name(&s.shard_path).is_some_and(|p| index_dir.join(p).is_file())
        });
    let sizes = shard_sizes(&base);
    let work = (
        plan.outputs.len() as u64,
        plan.outputs.iter().map(|o| output_bytes(&sizes, o)).sum(),
    );
    let mut outcome = CompactionOutcome {
        dataset: dir.to_path_buf(),
        plan,
        dry_run: opts.dry_run,
        version: None,
        committed_on: None,
        replaced_deleted: false,
    };
    if opts.dry_run || outcome.plan.outputs.is_empty() {
        return Ok((outcome, work));
    }
    let done = execute_plan(
        dir,
        &base,
        &outcome.plan,
        ExecuteOptions {
            commit_message: opts.commit_message.clone(),
            indexed,
            index_writer,
            own_index: own_index.is_some(),
        },
        after_write,
        progress,
    )?;
    outcome.version = Some(done.version);
    outcome.committed_on = Some(done.committed_on);
    outcome.replaced_deleted = done.replaced_deleted;
    Ok((outcome, work))
}

/// How [`execute_plan`] writes and commits.
pub(crate) struct ExecuteOptions {
    pub commit_message: Option<String>,
    /// The dataset has a tensor index: every new shard gets its part.
    pub indexed: bool,
    pub index_writer: Option<IndexPartWriter>,
    /// `_tensor_index.parquet` is the dataset's own directory (parts of replaced shards may be
    /// deleted there).
    pub own_index: bool,
}

/// What [`execute_plan`] committed.
pub(crate) struct Executed {
    pub version: u64,
    pub committed_on: u64,
    pub replaced_deleted: bool,
}

/// Writes the new shards of a rewrite plan (a compaction's or a delete's) next to the others,
/// then commits them with the create-if-absent protocol of §5.3 on top of whatever version is
/// latest by then: appends committed meanwhile are kept, a replaced shard another commit removed
/// fails it ([`conflict`]), and it then deletes only its own new files. With the dataset's
/// retention 0 the replaced shards (and their index parts) are deleted after the commit.
pub(crate) fn execute_plan(
    dir: &Path,
    base: &Manifest,
    plan: &CompactionPlan,
    opts: ExecuteOptions,
    after_write: &mut dyn FnMut(&CompactionPlan),
    progress: &dyn Progress,
) -> Result<Executed, LocalError> {
    let ExecuteOptions {
        commit_message,
        indexed,
        index_writer,
        own_index,
    } = opts;
    let what = plan.what();
    let index_dir = dir.join(INDEX_DIR_NAME);
    let sizes = shard_sizes(base);
    if indexed && index_writer.is_none() {
        return Err(ds_err(
            dir,
            DatasetError::Compaction {
                problem: format!(
                    "the dataset has a tensor index ({INDEX_DIR_NAME}/) and this build cannot \
                     write index parts: run `safetensors-spark {}` or the Spark {} instead",
                    if what == "delete" {
                        "delete"
                    } else {
                        "compact"
                    },
                    if what == "delete" {
                        "DELETE"
                    } else {
                        "Compaction"
                    },
                ),
            },
        ));
    }
    let mut written: Vec<PathBuf> = Vec::new();
    let cleanup = |written: &[PathBuf]| {
        for p in written {
            let _ = fs::remove_file(p);
        }
    };
    let mut new_shards = Vec::with_capacity(plan.outputs.len());
    for out in &plan.outputs {
        let result = (|| -> Result<(), LocalError> {
            let mut inputs: Vec<(String, Vec<u8>)> = Vec::new();
            for s in &out.inputs {
                crate::check_shard_path(&s.shard).map_err(|e| ds_err(dir, e))?;
                let p = dir.join(&s.shard);
                // a listed shard that is not a regular file (a FIFO would block) is refused
                let mut bytes = Vec::new();
                safetensors_spark_format::file::open_regular(&p)
                    .and_then(|mut f| io::Read::read_to_end(&mut f, &mut bytes))
                    .map_err(io_err(&p))?;
                inputs.push((s.shard.clone(), bytes));
            }
            let refs: Vec<(&str, &[u8])> = inputs
                .iter()
                .map(|(n, b)| (n.as_str(), b.as_slice()))
                .collect();
            let merged = merge_output(base, plan, out, &refs).map_err(|e| ds_err(dir, e))?;
            drop(inputs);
            let path = dir.join(&out.name);
            write_new(&path, &merged.bytes).map_err(io_err(&path))?;
            written.push(path);
            if let (true, Some(w), Some(part)) =
                (indexed, index_writer, shard_index_part_file_name(&out.name))
            {
                fs::create_dir_all(&index_dir).map_err(io_err(&index_dir))?;
                let part = index_dir.join(part);
                w(&part, base, &out.name, &merged.bytes).map_err(|m| LocalError::Io {
                    path: part.clone(),
                    source: io::Error::other(m),
                })?;
                written.push(part);
            }
            new_shards.push(merged.entry);
            progress.advance(1, output_bytes(&sizes, out));
            Ok(())
        })();
        if let Err(e) = result {
            cleanup(&written);
            return Err(e);
        }
    }
    after_write(plan);
    let id = format!("{what}-{}-{}", std::process::id(), now_ms());
    for _ in 0..MAX_COMMIT_ATTEMPTS {
        // the versions since the plan only: what removed a shard it replaces
        let log = read_log_since(dir, plan.base_version).inspect_err(|_| cleanup(&written))?;
        let Some(current) = latest(dir, &log).inspect_err(|_| cleanup(&written))? else {
            cleanup(&written);
            return Err(ds_err(
                dir,
                DatasetError::Compaction {
                    problem: format!("the dataset's manifest disappeared during the {what}"),
                },
            ));
        };
        if let Some(e) = conflict(plan, &current, &log) {
            cleanup(&written);
            return Err(ds_err(dir, e));
        }
        let info = CommitInfo {
            committed_at_ms: now_ms(),
            commit_message: commit_message.clone(),
            app_id: None,
        };
        let next = compaction_manifest(&current, plan, &new_shards, &info).map_err(|e| {
            cleanup(&written);
            ds_err(dir, e)
        })?;
        let version = next.manifest_version();
        if commit_version(dir, Some(&current), &next, &id).inspect_err(|_| cleanup(&written))? {
            publish_version(dir, &next, &id)?;
            let mut done = Executed {
                version,
                committed_on: current.manifest_version(),
                replaced_deleted: false,
            };
            if deletes_at_commit(Some(&current), &next) {
                for r in &plan.replaced {
                    let _ = remove_own_file(dir, r);
                    if let (Some(p), true) = (shard_index_part_file_name(r), own_index) {
                        let _ = remove_own_file(&index_dir, &p);
                    }
                }
                done.replaced_deleted = true;
            }
            return Ok(done);
        }
    }
    cleanup(&written);
    Err(LocalError::Io {
        path: dir.to_path_buf(),
        source: io::Error::other(format!(
            "{MAX_COMMIT_ATTEMPTS} attempts to commit the {what} each found a newer version \
             committed by another writer; nothing was committed and its shards were deleted"
        )),
    })
}

/// A manifest of any file type counts (a FIFO or device there is then refused by name when it is
/// read, spec/dataset.md §5.9), and so does a log directory.
fn is_dataset(dir: &Path) -> bool {
    dir.join(MANIFEST_FILE_NAME).exists() || dir.join(MANIFEST_LOG_DIR).is_dir()
}

/// `%XX` escapes of a Hive-style directory name decoded (spec/dataset.md §7).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Some(v) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A partition dataset's directory and its `(column, value)` path.
type PartitionDir = (PathBuf, Vec<(String, String)>);

/// The partition datasets under `root` (a `partitionBy` root, spec/dataset.md §7) with their
/// `(column, value)` path, depth first in name order.
fn partition_datasets(root: &Path) -> Result<Vec<PartitionDir>, LocalError> {
    let mut out = Vec::new();
    let mut stack = vec![(root.to_path_buf(), Vec::new())];
    while let Some((dir, parts)) = stack.pop() {
        let mut children = Vec::new();
        for e in fs::read_dir(&dir).map_err(io_err(&dir))? {
            let e = e.map_err(io_err(&dir))?;
            let Some(name) = e.file_name().to_str().map(str::to_string) else {
                continue;
            };
            // a link is never followed into another dataset (spec/dataset.md §5.9)
            if name.starts_with(['_', '.']) || !is_own_subdir(&e.path()) {
                continue;
            }
            if let Some((k, v)) = name.split_once('=') {
                let mut p: Vec<(String, String)> = parts.clone();
                p.push((unescape(k), unescape(v)));
                children.push((e.path(), p));
            }
        }
        children.sort();
        for (path, p) in children.into_iter().rev() {
            if is_dataset(&path) {
                out.push((path, p));
            } else {
                stack.push((path, p));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The dataset directories a compaction of `root` covers: `root` itself when it is a dataset
/// (then `partitions` must be empty), else the partition datasets under it (spec/dataset.md §7)
/// that match every `column=value` of `partitions` (values as written, before escaping; one
/// column given several times matches any of its values). An unknown column or a value no
/// partition has is an error naming it and the partitions there are; nothing is changed.
pub fn select_datasets(root: &Path, partitions: &[String]) -> Result<Vec<PathBuf>, LocalError> {
    let bad = |problem: String| ds_err(root, DatasetError::Compaction { problem });
    if is_dataset(root) {
        if let Some(p) = partitions.first() {
            return Err(bad(format!(
                "partition {p}: the dataset is not partitioned (it has its own {MANIFEST_FILE_NAME})"
            )));
        }
        return Ok(vec![root.to_path_buf()]);
    }
    if !root.is_dir() {
        return Err(bad(format!(
            "not a dataset: no {MANIFEST_FILE_NAME} and no {MANIFEST_LOG_DIR}/"
        )));
    }
    let all = partition_datasets(root)?;
    if all.is_empty() {
        return Err(bad(format!(
            "not a dataset: no {MANIFEST_FILE_NAME}, no {MANIFEST_LOG_DIR}/ and no \
             partition directories (column=value) holding one"
        )));
    }
    let mut wanted: Vec<(String, Vec<String>)> = Vec::new();
    for p in partitions {
        let Some((k, v)) = p.split_once('=') else {
            return Err(bad(format!(
                "partition '{p}': expected column=value (e.g. split=train)"
            )));
        };
        match wanted.iter_mut().find(|(c, _)| c == k) {
            Some((_, vs)) => vs.push(v.to_string()),
            None => wanted.push((k.to_string(), vec![v.to_string()])),
        }
    }
    let listing = || {
        all.iter()
            .map(|(_, p)| {
                p.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join("/")
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    for (k, vs) in &wanted {
        if !all.iter().any(|(_, p)| p.iter().any(|(c, _)| c == k)) {
            return Err(bad(format!(
                "partition column '{k}' is not a partition column of this dataset; its \
                 partitions are: {}",
                listing()
            )));
        }
        for v in vs {
            if !all
                .iter()
                .any(|(_, p)| p.iter().any(|(c, x)| c == k && x == v))
            {
                return Err(bad(format!(
                    "no partition {k}={v}; the partitions are: {}",
                    listing()
                )));
            }
        }
    }
    let chosen: Vec<PathBuf> = all
        .iter()
        .filter(|(_, p)| {
            wanted
                .iter()
                .all(|(k, vs)| p.iter().any(|(c, x)| c == k && vs.contains(x)))
        })
        .map(|(d, _)| d.clone())
        .collect();
    if chosen.is_empty() {
        return Err(bad(format!(
            "no partition matches {}; the partitions are: {}",
            partitions.join(" and "),
            listing()
        )));
    }
    Ok(chosen)
}

/// Compacts `root` (a dataset, or the chosen partition datasets of a `partitionBy` root): one
/// compaction version per dataset directory, never across partitions. Every selector is checked
/// before anything is written. `after_write` runs in each directory between the placing of the
/// new shards and the commit (a test hook: the CLI's forced race).
///
/// `progress` (not on a dry run) is told the new shards of every chosen dataset's first plan
/// and the bytes read for them, then each shard as it is written; a plan made again on a newer
/// version (an append in between) may write more or fewer.
pub fn compact_path(
    root: &Path,
    partitions: &[String],
    opts: &CompactionOptions,
    index_writer: Option<IndexPartWriter>,
    after_write: &mut dyn FnMut(&CompactionPlan),
    progress: &dyn Progress,
) -> Result<Vec<CompactionOutcome>, LocalError> {
    let dirs = select_datasets(root, partitions)?;
    // every dataset's options are checked (a plan each) before the first is compacted
    let (mut items, mut bytes) = (0, 0);
    for d in &dirs {
        let (_, (i, b)) = compact_one(
            d,
            &CompactionOptions {
                dry_run: true,
                ..opts.clone()
            },
            index_writer,
            &mut |_| {},
            &NoProgress,
        )?;
        items += i;
        bytes += b;
    }
    if opts.dry_run {
        return dirs
            .iter()
            .map(|d| compact_dir(d, opts, index_writer, after_write))
            .collect();
    }
    let _finish = FinishOnDrop(progress);
    progress.start(items, bytes);
    dirs.iter()
        .map(|d| compact_one(d, opts, index_writer, after_write, progress).map(|(o, _)| o))
        .collect()
}
