//! `dataset_manifest.json` (spec/dataset.md §5, schemas/dataset_manifest.schema.json).
//!
//! The manifest carries the published dataset format's fields under their published names
//! (`format_version` "1.0", `safetensors_version`, `total_samples`, `total_bytes`,
//! `shards[].shard_path/samples_count/bytes`, `schema.<column>.dtype/shape`), and, in manifests
//! this connector writes, its own fields beside them ([`ManifestExt`]). A *published-only*
//! manifest (as other writers of the format produce) parses too, with `ext: None`.
//!
//! Every shard name passes [`check_shard_path`] when a manifest is parsed, so no caller ever
//! joins an untrusted name to a dataset path.

use super::names::{check_shard_path, parse_shard_file_name};
use super::DatasetError;
use safetensors_spark_format::json_object;
use safetensors_spark_format::Dtype;
use serde::de::Deserializer;
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The published dataset format's `format_version`.
pub const FORMAT_VERSION: &str = "1.0";
/// The published dataset format's `safetensors_version`.
pub const SAFETENSORS_VERSION: &str = "1.0";
/// `format` of manifests this connector writes: the sign that [`ManifestExt`] is present.
pub const MANIFEST_FORMAT: &str = "safetensors-spark-dataset";

/// How a dataset's shards hold its rows: `"batch"` (a shard's tensors stack a batch of
/// samples) or `"kv"` (one tensor per key and column). Serialised as the manifest's `layout`
/// and the shards' `safetensors_spark.layout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DatasetMode {
    Batch,
    Kv,
}

/// Batch mode's handling of a partition's last rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TailStrategy {
    Write,
    Drop,
    Pad,
}

impl TailStrategy {
    pub fn name(self) -> &'static str {
        match self {
            TailStrategy::Write => "write",
            TailStrategy::Drop => "drop",
            TailStrategy::Pad => "pad",
        }
    }
}

/// `schema.<column>`: the dtype and shape stored for a column.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestTensor {
    pub dtype: Dtype,
    /// Batch mode: `[batch_size, …sample shape]`, the shape of a full shard's tensor. KV
    /// mode: the shape of one row's tensor, `None` (null) when rows differ.
    #[serde(default)]
    pub shape: Option<Vec<u64>>,
    /// Ours: the column is ragged (spec/dataset.md §2.1): `shape` is null, each shard holds the
    /// values of its rows concatenated under the column's name and the row boundaries under
    /// [`ragged_offsets_name`]. Absent for a fixed-shape column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ragged: Option<RaggedColumn>,
}

/// `schema.<column>.ragged`: what a ragged column's rows are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RaggedColumn {
    /// The shape of one element of a row (the values tensor's dimensions after the first);
    /// `[]` for rows of scalars, bytes or characters.
    pub inner_shape: Vec<u64>,
    /// What a row is read back as.
    pub element: RaggedElement,
}

/// The Spark type a ragged column's rows came from, and are read back as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RaggedElement {
    /// `array<…>` of numbers (nested to the inner shape).
    Array,
    /// `binary`: the row's bytes (dtype U8).
    Binary,
    /// `string`: the row's UTF-8 bytes (dtype U8).
    String,
}

/// Name of the tensor holding the row boundaries of ragged column `column` in a shard:
/// `rows + 1` I64 values, starting at 0 (spec/dataset.md §2.1).
pub fn ragged_offsets_name(column: &str) -> String {
    format!("{column}.offsets")
}

/// `shards[]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestShard {
    /// File name in the dataset directory (checked by [`check_shard_path`]).
    pub shard_path: String,
    /// Real rows (batch) or keys (KV) in the shard; padding rows are not counted.
    pub samples_count: u64,
    /// The shard's file size.
    pub bytes: u64,
    /// The partition in the file name (this connector's manifests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
    /// Zero rows after the real ones (`tail_strategy=pad`; this connector's manifests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub padded_samples: Option<u64>,
    /// Tensors in the shard's header (this connector's manifests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_tensors: Option<u64>,
    /// Ours: CRC-32C (Castagnoli) of the whole shard file, 8 lowercase hex digits
    /// (spec/dataset.md §5). Absent in manifests written before checksums were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32c: Option<String>,
    /// Ours: the version that first listed this shard (row provenance, spec/dataset.md §5.11):
    /// set by the commit that adds the shard, kept by every later one. Absent for shards listed
    /// before versions recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added_version: Option<u64>,
}

