//! Job commit of a write (spec/dataset.md §2, §3, §5): checks the tasks' reports against the
//! plan and each other and builds this write's manifest; [`safetensors_spark_dataset::manifest::next_manifest`]
//! then puts it on top of the directory's latest committed manifest.
//!
//! [`commit_manifest`] is pure: it reads no file. When `duplicatesStrategy=lastWin` leaves
//! older copies of a key in some shards, it returns [`ShardRewrite`]s; the caller applies each
//! (copying the shard without those tensors with [`rewrite_shard_without`], or deleting a shard
//! that keeps nothing) and reports the new file with [`CommitPlan::apply_rewrite`], which fixes
//! the byte counts and offsets, before the manifest and index are written.

use super::{
    shard_file_name, ColumnReport, DuplicatesStrategy, SealedTensor, ShardReport, TailStrategy,
    TaskReport, WriteMode, WritePlan,
};
use safetensors_spark_dataset::index::IndexRow;
use safetensors_spark_dataset::manifest::{
    ColumnMap, Manifest, ManifestExt, ManifestShard, ManifestTensor, MANIFEST_FORMAT,
};
use safetensors_spark_dataset::names::{
    parse_shard_file_name, PADDED_SAMPLES_METADATA_KEY, SAMPLES_METADATA_KEY,
};
use safetensors_spark_dataset::{DatasetError, DatasetMode};
use safetensors_spark_format::error::FormatError;
use safetensors_spark_format::file::{copy_tensors, crc32c_hex, SafetensorsFile};
use safetensors_spark_format::header::Header;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

/// Why the job cannot commit.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("column '{column}': partition {partition_a} wrote {what} {value_a} but partition {partition_b} wrote {value_b}; every row of a column must have the same {what}")]
    ColumnMismatch {
        column: String,
        what: &'static str,
        partition_a: u32,
        value_a: String,
        partition_b: u32,
        value_b: String,
    },

    #[error("key '{key}' occurs more than once in this write (in shards {first_file} and {second_file}); duplicatesStrategy=fail (set duplicatesStrategy=lastWin to keep the last row)")]
    DuplicateKey {
        key: String,
        first_file: String,
        second_file: String,
    },

    #[error("tensor name '{name}' occurs in shards {first_file} and {second_file} for different rows (a key containing the separator collides with another key and column)")]
    TensorNameCollision {
        name: String,
        first_file: String,
        second_file: String,
    },

    #[error("key '{key}' is already in the dataset (shard {existing_file}) and this append writes it again (shard {new_file}); duplicatesStrategy=fail forbids a key twice in a dataset (set duplicatesStrategy=lastWin to replace it)")]
    KeyInDataset {
        key: String,
        existing_file: String,
        new_file: String,
    },

    #[error("task report of partition {partition} is invalid: {problem}")]
    BadReport { partition: u32, problem: String },

    #[error("shard rewrite of {file}: {problem}")]
    Rewrite { file: String, problem: String },

    #[error(transparent)]
    Dataset(#[from] DatasetError),

    #[error(transparent)]
    Format(#[from] FormatError),
}

fn bad_report(partition: u32, problem: impl Into<String>) -> CommitError {
    CommitError::BadReport {
        partition,
        problem: problem.into(),
    }
}

/// This write's manifest with no shards, for `plan`'s mode (`manifest_version` is set when
/// the commit puts it on top of the directory's latest manifest).
pub fn empty_manifest(plan: &WritePlan) -> Manifest {
    let (mode, batch_size, tail_strategy, kv_separator) = match &plan.mode {
        WriteMode::Batch {
            batch_size,
            tail_strategy,
        } => (
            DatasetMode::Batch,
            Some(*batch_size),
            Some(*tail_strategy),
            None,
        ),
        WriteMode::Kv { kv_separator, .. } => {
            (DatasetMode::Kv, None, None, Some(kv_separator.clone()))
        }
    };
    Manifest::empty(ManifestExt {
        format: MANIFEST_FORMAT.to_string(),
        created_by: format!("safetensors-spark {}", safetensors_spark_format::VERSION),
        manifest_version: 1,
        mode,
        batch_size,
        tail_strategy,
        kv_separator,
        padded_samples: 0,
        dropped_samples: 0,
        stream_commits: Default::default(),
        committed_at_ms: None,
        operation: None,
        commit_message: None,
        app_id: None,
        retention_seconds: plan.retention_seconds,
        vacuumed: None,
        checkpoint_interval: plan.checkpoint_interval,
    })
}

/// The index rows of one shard, in its report's tensor order.
pub fn index_rows(shard: &ShardReport) -> Vec<IndexRow> {
    shard
        .tensors
        .iter()
        .map(|t| t.clone().into_index_row(&shard.file))
        .collect()
}

/// `(key, column)` of a KV tensor name `<key><separator><column>`: the one written column of
/// `plan` that ends the name after the separator (one at most, by the plan's rule,
/// spec/dataset.md §3); `None` when no column does.
pub fn split_kv_name<'a>(
    name: &'a str,
    separator: &str,
    plan: &'a WritePlan,
) -> Option<(&'a str, &'a str)> {
    plan.columns.iter().find_map(|c| {
        let key = name
            .strip_suffix(c.name.as_str())?
            .strip_suffix(separator)?;
        Some((key, c.name.as_str()))
    })
}

