//! `dataset_manifest.json` (spec/dataset.md §5, schemas/dataset_manifest.schema.json) and the
//! job-commit checks that build it from the tasks' reports.
//!
//! [`commit_manifest`] is pure: it reads no file. When `duplicatesStrategy=lastWin` leaves
//! older copies of a key in some shards, it returns [`ShardRewrite`]s; the caller applies each
//! (copying the shard without those tensors with [`rewrite_shard_without`], or deleting a shard
//! that keeps nothing) and reports the new file with [`CommitPlan::apply_rewrite`], which fixes
//! the byte counts and offsets, before writing the manifest and index.

use super::plan::tail_name;
use super::{
    shard_file_name, ColumnReport, DuplicatesStrategy, ShardReport, TailStrategy, TaskReport,
    TensorReport, WriteLayout, WritePlan,
};
use crate::error::FormatError;
use crate::file::{copy_tensors, SafetensorsFile};
use crate::Dtype;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

pub const MANIFEST_FILE_NAME: &str = "dataset_manifest.json";
pub const MANIFEST_FORMAT: &str = "safetensors-spark-dataset";
pub const MANIFEST_FORMAT_VERSION: u64 = 1;
/// Shard metadata key holding the number of real rows (keys) in the shard.
pub const SAMPLES_METADATA_KEY: &str = "safetensors_spark.samples";

/// `"batch"` or `"kv"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayoutKind {
    Batch,
    Kv,
}

/// `tensors.<column>`: the dtype and per-sample shape stored for a column.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestTensor {
    pub dtype: Dtype,
    /// Batch mode: always set. KV mode: the common shape, `None` (null) when rows differ.
    #[serde(deserialize_with = "required")]
    pub sample_shape: Option<Vec<u64>>,
}

/// `shards[]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestShard {
    pub file: String,
    pub partition: u32,
    pub samples: u64,
    pub padded_samples: u64,
    /// Number of tensors in the shard's header.
    pub tensors: u64,
    pub bytes: u64,
}

/// The `tensors` object: column → info, in the order the columns were written (the JSON object
/// keeps that order). Duplicate keys are rejected when parsing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ColumnMap(pub Vec<(String, ManifestTensor)>);

impl ColumnMap {
    pub fn get(&self, name: &str) -> Option<&ManifestTensor> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(n, _)| n.as_str())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl Serialize for ColumnMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for ColumnMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ColumnMap;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of column name → {dtype, sample_shape}")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ColumnMap, A::Error> {
                let mut out: Vec<(String, ManifestTensor)> = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, ManifestTensor>()? {
                    if out.iter().any(|(n, _)| *n == k) {
                        return Err(de::Error::custom(format!("duplicate column `{k}`")));
                    }
                    out.push((k, v));
                }
                Ok(ColumnMap(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// A field that must be present, even when its value is null.
fn required<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    Option::<T>::deserialize(d)
}

/// `dataset_manifest.json`, field for field as the JSON Schema defines it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub format_version: u64,
    pub created_by: String,
    pub layout: LayoutKind,
    #[serde(deserialize_with = "required")]
    pub batch_size: Option<u64>,
    #[serde(deserialize_with = "required")]
    pub tail_strategy: Option<TailStrategy>,
    #[serde(deserialize_with = "required")]
    pub kv_separator: Option<String>,
    pub tensors: ColumnMap,
    pub total_samples: u64,
    pub padded_samples: u64,
    pub dropped_samples: u64,
    pub total_bytes: u64,
    pub shards: Vec<ManifestShard>,
}

/// Why the job cannot commit, or a manifest is invalid.
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

    #[error("task report of partition {partition} is invalid: {problem}")]
    BadReport { partition: u32, problem: String },

    #[error("cannot append to the existing dataset: {problem}")]
    AppendMismatch { problem: String },

    #[error("invalid dataset manifest: {problem}")]
    InvalidManifest { problem: String },

    #[error("dataset manifest has format_version {found}; this version of safetensors-spark reads only format_version {MANIFEST_FORMAT_VERSION}")]
    UnsupportedVersion { found: String },

    #[error("shard rewrite of {file}: {problem}")]
    Rewrite { file: String, problem: String },

    #[error(transparent)]
    Format(#[from] FormatError),
}

fn bad_report(partition: u32, problem: impl Into<String>) -> CommitError {
    CommitError::BadReport {
        partition,
        problem: problem.into(),
    }
}

fn invalid(problem: impl Into<String>) -> CommitError {
    CommitError::InvalidManifest {
        problem: problem.into(),
    }
}