impl ManifestShard {
    pub fn padded(&self) -> u64 {
        self.padded_samples.unwrap_or(0)
    }
}

/// The `schema` object: column → info, in the order the columns were written (the JSON object
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
        json_object::deserialize_unique_entries(
            d,
            "an object of column name → {dtype, shape}",
            |k| format!("duplicate column `{k}`"),
        )
        .map(ColumnMap)
    }
}

/// A field that must be present, even when its value is null.
fn required<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    Option::<T>::deserialize(d)
}

/// This connector's fields of a manifest (all present in what it writes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestExt {
    /// Always [`MANIFEST_FORMAT`].
    pub format: String,
    pub created_by: String,
    /// The commit number: 1 for the first commit of the directory, +1 for every later one
    /// (spec/dataset.md §5.3).
    pub manifest_version: u64,
    #[serde(rename = "layout")]
    pub mode: DatasetMode,
    #[serde(deserialize_with = "required")]
    pub batch_size: Option<u64>,
    #[serde(deserialize_with = "required")]
    pub tail_strategy: Option<TailStrategy>,
    #[serde(deserialize_with = "required")]
    pub kv_separator: Option<String>,
    pub padded_samples: u64,
    pub dropped_samples: u64,
    /// Streaming writes (spec/dataset.md §5.7): query id → the last micro-batch id committed by
    /// that query. Optional and additive: absent (empty) unless a streaming query wrote here.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stream_commits: BTreeMap<String, u64>,
    /// When this version was committed: milliseconds since the Unix epoch (UTC), taken by the
    /// committing process just before it creates the version. Absent in older manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committed_at_ms: Option<u64>,
    /// What the commit did (spec/dataset.md §5.8). Absent in older manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<Operation>,
    /// The writer's `commit_message` option, verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_message: Option<String>,
    /// The Spark application id of the committing driver (absent for the CLI and Python).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_id: Option<String>,
    /// The dataset's retention period in seconds (spec/dataset.md §5.8): shards a newer version
    /// no longer lists stay on disk until a vacuum after this period. Absent: the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_seconds: Option<u64>,
    /// A vacuum version: what that vacuum deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vacuumed: Option<Vacuumed>,
    /// Versions between checkpoints of the manifest log (spec/dataset.md §5.10). Absent: the
    /// default, [`crate::log::DEFAULT_CHECKPOINT_INTERVAL`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_interval: Option<u64>,
}

/// `operation`: the kind of commit that made a version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    /// The first commit to a path with no manifest.
    Create,
    Append,
    Overwrite,
    /// One micro-batch of a streaming query.
    StreamBatch,
    /// Shards merged into fewer; the same rows.
    Compaction,
    /// Superseded shards deleted; the same shards listed.
    Vacuum,
    /// Rows removed (spec/dataset.md §5.11): the shards holding them rewritten without them.
    Delete,
}

/// `vacuumed`: the files a vacuum version deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vacuumed {
    pub files: u64,
    pub bytes: u64,
}

/// `dataset_manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Always [`FORMAT_VERSION`].
    pub format_version: String,
    pub safetensors_version: String,
    /// Real rows (KV: keys) stored, padding excluded: Σ `shards[].samples_count`.
    pub total_samples: u64,
    /// Σ `shards[].bytes`.
    pub total_bytes: u64,
    /// Sorted by `shard_path` as UTF-8 bytes (this connector's manifests).
    pub shards: Vec<ManifestShard>,
    pub schema: ColumnMap,
    /// `None` for a published-only manifest.
    pub ext: Option<ManifestExt>,
}

/// The published fields, as they are serialised (and parsed) in a manifest.
#[derive(Serialize, Deserialize)]
struct Published {
    #[serde(deserialize_with = "string_version")]
    format_version: String,
    #[serde(deserialize_with = "string_version")]
    safetensors_version: String,
    total_samples: u64,
    total_bytes: u64,
    shards: Vec<ManifestShard>,
    #[serde(default)]
    schema: ColumnMap,
}

/// `"1.0"`, or a number the error message can show.
fn string_version<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => Ok(s),
        other => Ok(other.to_string()),
    }
}