/// Rebuilds the report of a shard written by an earlier write from its validated header, so an
/// index created by a later append covers it too. KV tensor names are split into key and column
/// by [`split_kv_name`].
pub fn shard_report_from_header(file: &str, header: &Header, plan: &WritePlan) -> ShardReport {
    let meta = header.metadata.clone().unwrap_or_default();
    let count = |key: &str| meta.get(key).and_then(|v| v.parse().ok()).unwrap_or(0);
    let (partition, shard) = parse_shard_file_name(file)
        .map(|(p, s, _)| (p, s))
        .unwrap_or((0, 0));
    let origin = |name: &str| -> (Option<String>, Option<String>) {
        let WriteMode::Kv { kv_separator, .. } = &plan.mode else {
            return (None, None);
        };
        split_kv_name(name, kv_separator, plan).map_or((None, None), |(k, c)| {
            (Some(k.to_string()), Some(c.to_string()))
        })
    };
    ShardReport {
        file: file.to_string(),
        local_path: String::new(),
        partition,
        shard,
        samples: count(SAMPLES_METADATA_KEY),
        padded_samples: count(PADDED_SAMPLES_METADATA_KEY),
        bytes: header.file_len(),
        crc32c: None,
        tensors: SealedTensor::for_tensors(&header.tensors, header.data_start(), origin),
        num_tensors: None,
    }
}

/// One sorted run of [`merge_key_runs`]: a shard's index part (spec/dataset.md §6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRunInput {
    /// The shard the part describes.
    pub file: String,
    /// The part, a local file.
    pub part: PathBuf,
    /// A shard the dataset already lists (loses to every shard of this write).
    pub existing: bool,
    /// Among this write's shards, the higher rank wins (`(partition << 32) | shard`).
    pub rank: u64,
}