/// Parses the file name `part-{partition}-{shard}-{uuid}.safetensors`; `None` when it is not
/// one (the uuid must be lowercase and hyphenated).
pub fn parse_shard_file_name(name: &str) -> Option<(u32, u32, &str)> {
    let rest = name.strip_prefix("part-")?.strip_suffix(".safetensors")?;
    let (partition, rest) = rest.split_once('-')?;
    let (shard, uuid) = rest.split_once('-')?;
    let digits = |s: &str, min: usize| s.len() >= min && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(partition, 5) || !digits(shard, 4) {
        return None;
    }
    let groups: Vec<&str> = uuid.split('-').collect();
    let lens = [8, 4, 4, 4, 12];
    let uuid_ok = groups.len() == 5
        && groups.iter().zip(lens).all(|(g, n)| {
            g.len() == n
                && g.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
    if !uuid_ok {
        return None;
    }
    Some((partition.parse().ok()?, shard.parse().ok()?, uuid))
}

impl Manifest {
    /// A manifest with no shards for `plan`'s layout.
    pub fn empty(plan: &WritePlan) -> Manifest {
        let (layout, batch_size, tail_strategy, kv_separator) = match &plan.layout {
            WriteLayout::Batch {
                batch_size,
                tail_strategy,
            } => (
                LayoutKind::Batch,
                Some(*batch_size),
                Some(*tail_strategy),
                None,
            ),
            WriteLayout::Kv { kv_separator, .. } => {
                (LayoutKind::Kv, None, None, Some(kv_separator.clone()))
            }
        };
        Manifest {
            format: MANIFEST_FORMAT.to_string(),
            format_version: MANIFEST_FORMAT_VERSION,
            created_by: format!("safetensors-spark {}", crate::VERSION),
            layout,
            batch_size,
            tail_strategy,
            kv_separator,
            tensors: ColumnMap::default(),
            total_samples: 0,
            padded_samples: 0,
            dropped_samples: 0,
            total_bytes: 0,
            shards: Vec::new(),
        }
    }

    /// Pretty JSON with a final newline.
    pub fn to_json_pretty(&self) -> Result<String, CommitError> {
        let mut s = serde_json::to_string_pretty(self).map_err(|e| invalid(e.to_string()))?;
        s.push('\n');
        Ok(s)
    }

    /// Checks everything the JSON Schema checks, plus the sums and the sort order.
    pub fn validate(&self) -> Result<(), CommitError> {
        if self.format != MANIFEST_FORMAT {
            return Err(invalid(format!(
                "format is '{}', expected '{MANIFEST_FORMAT}'",
                self.format
            )));
        }
        if self.format_version != MANIFEST_FORMAT_VERSION {
            return Err(CommitError::UnsupportedVersion {
                found: self.format_version.to_string(),
            });
        }
        if self.created_by.is_empty() {
            return Err(invalid("created_by is empty"));
        }
        match self.layout {
            LayoutKind::Batch => {
                if self.batch_size.is_none_or(|b| b == 0) {
                    return Err(invalid("batch layout needs batch_size ≥ 1"));
                }
                if self.tail_strategy.is_none() || self.kv_separator.is_some() {
                    return Err(invalid(
                        "batch layout needs a tail_strategy and a null kv_separator",
                    ));
                }
                if let Some((name, _)) = self
                    .tensors
                    .0
                    .iter()
                    .find(|(_, t)| t.sample_shape.is_none())
                {
                    return Err(invalid(format!(
                        "column '{name}' has a null sample_shape, which only KV layout allows"
                    )));
                }
            }
            LayoutKind::Kv => {
                if self.batch_size.is_some() || self.tail_strategy.is_some() {
                    return Err(invalid(
                        "KV layout needs a null batch_size and a null tail_strategy",
                    ));
                }
                if self.kv_separator.as_deref().is_none_or(str::is_empty) {
                    return Err(invalid("KV layout needs a non-empty kv_separator"));
                }
            }
        }
        if let Some((name, t)) = self.tensors.0.iter().find(|(_, t)| !t.dtype.is_writable()) {
            return Err(invalid(format!(
                "column '{name}' has dtype {}, which the writer does not produce",
                t.dtype
            )));
        }
        if self.tail_strategy != Some(TailStrategy::Pad)
            && (self.padded_samples != 0 || self.shards.iter().any(|s| s.padded_samples != 0))
        {
            return Err(invalid("padded samples without tail_strategy=pad"));
        }
        if self.tail_strategy != Some(TailStrategy::Drop) && self.dropped_samples != 0 {
            return Err(invalid("dropped samples without tail_strategy=drop"));
        }
        for pair in self.shards.windows(2) {
            if pair[0].file.as_bytes() >= pair[1].file.as_bytes() {
                return Err(invalid(format!(
                    "shards are not sorted by file name or are repeated: {} before {}",
                    pair[0].file, pair[1].file
                )));
            }
        }
        for s in &self.shards {
            let Some((partition, _, _)) = parse_shard_file_name(&s.file) else {
                return Err(invalid(format!("'{}' is not a shard file name", s.file)));
            };
            if partition != s.partition {
                return Err(invalid(format!(
                    "shard {} lists partition {}",
                    s.file, s.partition
                )));
            }
            if s.samples == 0 || s.tensors == 0 {
                return Err(invalid(format!(
                    "shard {} has no samples or no tensors",
                    s.file
                )));
            }
        }
        let sum = |f: fn(&ManifestShard) -> u64| {
            self.shards
                .iter()
                .try_fold(0u64, |a, s| a.checked_add(f(s)))
        };
        for (name, total, field) in [
            ("total_samples", self.total_samples, sum(|s| s.samples)),
            (
                "padded_samples",
                self.padded_samples,
                sum(|s| s.padded_samples),
            ),
            ("total_bytes", self.total_bytes, sum(|s| s.bytes)),
        ] {
            if field != Some(total) {
                return Err(invalid(format!(
                    "{name} is {total} but the shards sum to {}",
                    field.map_or_else(|| "more than 2^64".to_string(), |v| v.to_string())
                )));
            }
        }
        if self.shards.is_empty() && !self.tensors.is_empty() {
            return Err(invalid("tensors must be {} when there are no shards"));
        }
        Ok(())
    }

    fn recompute_totals(&mut self) {
        self.total_samples = self.shards.iter().map(|s| s.samples).sum();
        self.padded_samples = self.shards.iter().map(|s| s.padded_samples).sum();
        self.total_bytes = self.shards.iter().map(|s| s.bytes).sum();
    }
}

/// Parses and validates a manifest. A `format_version` other than 1 is reported as such, before
/// any other field is looked at.
pub fn parse_manifest(json: &str) -> Result<Manifest, CommitError> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| invalid(e.to_string()))?;
    match value.get("format_version") {
        Some(v) if v.as_u64() == Some(MANIFEST_FORMAT_VERSION) => {}
        Some(v) => {
            return Err(CommitError::UnsupportedVersion {
                found: v.to_string(),
            })
        }
        None => return Err(invalid("missing field `format_version`")),
    }
    let manifest: Manifest = serde_json::from_str(json).map_err(|e| invalid(e.to_string()))?;
    manifest.validate()?;
    Ok(manifest)
}