impl Serialize for Manifest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("format_version", &self.format_version)?;
        map.serialize_entry("safetensors_version", &self.safetensors_version)?;
        map.serialize_entry("total_samples", &self.total_samples)?;
        map.serialize_entry("total_bytes", &self.total_bytes)?;
        map.serialize_entry("shards", &self.shards)?;
        map.serialize_entry("schema", &self.schema)?;
        if let Some(x) = &self.ext {
            map.serialize_entry("format", &x.format)?;
            map.serialize_entry("created_by", &x.created_by)?;
            map.serialize_entry("manifest_version", &x.manifest_version)?;
            map.serialize_entry("layout", &x.mode)?;
            map.serialize_entry("batch_size", &x.batch_size)?;
            map.serialize_entry("tail_strategy", &x.tail_strategy)?;
            map.serialize_entry("kv_separator", &x.kv_separator)?;
            map.serialize_entry("padded_samples", &x.padded_samples)?;
            map.serialize_entry("dropped_samples", &x.dropped_samples)?;
            if !x.stream_commits.is_empty() {
                map.serialize_entry("stream_commits", &x.stream_commits)?;
            }
            if let Some(v) = &x.committed_at_ms {
                map.serialize_entry("committed_at_ms", v)?;
            }
            if let Some(v) = &x.operation {
                map.serialize_entry("operation", v)?;
            }
            if let Some(v) = &x.commit_message {
                map.serialize_entry("commit_message", v)?;
            }
            if let Some(v) = &x.app_id {
                map.serialize_entry("app_id", v)?;
            }
            if let Some(v) = &x.retention_seconds {
                map.serialize_entry("retention_seconds", v)?;
            }
            if let Some(v) = &x.vacuumed {
                map.serialize_entry("vacuumed", v)?;
            }
            if let Some(v) = &x.checkpoint_interval {
                map.serialize_entry("checkpoint_interval", v)?;
            }
        }
        map.end()
    }
}

fn invalid(problem: impl Into<String>) -> DatasetError {
    DatasetError::InvalidManifest {
        problem: problem.into(),
    }
}

/// Parses and validates a manifest: this connector's (with `format`) strictly, a published-only
/// one by the published field rules. A `format_version` other than "1.0" is reported as such,
/// before any other field is looked at; every shard name must pass [`check_shard_path`].
pub fn parse_manifest(json: &str) -> Result<Manifest, DatasetError> {
    let manifest = parse_manifest_fields(json)?;
    manifest.validate()?;
    Ok(manifest)
}

/// [`parse_manifest`] without [`Manifest::validate`]: the fields of a delta log entry's header,
/// whose shards are the replayed state's (the state is validated once it is whole).
pub(crate) fn parse_manifest_fields(json: &str) -> Result<Manifest, DatasetError> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| invalid(e.to_string()))?;
    let Some(object) = value.as_object() else {
        return Err(invalid("the manifest is not a JSON object"));
    };
    match object.get("format_version") {
        Some(serde_json::Value::String(v)) if v == FORMAT_VERSION => {}
        Some(v) => {
            return Err(DatasetError::UnsupportedVersion {
                found: v.to_string(),
            })
        }
        None => return Err(invalid("missing field `format_version`")),
    }
    // From the text, not the Value: a map Value would silently keep one of two equal keys.
    let published: Published = serde_json::from_str(json).map_err(|e| invalid(e.to_string()))?;
    let ext = if object.contains_key("format") {
        Some(serde_json::from_value::<ManifestExt>(value).map_err(|e| invalid(e.to_string()))?)
    } else {
        None
    };
    let manifest = Manifest {
        format_version: published.format_version,
        safetensors_version: published.safetensors_version,
        total_samples: published.total_samples,
        total_bytes: published.total_bytes,
        shards: published.shards,
        schema: published.schema,
        ext,
    };
    Ok(manifest)
}

impl Manifest {
    /// A manifest of this connector with no shards.
    pub fn empty(ext: ManifestExt) -> Manifest {
        Manifest {
            format_version: FORMAT_VERSION.to_string(),
            safetensors_version: SAFETENSORS_VERSION.to_string(),
            total_samples: 0,
            total_bytes: 0,
            shards: Vec::new(),
            schema: ColumnMap::default(),
            ext: Some(ext),
        }
    }

    /// The dataset mode, when the manifest says it (this connector's manifests).
    pub fn mode(&self) -> Option<DatasetMode> {
        self.ext.as_ref().map(|x| x.mode)
    }

    /// The commit number, 0 for a published-only manifest.
    pub fn manifest_version(&self) -> u64 {
        self.ext.as_ref().map_or(0, |x| x.manifest_version)
    }