/// KV keys across shards, by a streaming merge of their index parts (each sorted by
/// `tensor_key`): memory is one record batch per run plus the keys that lose, never the keys
/// that are only stored once. Equal tensor names in two runs are either the same key
/// (`duplicatesStrategy`: `fail` is an error naming the key and both shards — [`KeyInDataset`]
/// when one is an existing shard, else [`DuplicateKey`]; `lastWin` keeps the copy of the new
/// shard, then of the highest rank, and the others lose the key) or two keys whose names
/// collide ([`TensorNameCollision`], whatever the strategy). Returns, per losing shard, the
/// keys it loses.
///
/// [`KeyInDataset`]: CommitError::KeyInDataset
/// [`DuplicateKey`]: CommitError::DuplicateKey
/// [`TensorNameCollision`]: CommitError::TensorNameCollision
pub fn merge_key_runs(
    inputs: &[KeyRunInput],
    duplicates: DuplicatesStrategy,
) -> Result<BTreeMap<String, BTreeSet<String>>, CommitError> {
    use safetensors_spark_dataset::index::KeyRun;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let index_err =
        |file: &str, e: safetensors_spark_dataset::index::IndexError| CommitError::Rewrite {
            file: file.to_string(),
            problem: format!("index part: {e}"),
        };
    let mut runs = Vec::with_capacity(inputs.len());
    for i in inputs {
        runs.push(KeyRun::open(&i.part).map_err(|e| index_err(&i.file, e))?);
    }
    // (name, run) of every run's current row; the smallest name first.
    let mut heap: BinaryHeap<Reverse<(Vec<u8>, usize)>> = BinaryHeap::new();
    for (i, r) in runs.iter().enumerate() {
        if let Some((name, _)) = r.current() {
            heap.push(Reverse((name.as_bytes().to_vec(), i)));
        }
    }
    let mut losers: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut group: Vec<usize> = Vec::new();
    while let Some(Reverse((name, first))) = heap.pop() {
        group.clear();
        group.push(first);
        while heap.peek().is_some_and(|Reverse((n, _))| *n == name) {
            if let Some(Reverse((_, i))) = heap.pop() {
                group.push(i);
            }
        }
        if group.len() > 1 {
            // the winner first: a new shard before an existing one, then the highest rank
            group.sort_by_key(|&i| Reverse((!inputs[i].existing, inputs[i].rank)));
            let key_of = |i: usize| runs[i].current().and_then(|(_, k)| k).map(str::to_string);
            let win = group[0];
            let win_key = key_of(win);
            for &lose in &group[1..] {
                let lose_key = key_of(lose);
                let (a, b) = (&inputs[lose].file, &inputs[win].file);
                let Some(key) = lose_key.filter(|k| Some(k) == win_key.as_ref()) else {
                    return Err(CommitError::TensorNameCollision {
                        name: String::from_utf8_lossy(&name).into_owned(),
                        first_file: a.clone(),
                        second_file: b.clone(),
                    });
                };
                if duplicates == DuplicatesStrategy::Fail {
                    return Err(if inputs[lose].existing {
                        CommitError::KeyInDataset {
                            key,
                            existing_file: a.clone(),
                            new_file: b.clone(),
                        }
                    } else {
                        CommitError::DuplicateKey {
                            key,
                            first_file: a.clone(),
                            second_file: b.clone(),
                        }
                    });
                }
                losers.entry(a.clone()).or_default().insert(key);
            }
        }
        for &i in &group {
            runs[i]
                .advance()
                .map_err(|e| index_err(&inputs[i].file, e))?;
            if let Some((n, _)) = runs[i].current() {
                heap.push(Reverse((n.as_bytes().to_vec(), i)));
            }
        }
    }
    Ok(losers)
}

/// What [`rewrite_shard_without_keys`] did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KeysRewritten {
    /// Every key of the shard went: nothing was written, the shard is to be dropped.
    pub delete: bool,
    pub bytes: u64,
    pub samples: u64,
    pub num_tensors: u64,
    /// CRC-32C of the copy (8 lowercase hex digits); absent when nothing was written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crc32c: Option<String>,
}