/// Writes `manifest` to `path` atomically (temporary sibling, fsync, rename): a reader sees the
/// old file or the new one, never a partial one.
pub fn write_manifest(path: &Path, manifest: &Manifest) -> Result<(), CommitError> {
    use std::io::Write;
    let json = manifest.to_json_pretty()?;
    let tmp = crate::file::temp_sibling(path);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(json.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        CommitError::Format(FormatError::Io {
            path: path.to_path_buf(),
            source: e,
        })
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
    pub samples: u64,
    /// The tensors kept, with their new absolute offsets (`sample_key`/`column` not set).
    pub tensors: Vec<TensorReport>,
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
    let tensors = TensorReport::for_tensors(&written.tensors, written.data_start, |_| (None, None));
    Ok(RewrittenShard {
        file: output
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        path: written.path,
        bytes: written.bytes,
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
        let new: HashMap<&str, &TensorReport> =
            done.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
        for t in &mut shard.tensors {
            let n = new
                .get(t.name.as_str())
                .ok_or_else(|| problem(format!("tensor '{}' is missing", t.name)))?;
            t.data_start = n.data_start;
            t.data_end = n.data_end;
        }
        shard.bytes = done.bytes;
        let entry = self
            .manifest
            .shards
            .iter_mut()
            .find(|s| s.file == done.file)
            .ok_or_else(|| problem("not in the manifest".to_string()))?;
        entry.bytes = done.bytes;
        self.manifest.recompute_totals();
        Ok(())
    }
}

fn shape_str(s: &Option<Vec<u64>>) -> String {
    s.as_ref()
        .map_or_else(|| "varying shapes".to_string(), |s| format!("{s:?}"))
}

/// Checks the tasks' reports against the plan and each other and builds the manifest (merged
/// with `existing` for an append). See spec/dataset.md §2, §3 and §5.
pub fn commit_manifest(
    plan: &WritePlan,
    reports: &[TaskReport],
    existing: Option<&Manifest>,
) -> Result<CommitPlan, CommitError> {
    let kv = match &plan.layout {
        WriteLayout::Kv { duplicates, .. } => Some(*duplicates),
        WriteLayout::Batch { .. } => None,
    };
    let tail = match &plan.layout {
        WriteLayout::Batch { tail_strategy, .. } => Some(*tail_strategy),
        WriteLayout::Kv { .. } => None,
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
                    sample_shape: common_shape,
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

    let mut manifest = Manifest::empty(plan);
    if !shards.is_empty() {
        manifest.tensors = tensors;
    }
    manifest.shards = shards
        .iter()
        .map(|s| ManifestShard {
            file: s.file.clone(),
            partition: s.partition,
            samples: s.samples,
            padded_samples: s.padded_samples,
            tensors: s.tensors.len() as u64,
            bytes: s.bytes,
        })
        .collect();
    manifest.recompute_totals();
    if tail == Some(TailStrategy::Drop) {
        manifest.dropped_samples = reports.iter().map(|r| r.dropped_samples).sum();
    }
    if let Some(old) = existing {
        manifest = merge_append(old, manifest)?;
    }
    manifest.validate()?;
    Ok(CommitPlan {
        manifest,
        rewrites,
        shards,
    })
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
        if !kv && c.sample_shape.is_none() {
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
        if s.samples == 0 || s.tensors.is_empty() {
            return Err(bad_report(p, format!("shard {} is empty", s.file)));
        }
        if s.padded_samples != 0 && tail != Some(TailStrategy::Pad) {
            return Err(bad_report(
                p,
                format!("shard {} has padding without tail_strategy=pad", s.file),
            ));
        }
        if !kv && s.tensors.len() != plan.columns.len() {
            return Err(bad_report(
                p,
                format!(
                    "shard {} has {} tensors, expected one per column ({})",
                    s.file,
                    s.tensors.len(),
                    plan.columns.len()
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
    shards.retain(|s| !s.tensors.is_empty());
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

/// Appends the manifest of this write (`new`) to the dataset's `old` one.
fn merge_append(old: &Manifest, new: Manifest) -> Result<Manifest, CommitError> {
    let mismatch = |problem: String| CommitError::AppendMismatch { problem };
    if old.layout != new.layout
        || old.batch_size != new.batch_size
        || old.tail_strategy != new.tail_strategy
        || old.kv_separator != new.kv_separator
    {
        let describe = |m: &Manifest| match m.layout {
            LayoutKind::Batch => format!(
                "batch mode with batch_size={} and tail_strategy={}",
                m.batch_size.unwrap_or_default(),
                m.tail_strategy.map(tail_name).unwrap_or("none")
            ),
            LayoutKind::Kv => format!(
                "KV mode with kv_separator='{}'",
                m.kv_separator.as_deref().unwrap_or_default()
            ),
        };
        return Err(mismatch(format!(
            "the dataset is in {}, this write is in {}",
            describe(old),
            describe(&new)
        )));
    }
    let mut tensors = old.tensors.clone();
    if tensors.is_empty() {
        tensors = new.tensors.clone();
    } else if !new.tensors.is_empty() {
        let old_names: BTreeSet<&str> = old.tensors.names().collect();
        let new_names: BTreeSet<&str> = new.tensors.names().collect();
        if old_names != new_names {
            return Err(mismatch(format!(
                "the dataset has columns {}, this write has {}",
                old_names.into_iter().collect::<Vec<_>>().join(", "),
                new_names.into_iter().collect::<Vec<_>>().join(", ")
            )));
        }
        for (name, t) in &mut tensors.0 {
            let Some(n) = new.tensors.get(name) else {
                continue;
            };
            if n.dtype != t.dtype {
                return Err(mismatch(format!(
                    "column '{name}' is stored as {}, this write has {}",
                    t.dtype, n.dtype
                )));
            }
            if t.sample_shape != n.sample_shape {
                if old.layout == LayoutKind::Batch {
                    return Err(mismatch(format!(
                        "column '{name}' has sample shape {}, this write has {}",
                        shape_str(&t.sample_shape),
                        shape_str(&n.sample_shape)
                    )));
                }
                t.sample_shape = None;
            }
        }
    }
    let mut shards = old.shards.clone();
    for s in &new.shards {
        if shards.iter().any(|o| o.file == s.file) {
            return Err(mismatch(format!(
                "shard {} is already in the dataset",
                s.file
            )));
        }
        shards.push(s.clone());
    }
    shards.sort_by(|a, b| a.file.as_bytes().cmp(b.file.as_bytes()));
    let mut merged = Manifest {
        tensors,
        shards,
        dropped_samples: old.dropped_samples + new.dropped_samples,
        ..new
    };
    merged.recompute_totals();
    Ok(merged)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