    /// The shape of one sample of `column`: batch mode drops the leading batch dimension of
    /// `schema.<column>.shape`; KV mode's shape is already per row (`None` when rows differ).
    pub fn sample_shape(&self, column: &str) -> Option<Vec<u64>> {
        let shape = self.schema.get(column)?.shape.as_ref()?;
        match self.mode() {
            Some(DatasetMode::Batch) => shape.split_first().map(|(_, rest)| rest.to_vec()),
            _ => Some(shape.clone()),
        }
    }

    /// Pretty JSON with a final newline.
    pub fn to_json_pretty(&self) -> Result<String, DatasetError> {
        let mut s = serde_json::to_string_pretty(self).map_err(|e| invalid(e.to_string()))?;
        s.push('\n');
        Ok(s)
    }

    /// Checks every field rule: the published ones for every manifest (shard names by
    /// [`check_shard_path`], unique; sums), and this connector's for its own manifests.
    pub fn validate(&self) -> Result<(), DatasetError> {
        if self.format_version != FORMAT_VERSION {
            return Err(DatasetError::UnsupportedVersion {
                found: self.format_version.clone(),
            });
        }
        if self.safetensors_version != SAFETENSORS_VERSION {
            return Err(invalid(format!(
                "safetensors_version is '{}', expected '{SAFETENSORS_VERSION}'",
                self.safetensors_version
            )));
        }
        let mut names = BTreeSet::new();
        for s in &self.shards {
            check_shard_path(&s.shard_path)?;
            if !names.insert(s.shard_path.as_str()) {
                return Err(invalid(format!("shard {} is listed twice", s.shard_path)));
            }
        }
        let sum = |f: fn(&ManifestShard) -> u64| {
            self.shards
                .iter()
                .try_fold(0u64, |a, s| a.checked_add(f(s)))
        };
        for (name, total, field) in [
            (
                "total_samples",
                self.total_samples,
                sum(|s| s.samples_count),
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
        match &self.ext {
            Some(x) => self.validate_ext(x),
            None => Ok(()),
        }
    }

    fn validate_ext(&self, x: &ManifestExt) -> Result<(), DatasetError> {
        if x.format != MANIFEST_FORMAT {
            return Err(invalid(format!(
                "format is '{}', expected '{MANIFEST_FORMAT}'",
                x.format
            )));
        }
        if x.created_by.is_empty() {
            return Err(invalid("created_by is empty"));
        }
        if x.manifest_version == 0 {
            return Err(invalid("manifest_version must be ≥ 1"));
        }
        match x.mode {
            DatasetMode::Batch => {
                let Some(batch) = x.batch_size.filter(|b| *b >= 1) else {
                    return Err(invalid("batch layout needs batch_size ≥ 1"));
                };
                if x.tail_strategy.is_none() || x.kv_separator.is_some() {
                    return Err(invalid(
                        "batch layout needs a tail_strategy and a null kv_separator",
                    ));
                }
                for (name, t) in &self.schema.0 {
                    if t.ragged.is_some() {
                        // a ragged column's rows differ: no batch shape (spec/dataset.md §2.1)
                        if t.shape.is_some() {
                            return Err(invalid(format!(
                                "column '{name}' is ragged, so its schema.shape must be null"
                            )));
                        }
                        continue;
                    }
                    if t.shape.as_ref().and_then(|s| s.first()) != Some(&batch) {
                        return Err(invalid(format!(
                            "column '{name}': in batch layout schema.shape is [batch_size, …sample shape], got {}",
                            t.shape.as_ref().map_or_else(|| "null".to_string(), |s| format!("{s:?}"))
                        )));
                    }
                }
            }
            DatasetMode::Kv => {
                if x.batch_size.is_some() || x.tail_strategy.is_some() {
                    return Err(invalid(
                        "KV layout needs a null batch_size and a null tail_strategy",
                    ));
                }
                if x.kv_separator.as_deref().is_none_or(str::is_empty) {
                    return Err(invalid("KV layout needs a non-empty kv_separator"));
                }
                if let Some((name, _)) = self.schema.0.iter().find(|(_, t)| t.ragged.is_some()) {
                    return Err(invalid(format!(
                        "column '{name}' is ragged, which only the batch layout stores"
                    )));
                }
            }
        }
        if let Some((name, t)) = self.schema.0.iter().find(|(_, t)| !t.dtype.is_writable()) {
            return Err(invalid(format!(
                "column '{name}' has dtype {}, which the writer does not produce",
                t.dtype
            )));
        }
        let padded_total = self
            .shards
            .iter()
            .try_fold(0u64, |a, s| a.checked_add(s.padded()));
        if padded_total != Some(x.padded_samples) {
            return Err(invalid(format!(
                "padded_samples is {} but the shards sum to {}",
                x.padded_samples,
                padded_total.map_or_else(|| "more than 2^64".to_string(), |v| v.to_string())
            )));
        }
        if x.tail_strategy != Some(TailStrategy::Pad) && x.padded_samples != 0 {
            return Err(invalid("padded samples without tail_strategy=pad"));
        }
        if x.tail_strategy != Some(TailStrategy::Drop) && x.dropped_samples != 0 {
            return Err(invalid("dropped samples without tail_strategy=drop"));
        }
        for pair in self.shards.windows(2) {
            if pair[0].shard_path.as_bytes() >= pair[1].shard_path.as_bytes() {
                return Err(invalid(format!(
                    "shards are not sorted by shard_path: {} before {}",
                    pair[0].shard_path, pair[1].shard_path
                )));
            }
        }
        for s in &self.shards {
            let Some((partition, _, _)) = parse_shard_file_name(&s.shard_path) else {
                return Err(invalid(format!(
                    "'{}' is not a shard file name of this connector",
                    s.shard_path
                )));
            };
            if s.partition != Some(partition) {
                return Err(invalid(format!(
                    "shard {} lists partition {:?}",
                    s.shard_path, s.partition
                )));
            }
            if s.samples_count == 0 || s.num_tensors.is_none_or(|n| n == 0) {
                return Err(invalid(format!(
                    "shard {} has no samples or no tensors",
                    s.shard_path
                )));
            }
            if s.padded_samples.is_none() {
                return Err(invalid(format!(
                    "shard {} has no padded_samples",
                    s.shard_path
                )));
            }
        }
        if self.shards.is_empty() && !self.schema.is_empty() {
            return Err(invalid("schema must be {} when there are no shards"));
        }
        if let Some(q) = x.stream_commits.keys().find(|q| !valid_query_id(q)) {
            return Err(invalid(format!(
                "stream_commits has the query id {q:?}; expected 1 to 128 characters of \
                 letters, digits, '-' and '_'"
            )));
        }
        Ok(())
    }

    /// A copy of the manifest's own fields, its shard list empty (the totals kept as they are).
    pub fn clone_without_shards(&self) -> Manifest {
        Manifest {
            format_version: self.format_version.clone(),
            safetensors_version: self.safetensors_version.clone(),
            total_samples: self.total_samples,
            total_bytes: self.total_bytes,
            shards: Vec::new(),
            schema: self.schema.clone(),
            ext: self.ext.clone(),
        }
    }

    /// Sets the totals from the shards.
    pub fn recompute_totals(&mut self) {
        self.total_samples = self.shards.iter().map(|s| s.samples_count).sum();
        self.total_bytes = self.shards.iter().map(|s| s.bytes).sum();
        let padded = self.shards.iter().map(ManifestShard::padded).sum();
        if let Some(x) = &mut self.ext {
            x.padded_samples = padded;
        }
    }
}

/// One line describing a manifest's mode and its options, for error messages.
fn describe(x: &ManifestExt) -> String {
    match x.mode {
        DatasetMode::Batch => format!(
            "batch mode with batch_size={} and tail_strategy={}",
            x.batch_size.unwrap_or_default(),
            x.tail_strategy.map_or("none", TailStrategy::name)
        ),
        DatasetMode::Kv => format!(
            "KV mode with kv_separator='{}'",
            x.kv_separator.as_deref().unwrap_or_default()
        ),
    }
}

fn ragged_str(r: &Option<RaggedColumn>) -> String {
    match r {
        None => "fixed-shape".to_string(),
        Some(r) => format!("ragged (inner shape {:?})", r.inner_shape),
    }
}

fn shape_str(s: &Option<Vec<u64>>) -> String {
    s.as_ref()
        .map_or_else(|| "varying shapes".to_string(), |s| format!("{s:?}"))
}

/// The manifest of a commit: `new` (one write's shards, this connector's manifest) on top of
/// `base`, the latest committed manifest of the directory (`None`: there is none). An append
/// merges the shards (mode, options and columns must agree, spec/dataset.md §5.2); an
/// overwrite keeps only `new`'s. Either way the result's `manifest_version` is one more than
/// `base`'s. `replacements` (appends only) swap shards of `base` for rewritten copies, or drop
/// them (`None`): a KV append with `lastWin` that replaces keys an earlier write stored.
pub fn next_manifest(
    base: Option<&Manifest>,
    new: &Manifest,
    append: bool,
    replacements: &[ShardReplacement],
) -> Result<Manifest, DatasetError> {
    let Some(new_ext) = &new.ext else {
        return Err(invalid("a write's manifest must be this connector's"));
    };
    let version = base.map_or(0, Manifest::manifest_version) + 1;
    let mut out = match base {
        Some(old) if append => merge_append(old, new, new_ext)?,
        _ => new.clone(),
    };
    if !replacements.is_empty() {
        let Some(old) = base.filter(|_| append) else {
            return Err(invalid("shard replacements need an append to a dataset"));
        };
        for r in replacements {
            let at = out
                .shards
                .iter()
                .position(|s| s.shard_path == r.old)
                .filter(|_| old.shards.iter().any(|s| s.shard_path == r.old))
                .ok_or_else(|| {
                    invalid(format!(
                        "replaced shard {} is not in the dataset's manifest",
                        r.old
                    ))
                })?;
            out.shards.remove(at);
            if let Some(n) = &r.new {
                if out.shards.iter().any(|s| s.shard_path == n.shard_path) {
                    return Err(invalid(format!("shard {} is listed twice", n.shard_path)));
                }
                out.shards.push(n.clone());
            }
        }
        out.shards
            .sort_by(|a, b| a.shard_path.as_bytes().cmp(b.shard_path.as_bytes()));
    }
    if let Some(x) = &mut out.ext {
        x.manifest_version = version;
        // the dataset's retention outlives every write that does not set it (§5.8.1); a
        // vacuum's record belongs to the vacuum version only
        if x.retention_seconds.is_none() {
            x.retention_seconds = base
                .and_then(|b| b.ext.as_ref())
                .and_then(|b| b.retention_seconds);
        }
        if x.checkpoint_interval.is_none() {
            x.checkpoint_interval = base
                .and_then(|b| b.ext.as_ref())
                .and_then(|b| b.checkpoint_interval);
        }
        x.vacuumed = None;
        x.operation = Some(match base {
            None => Operation::Create,
            Some(_) if append => Operation::Append,
            Some(_) => Operation::Overwrite,
        });
        // a stream's record outlives any write, an overwrite included: a replay of a batch the
        // stream committed before the overwrite must still change nothing (§5.7)
        if let Some(old) = base.and_then(|b| b.ext.as_ref()) {
            for (q, b) in &old.stream_commits {
                let e = x.stream_commits.entry(q.clone()).or_insert(*b);
                *e = (*e).max(*b);
            }
        }
    }
    stamp_added_versions(base, &mut out);
    out.recompute_totals();
    out.validate()?;
    Ok(out)
}

/// Row provenance (spec/dataset.md §5.11): every shard of `next` that `base` lists keeps the
/// `added_version` `base` records for it (none for shards listed before versions recorded it);
/// every other shard is new in `next` and gets `next`'s version.
pub fn stamp_added_versions(base: Option<&Manifest>, next: &mut Manifest) {
    let version = next.manifest_version();
    let old: std::collections::HashMap<&str, Option<u64>> = base
        .map(|b| {
            b.shards
                .iter()
                .map(|s| (s.shard_path.as_str(), s.added_version))
                .collect()
        })
        .unwrap_or_default();
    for s in &mut next.shards {
        s.added_version = match old.get(s.shard_path.as_str()) {
            Some(v) => *v,
            None => Some(version),
        };
    }
}

fn merge_append(
    old: &Manifest,
    new: &Manifest,
    new_ext: &ManifestExt,
) -> Result<Manifest, DatasetError> {
    let mismatch = |problem: String| DatasetError::AppendMismatch { problem };
    let Some(old_ext) = &old.ext else {
        return Err(mismatch(
            "the dataset's manifest has only the published fields (written by another tool); \
             this connector appends only to datasets it wrote (overwrite it instead)"
                .to_string(),
        ));
    };
    if old_ext.mode != new_ext.mode
        || old_ext.batch_size != new_ext.batch_size
        || old_ext.tail_strategy != new_ext.tail_strategy
        || old_ext.kv_separator != new_ext.kv_separator
    {
        return Err(mismatch(format!(
            "the dataset is in {}, this write is in {}",
            describe(old_ext),
            describe(new_ext)
        )));
    }
    let mut schema = old.schema.clone();
    if schema.is_empty() {
        schema = new.schema.clone();
    } else if !new.schema.is_empty() {
        let old_names: BTreeSet<&str> = old.schema.names().collect();
        let new_names: BTreeSet<&str> = new.schema.names().collect();
        if old_names != new_names {
            return Err(mismatch(format!(
                "the dataset has columns {}, this write has {}",
                old_names.into_iter().collect::<Vec<_>>().join(", "),
                new_names.into_iter().collect::<Vec<_>>().join(", ")
            )));
        }
        for (name, t) in &mut schema.0 {
            let Some(n) = new.schema.get(name) else {
                continue;
            };
            if n.dtype != t.dtype {
                return Err(mismatch(format!(
                    "column '{name}' is stored as {}, this write has {}",
                    t.dtype, n.dtype
                )));
            }
            if t.ragged != n.ragged {
                return Err(mismatch(format!(
                    "column '{name}' is {} in the dataset, this write has it {}",
                    ragged_str(&t.ragged),
                    ragged_str(&n.ragged)
                )));
            }
            if t.shape != n.shape {
                if old_ext.mode == DatasetMode::Batch {
                    return Err(mismatch(format!(
                        "column '{name}' has shape {}, this write has {}",
                        shape_str(&t.shape),
                        shape_str(&n.shape)
                    )));
                }
                t.shape = None;
            }
        }
    }
    let mut shards = old.shards.clone();
    for s in &new.shards {
        if shards.iter().any(|o| o.shard_path == s.shard_path) {
            return Err(mismatch(format!(
                "shard {} is already in the dataset",
                s.shard_path
            )));
        }
        shards.push(s.clone());
    }
    shards.sort_by(|a, b| a.shard_path.as_bytes().cmp(b.shard_path.as_bytes()));
    Ok(Manifest {
        schema,
        shards,
        ext: Some(ManifestExt {
            dropped_samples: old_ext.dropped_samples + new_ext.dropped_samples,
            stream_commits: old_ext.stream_commits.clone(),
            ..new_ext.clone()
        }),
        ..new.clone()
    })
}

/// A shard of the base manifest replaced by a commit: by a rewritten copy, or by nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardReplacement {
    pub old: String,
    pub new: Option<ManifestShard>,
}

/// The shards `base` lists that `next` does not: what a committed overwrite (or a replacing
/// append) removes.
pub fn superseded_shards<'a>(base: &'a Manifest, next: &Manifest) -> Vec<&'a str> {
    let keep: BTreeSet<&str> = next.shards.iter().map(|s| s.shard_path.as_str()).collect();
    base.shards
        .iter()
        .map(|s| s.shard_path.as_str())
        .filter(|s| !keep.contains(s))
        .collect()
}