/// `duplicatesStrategy=lastWin` after [`merge_key_runs`]: copies the KV shard `input` (named
/// `file`) to `output` without the tensors of `keys` (split as [`split_kv_name`]), with
/// `safetensors_spark.samples` lowered by the keys it held, and writes the index part of the
/// copy at `part` (named as `output_file`). Nothing is written when no key is left. Memory: one
/// shard's header.
pub fn rewrite_shard_without_keys(
    plan: &WritePlan,
    input: &Path,
    output: &Path,
    output_file: &str,
    part: Option<&Path>,
    keys: &HashSet<String>,
) -> Result<KeysRewritten, CommitError> {
    let WriteMode::Kv { kv_separator, .. } = &plan.mode else {
        return Err(CommitError::Rewrite {
            file: output_file.to_string(),
            problem: "keys are dropped in KV mode only".to_string(),
        });
    };
    let header = SafetensorsFile::open(input)?.header().clone();
    let mut drop = HashSet::new();
    let mut dropped_keys = HashSet::new();
    for t in &header.tensors {
        if let Some((key, _)) = split_kv_name(&t.name, kv_separator, plan) {
            if keys.contains(key) {
                drop.insert(t.name.clone());
                dropped_keys.insert(key.to_string());
            }
        }
    }
    let samples: u64 = header
        .metadata
        .as_ref()
        .and_then(|m| m.get(SAMPLES_METADATA_KEY))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let samples = samples.saturating_sub(dropped_keys.len() as u64);
    if drop.len() == header.tensors.len() {
        return Ok(KeysRewritten {
            delete: true,
            bytes: 0,
            samples: 0,
            num_tensors: 0,
            crc32c: None,
        });
    }
    let done = rewrite_shard_without(input, output, &drop, samples)?;
    let num_tensors = done.tensors.len() as u64;
    if let Some(part) = part {
        let copy = SafetensorsFile::open(output)?;
        write_shard_index_part(plan, output_file, copy.header(), part)?;
    }
    Ok(KeysRewritten {
        delete: false,
        bytes: done.bytes,
        samples,
        num_tensors,
        crc32c: Some(done.crc32c.clone()),
    })
}

/// Writes the index part (spec/dataset.md §6.1) of the shard `file` with the validated header
/// `header` at `part`: for a shard written before parts existed, or a rewritten copy. Memory: one
/// shard's rows.
pub fn write_shard_index_part(
    plan: &WritePlan,
    file: &str,
    header: &Header,
    part: &Path,
) -> Result<u64, CommitError> {
    let report = shard_report_from_header(file, header, plan);
    safetensors_spark_dataset::index::write_index_part(part, index_rows(&report)).map_err(|e| {
        CommitError::Rewrite {
            file: file.to_string(),
            problem: format!("index part: {e}"),
        }
    })
}

/// Tensors to remove from one shard of this write (`duplicatesStrategy=lastWin`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardRewrite {
    pub file: String,
    pub partition: u32,
    pub shard: u32,
    /// Tensor names to remove.
    pub drop_tensors: BTreeSet<String>,
    /// The keys those tensors belong to (a later shard holds each one).
    pub drop_keys: BTreeSet<String>,
    /// `safetensors_spark.samples` after the rewrite.
    pub samples_after: u64,
    /// Nothing is left: delete the shard instead of rewriting it. It is not in the manifest.
    pub delete: bool,
}

impl ShardRewrite {
    /// Copies `input` to `output` without [`ShardRewrite::drop_tensors`]. Not for `delete`.
    pub fn apply(&self, input: &Path, output: &Path) -> Result<RewrittenShard, CommitError> {
        if self.delete {
            return Err(CommitError::Rewrite {
                file: self.file.clone(),
                problem: "every tensor is dropped: delete the shard instead".to_string(),
            });
        }
        let drop: HashSet<String> = self.drop_tensors.iter().cloned().collect();
        let mut out = rewrite_shard_without(input, output, &drop, self.samples_after)?;
        out.file = self.file.clone();
        Ok(out)
    }
}

/// What [`rewrite_shard_without`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RewrittenShard {
    /// File name of `output`.
    pub file: String,
    pub path: PathBuf,
    pub bytes: u64,
    /// CRC-32C of the copy, 8 lowercase hex digits.
    pub crc32c: String,
    pub samples: u64,
    /// The tensors kept, with their new absolute offsets (`sample_key`/`column` not set).
    pub tensors: Vec<SealedTensor>,
}

/// Copies the shard `input` to `output` (temporary sibling + rename; `output` may be `input`)
/// keeping every tensor not in `drop` and all metadata, with `safetensors_spark.samples` set to
/// `samples`. Every name in `drop` must exist, and at least one tensor must remain.
pub fn rewrite_shard_without(
    input: &Path,
    output: &Path,
    drop: &HashSet<String>,
    samples: u64,
) -> Result<RewrittenShard, CommitError> {
    let file_label = || input.display().to_string();
    let src = SafetensorsFile::open(input)?;
    let header = src.header();
    for name in drop {
        if header.tensor(name).is_none() {
            return Err(FormatError::TensorNotFound { name: name.clone() }.into());
        }
    }
    let kept: Vec<_> = header
        .tensors
        .iter()
        .filter(|t| !drop.contains(&t.name))
        .collect();
    if kept.is_empty() {
        return Err(CommitError::Rewrite {
            file: file_label(),
            problem: "every tensor would be dropped: delete the shard instead".to_string(),
        });
    }
    let mut metadata = header.metadata.clone().unwrap_or_default();
    metadata.insert(SAMPLES_METADATA_KEY.to_string(), samples.to_string());
    let written = copy_tensors(input, output, Some(&metadata), |t| !drop.contains(&t.name))?;
    let tensors = SealedTensor::for_tensors(&written.tensors, written.data_start, |_| (None, None));
    Ok(RewrittenShard {
        file: output
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        path: written.path,
        bytes: written.bytes,
        crc32c: crc32c_hex(written.crc32c),
        samples,
        tensors,
    })
}

/// The result of the job-commit checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitPlan {
    /// The manifest to write once every rewrite has been applied.
    pub manifest: Manifest,
    /// Shards of this write to rewrite (or delete) before the manifest is written.
    pub rewrites: Vec<ShardRewrite>,
    /// This write's shards as they will be after the rewrites (deleted ones left out, dropped
    /// tensors removed), sorted by file name: the source of the index rows.
    pub shards: Vec<ShardReport>,
}

impl CommitPlan {
    /// Records a rewritten shard: its size and tensor offsets, in `shards` and the manifest.
    pub fn apply_rewrite(&mut self, done: &RewrittenShard) -> Result<(), CommitError> {
        let problem = |p: String| CommitError::Rewrite {
            file: done.file.clone(),
            problem: p,
        };
        let shard = self
            .shards
            .iter_mut()
            .find(|s| s.file == done.file)
            .ok_or_else(|| problem("not a shard of this write".to_string()))?;
        if shard.tensors.len() != done.tensors.len() || shard.samples != done.samples {
            return Err(problem(format!(
                "expected {} tensors and {} samples, the file has {} and {}",
                shard.tensors.len(),
                shard.samples,
                done.tensors.len(),
                done.samples
            )));
        }
        let new: HashMap<&str, &SealedTensor> =
            done.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
        for t in &mut shard.tensors {
            let n = new
                .get(t.name.as_str())
                .ok_or_else(|| problem(format!("tensor '{}' is missing", t.name)))?;
            t.data_start = n.data_start;
            t.data_end = n.data_end;
        }
        shard.bytes = done.bytes;
        shard.crc32c = Some(done.crc32c.clone());
        let entry = self
            .manifest
            .shards
            .iter_mut()
            .find(|s| s.shard_path == done.file)
            .ok_or_else(|| problem("not in the manifest".to_string()))?;
        entry.bytes = done.bytes;
        entry.crc32c = Some(done.crc32c.clone());
        self.manifest.recompute_totals();
        Ok(())
    }
}

fn shape_str(s: &Option<Vec<u64>>) -> String {
    s.as_ref()
        .map_or_else(|| "varying shapes".to_string(), |s| format!("{s:?}"))
}