/// A query id as `stream_commits` keys it (Spark's are UUIDs).
fn valid_query_id(q: &str) -> bool {
    !q.is_empty()
        && q.len() <= 128
        && q.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// One micro-batch of a streaming query (spec/dataset.md §5.7).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamBatch {
    pub query_id: String,
    pub batch_id: u64,
}

/// Whether `base` (the latest committed manifest; `None`: there is none) already records
/// `batch`: its query committed this batch id or a later one. Such a batch is a replay and its
/// commit must change nothing.
pub fn stream_batch_committed(base: Option<&Manifest>, batch: &StreamBatch) -> bool {
    base.and_then(|m| m.ext.as_ref())
        .and_then(|x| x.stream_commits.get(&batch.query_id))
        .is_some_and(|last| *last >= batch.batch_id)
}

/// The manifest of a streaming micro-batch's commit: an append of `new` on top of `base`
/// ([`next_manifest`]) that also records `batch` as its query's last committed batch, in the
/// same manifest version, so the check ([`stream_batch_committed`]) and the shard listing are one
/// atomic commit. A batch `base` already records is refused ([`DatasetError::InvalidManifest`]
/// naming the query and ids): the caller checks first and drops the replay's shards.
pub fn next_stream_manifest(
    base: Option<&Manifest>,
    new: &Manifest,
    replacements: &[ShardReplacement],
    batch: &StreamBatch,
) -> Result<Manifest, DatasetError> {
    let stream_err = |problem: String| DatasetError::StreamBatch { problem };
    if !valid_query_id(&batch.query_id) {
        return Err(stream_err(format!(
            "query id {:?}: expected 1 to 128 characters of letters, digits, '-' and '_'",
            batch.query_id
        )));
    }
    if stream_batch_committed(base, batch) {
        return Err(stream_err(format!(
            "query {} already committed batch {} (the dataset records batch {}); a replayed \
             batch is not committed again",
            batch.query_id,
            batch.batch_id,
            base.and_then(|m| m.ext.as_ref())
                .and_then(|x| x.stream_commits.get(&batch.query_id))
                .copied()
                .unwrap_or_default()
        )));
    }
    let mut out = next_manifest(base, new, true, replacements)?;
    if let Some(x) = &mut out.ext {
        x.stream_commits
            .insert(batch.query_id.clone(), batch.batch_id);
        if base.is_some() {
            x.operation = Some(Operation::StreamBatch);
        }
    }
    out.validate()?;
    Ok(out)
}