/// Checks the tasks' reports against the plan and each other and builds this write's manifest
/// (its shards only; [`safetensors_spark_dataset::manifest::next_manifest`] merges it with the dataset's
/// for an append). See spec/dataset.md §2, §3 and §5.
pub fn commit_manifest(
    plan: &WritePlan,
    reports: &[TaskReport],
) -> Result<CommitPlan, CommitError> {
    let kv = match &plan.mode {
        WriteMode::Kv { duplicates, .. } => Some(*duplicates),
        WriteMode::Batch { .. } => None,
    };
    let tail = match &plan.mode {
        WriteMode::Batch { tail_strategy, .. } => Some(*tail_strategy),
        WriteMode::Kv { .. } => None,
    };
    let mut reports: Vec<&TaskReport> = reports.iter().collect();
    reports.sort_by_key(|r| r.partition);
    for pair in reports.windows(2) {
        if pair[0].partition == pair[1].partition {
            return Err(bad_report(
                pair[0].partition,
                "two reports for the same partition",
            ));
        }
    }

    // Each report on its own.
    for r in &reports {
        check_report(plan, r, kv.is_some(), tail)?;
    }

    // Columns across tasks.
    let mut tensors = ColumnMap::default();
    for col in &plan.columns {
        if let Some(r) = &col.ragged {
            if let Some(t) = ragged_schema(plan, col, r, &reports)? {
                tensors.0.push((col.name.clone(), t));
            }
            continue;
        }
        let mut first: Option<(u32, &ColumnReport)> = None;
        let mut common_shape: Option<Vec<u64>> = None;
        for r in &reports {
            let Some(c) = r.columns.get(&col.name) else {
                continue;
            };
            let Some((p0, c0)) = first else {
                first = Some((r.partition, c));
                common_shape = c.sample_shape.clone();
                continue;
            };
            let mismatch = |what, a: String, b: String| CommitError::ColumnMismatch {
                column: col.name.clone(),
                what,
                partition_a: p0,
                value_a: a,
                partition_b: r.partition,
                value_b: b,
            };
            if c.dtype != c0.dtype {
                return Err(mismatch("dtype", c0.dtype.to_string(), c.dtype.to_string()));
            }
            if kv.is_none() && c.sample_shape != c0.sample_shape {
                return Err(mismatch(
                    "sample shape",
                    shape_str(&c0.sample_shape),
                    shape_str(&c.sample_shape),
                ));
            }
            if common_shape != c.sample_shape {
                common_shape = None;
            }
        }
        if let Some((_, c0)) = first {
            tensors.0.push((
                col.name.clone(),
                ManifestTensor {
                    dtype: c0.dtype,
                    // batch: the shape of a full shard's tensor; KV: one row's (or null)
                    shape: match &plan.mode {
                        WriteMode::Batch { batch_size, .. } => {
                            common_shape.map(|s| std::iter::once(*batch_size).chain(s).collect())
                        }
                        WriteMode::Kv { .. } => common_shape,
                    },
                    ragged: None,
                },
            ));
        }
    }

    // All shards, in (partition, shard) order.
    let mut shards: Vec<ShardReport> = reports
        .iter()
        .flat_map(|r| r.shards.iter().cloned())
        .collect();
    shards.sort_by_key(|s| (s.partition, s.shard));

    let mut rewrites = Vec::new();
    if let Some(duplicates) = kv {
        rewrites = dedup_keys(&mut shards, duplicates)?;
        check_tensor_names(&shards)?;
    }
    shards.sort_by(|a, b| a.file.as_bytes().cmp(b.file.as_bytes()));

    let mut manifest = empty_manifest(plan);
    if !shards.is_empty() {
        manifest.schema = tensors;
    }
    manifest.shards = shards
        .iter()
        .map(|s| ManifestShard {
            shard_path: s.file.clone(),
            samples_count: s.samples,
            bytes: s.bytes,
            partition: Some(s.partition),
            padded_samples: Some(s.padded_samples),
            num_tensors: Some(s.tensor_count()),
            crc32c: s.crc32c.clone(),
            added_version: None,
        })
        .collect();
    manifest.recompute_totals();
    if tail == Some(TailStrategy::Drop) {
        if let Some(x) = &mut manifest.ext {
            x.dropped_samples = reports.iter().map(|r| r.dropped_samples).sum();
        }
    }
    manifest.validate()?;
    Ok(CommitPlan {
        manifest,
        rewrites,
        shards,
    })
}

/// `schema.<c>` of a ragged column: the tasks' dtypes must agree and their inner shapes, where
/// known, too (a dimension no row showed is recorded as 0).
fn ragged_schema(
    plan: &WritePlan,
    col: &super::ColumnPlan,
    r: &super::RaggedPlan,
    reports: &[&TaskReport],
) -> Result<Option<ManifestTensor>, CommitError> {
    let mut first: Option<(u32, &ColumnReport)> = None;
    let mut inner: Vec<Option<u64>> = r
        .inner_shape
        .as_ref()
        .map(|v| v.iter().map(|&d| Some(d)).collect())
        .unwrap_or_default();
    let fmt = |v: &[Option<u64>]| {
        let parts: Vec<String> = v
            .iter()
            .map(|d| d.map_or_else(|| "?".to_string(), |d| d.to_string()))
            .collect();
        format!("[{}]", parts.join(","))
    };
    for rep in reports {
        let Some(c) = rep.columns.get(&col.name) else {
            continue;
        };
        let Some(ci) = &c.inner_shape else {
            return Err(bad_report(
                rep.partition,
                format!("ragged column '{}' has no inner shape", col.name),
            ));
        };
        let Some((p0, c0)) = first else {
            first = Some((rep.partition, c));
            if inner.is_empty() {
                inner = ci.clone();
            }
            for (a, b) in inner.iter_mut().zip(ci) {
                if a.is_none() {
                    *a = *b;
                }
            }
            continue;
        };
        let mismatch = |what, a: String, b: String| CommitError::ColumnMismatch {
            column: col.name.clone(),
            what,
            partition_a: p0,
            value_a: a,
            partition_b: rep.partition,
            value_b: b,
        };
        if c.dtype != c0.dtype {
            return Err(mismatch("dtype", c0.dtype.to_string(), c.dtype.to_string()));
        }
        let clash = inner.len() != ci.len()
            || inner
                .iter()
                .zip(ci)
                .any(|(a, b)| matches!((a, b), (Some(a), Some(b)) if a != b));
        if clash {
            return Err(mismatch("inner shape", fmt(&inner), fmt(ci)));
        }
        for (a, b) in inner.iter_mut().zip(ci) {
            if a.is_none() {
                *a = *b;
            }
        }
    }
    let _ = plan;
    Ok(first.map(|(_, c0)| ManifestTensor {
        dtype: c0.dtype,
        shape: None,
        ragged: Some(safetensors_spark_dataset::manifest::RaggedColumn {
            inner_shape: inner.iter().map(|d| d.unwrap_or(0)).collect(),
            element: r.element,
        }),
    }))
}

fn check_report(
    plan: &WritePlan,
    r: &TaskReport,
    kv: bool,
    tail: Option<TailStrategy>,
) -> Result<(), CommitError> {
    let p = r.partition;
    for (name, c) in &r.columns {
        let Some(col) = plan.columns.iter().find(|c| c.name == *name) else {
            return Err(bad_report(p, format!("column '{name}' is not in the plan")));
        };
        if let Some(d) = col.dtype {
            if d != c.dtype {
                return Err(bad_report(
                    p,
                    format!(
                        "column '{name}' was planned as {d} but written as {}",
                        c.dtype
                    ),
                ));
            }
        }
        if !kv && c.sample_shape.is_none() && col.ragged.is_none() {
            return Err(bad_report(
                p,
                format!("column '{name}' has no sample shape"),
            ));
        }
    }
    if !r.shards.is_empty() {
        if let Some(col) = plan
            .columns
            .iter()
            .find(|c| !r.columns.contains_key(&c.name))
        {
            return Err(bad_report(
                p,
                format!(
                    "it wrote shards but reports nothing for column '{}'",
                    col.name
                ),
            ));
        }
    }
    if !kv && tail != Some(TailStrategy::Drop) && r.dropped_samples != 0 {
        return Err(bad_report(p, "dropped samples without tail_strategy=drop"));
    }
    if kv && r.dropped_samples != 0 {
        return Err(bad_report(p, "dropped samples in KV mode"));
    }
    let mut seen = BTreeSet::new();
    for s in &r.shards {
        let expected = shard_file_name(p, s.shard, &plan.write_id);
        if s.partition != p || s.file != expected {
            return Err(bad_report(
                p,
                format!(
                    "shard {} (partition {}, shard {}) should be named {expected}",
                    s.file, s.partition, s.shard
                ),
            ));
        }
        if !seen.insert(s.shard) {
            return Err(bad_report(p, format!("shard {} is reported twice", s.file)));
        }
        if s.samples == 0 || s.tensor_count() == 0 {
            return Err(bad_report(p, format!("shard {} is empty", s.file)));
        }
        if s.padded_samples != 0 && tail != Some(TailStrategy::Pad) {
            return Err(bad_report(
                p,
                format!("shard {} has padding without tail_strategy=pad", s.file),
            ));
        }
        let expected =
            plan.columns.len() + plan.columns.iter().filter(|c| c.ragged.is_some()).count();
        if !kv && s.tensors.len() != expected {
            return Err(bad_report(
                p,
                format!(
                    "shard {} has {} tensors, expected one per column and one more per ragged column ({expected})",
                    s.file,
                    s.tensors.len(),
                ),
            ));
        }
        if kv {
            if let Some(t) = s.tensors.iter().find(|t| t.sample_key.is_none()) {
                return Err(bad_report(
                    p,
                    format!("tensor '{}' of shard {} has no sample key", t.name, s.file),
                ));
            }
        }
    }
    Ok(())
}