/// Longest `commit_message` a commit records (bytes of UTF-8).
pub const MAX_COMMIT_MESSAGE_BYTES: usize = 64 * 1024;

/// Who made a commit and when (spec/dataset.md §5.8), set on the next manifest by
/// [`stamp_commit`] just before the version is created (again on each retry).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommitInfo {
    /// Milliseconds since the Unix epoch (UTC).
    pub committed_at_ms: u64,
    /// The write's `commit_message` option, verbatim.
    #[serde(default)]
    pub commit_message: Option<String>,
    /// The Spark application id of the committing driver.
    #[serde(default)]
    pub app_id: Option<String>,
}

/// Checks the `commit_message` option: at most [`MAX_COMMIT_MESSAGE_BYTES`].
pub fn check_commit_message(message: &str) -> Result<(), DatasetError> {
    if message.len() > MAX_COMMIT_MESSAGE_BYTES {
        return Err(invalid(format!(
            "option commit_message is {} bytes; at most {MAX_COMMIT_MESSAGE_BYTES} are allowed",
            message.len()
        )));
    }
    Ok(())
}

/// Records `info` in the next manifest `m` (this connector's): `committed_at_ms`,
/// `commit_message` and `app_id` (the last two cleared when `info` has none).
pub fn stamp_commit(m: &mut Manifest, info: &CommitInfo) -> Result<(), DatasetError> {
    if let Some(msg) = &info.commit_message {
        check_commit_message(msg)?;
    }
    let Some(x) = &mut m.ext else {
        return Err(invalid("only this connector's manifests record a commit"));
    };
    x.committed_at_ms = Some(info.committed_at_ms);
    x.commit_message = info.commit_message.clone();
    x.app_id = info.app_id.clone();
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Every optional field of a version survives a write and a read: a field the serialiser
    /// forgot would be lost at the next commit.
    #[test]
    fn optional_fields_round_trip() {
        let text = r#"{"format_version":"1.0","safetensors_version":"1.0","total_samples":2,
            "total_bytes":100,"shards":[{"shard_path":"part-00000-0000-0a1b2c3d-0000-4000-8000-000000000000.safetensors",
            "samples_count":2,"bytes":100,"partition":0,"padded_samples":0,"num_tensors":2,"crc32c":"0a1b2c3d"}],
            "schema":{"tokens":{"dtype":"I32","shape":null,"ragged":{"inner_shape":[],"element":"array"}}},
            "format":"safetensors-spark-dataset","created_by":"safetensors-spark 0.1.0","manifest_version":3,
            "layout":"batch","batch_size":2,"tail_strategy":"write","kv_separator":null,"padded_samples":0,
            "dropped_samples":0,"committed_at_ms":1764000000000,"operation":"vacuum","commit_message":"m",
            "app_id":"local-1","retention_seconds":604800,"vacuumed":{"files":1,"bytes":10}}"#;
        let m = parse_manifest(text).unwrap();
        let again = serde_json::to_string(&m).unwrap();
        assert_eq!(parse_manifest(&again).unwrap(), m);
        let x = m.ext.as_ref().unwrap();
        assert_eq!(x.operation, Some(Operation::Vacuum));
        assert_eq!(
            x.vacuumed,
            Some(Vacuumed {
                files: 1,
                bytes: 10
            })
        );
        assert_eq!(m.shards[0].crc32c.as_deref(), Some("0a1b2c3d"));
        for field in [
            "committed_at_ms",
            "operation",
            "commit_message",
            "app_id",
            "retention_seconds",
            "vacuumed",
            "crc32c",
            "ragged",
        ] {
            assert!(
                again.contains(&format!("\"{field}\"")),
                "{field} not written: {again}"
            );
        }
    }
}