/// KV duplicate keys across the whole write. `shards` are in (partition, shard) order; the last
/// occurrence wins. Returns the rewrites and updates `shards` to what they will hold.
fn dedup_keys(
    shards: &mut Vec<ShardReport>,
    duplicates: DuplicatesStrategy,
) -> Result<Vec<ShardRewrite>, CommitError> {
    // key → index of the shard holding its current (latest) copy.
    let mut latest: HashMap<&str, usize> = HashMap::new();
    // shard index → keys to drop from it.
    let mut drops: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for (i, s) in shards.iter().enumerate() {
        let keys: BTreeSet<&str> = s
            .tensors
            .iter()
            .filter_map(|t| t.sample_key.as_deref())
            .collect();
        for key in keys {
            if let Some(prev) = latest.insert(key, i) {
                match duplicates {
                    DuplicatesStrategy::Fail => {
                        return Err(CommitError::DuplicateKey {
                            key: key.to_string(),
                            first_file: shards[prev].file.clone(),
                            second_file: s.file.clone(),
                        })
                    }
                    DuplicatesStrategy::LastWin => {
                        drops.entry(prev).or_default().insert(key.to_string());
                    }
                }
            }
        }
    }
    let mut rewrites = Vec::new();
    for (i, keys) in drops {
        let s = &mut shards[i];
        let drop_tensors: BTreeSet<String> = s
            .tensors
            .iter()
            .filter(|t| t.sample_key.as_ref().is_some_and(|k| keys.contains(k)))
            .map(|t| t.name.clone())
            .collect();
        s.tensors.retain(|t| !drop_tensors.contains(&t.name));
        let samples_after = s.samples.saturating_sub(keys.len() as u64);
        let delete = s.tensors.is_empty();
        if delete != (samples_after == 0) {
            return Err(bad_report(
                s.partition,
                format!(
                    "shard {} reports {} samples but holds a different number of keys",
                    s.file, s.samples
                ),
            ));
        }
        s.samples = samples_after;
        rewrites.push(ShardRewrite {
            file: s.file.clone(),
            partition: s.partition,
            shard: s.shard,
            drop_tensors,
            drop_keys: keys,
            samples_after,
            delete,
        });
    }
    // a shard reported with its tensor count only (KV, keys merged from index parts) never loses any here
    shards.retain(|s| !s.tensors.is_empty() || s.num_tensors.is_some());
    Ok(rewrites)
}

/// Tensor names must be unique across a KV write (e.g. key `a__b` + column `c` = key `a` +
/// column `b__c`).
fn check_tensor_names(shards: &[ShardReport]) -> Result<(), CommitError> {
    let mut seen: HashMap<&str, &str> = HashMap::new();
    for s in shards {
        for t in &s.tensors {
            if let Some(first) = seen.insert(t.name.as_str(), s.file.as_str()) {
                return Err(CommitError::TensorNameCollision {
                    name: t.name.clone(),
                    first_file: first.to_string(),
                    second_file: s.file.clone(),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
