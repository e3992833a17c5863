//! Driver side of a Spark read: which files belong to the scan, its schema, and its partitions.
//!
//! The JVM lists paths, reads files' header bytes (prefix + JSON) and manifests, and asks this
//! module; everything it answers is serde JSON so the JNI layer is a pass-through:
//!
//! 1. [`describe`]: the resolved layout and the Spark schema (`StructType` JSON, parsed by
//!    `DataType.fromJson` on the JVM) of the scan; plus the hidden metadata columns (the
//!    per-sample layout's `_file` and `_metadata`; per file, `_<name>` for each of its own
//!    columns a tensor of that name displaced).
//! 2. [`plan`]: the input partitions for a set of required columns and pushed key/dtype/file
//!    predicates. Each [`PartitionSpec`] is shipped to an executor as JSON and run by
//!    [`super::task::ReadTask`].
//!
//! Both may answer [`Answer::NeedHeaders`]: the JVM then reads those files' headers and asks
//! again with them added (a dataset with a consistent manifest needs no header for its schema
//! or its per-sample plan; the file layout and manifest-less files need headers, and so does
//! the per-tensor plan unless an index serves it).
//!
//! Index lookups: a per-tensor [`plan`] with a pushed `key` predicate may answer
//! [`Answer::NeedIndex`] for dataset directories with a consistent manifest and an
//! `_tensor_index.parquet` ([`ManifestInput::has_index`]). The JVM then reads each index and
//! passes its bytes to [`index_summary`] (JNI `indexEntries`), which keeps the rows the
//! predicates match and counts every file's rows; the summary comes back in
//! [`ManifestInput::index`]. When the index covers exactly the manifest's shards (the same
//! file names, each with the manifest's tensor count), that directory's units are planned from
//! the matching rows without any header; otherwise (or when the index could not be read) its
//! files' headers are asked for as usual. Tasks validate every header and the planned tensors,
//! so a stale index fails the task ("changed since the scan was planned").
//!
//! Files and manifests:
//! * A file in a directory that has a manifest ([`ManifestInput::dir`] equals the file's parent
//!   URI) is part of the scan only if the manifest lists it (`shards[].file`); others are
//!   left out (reported in [`ScanDescription::excluded`]). A file in a subdirectory of such a
//!   directory (at any depth) is left out too: a dataset is exactly its manifest's shards.
//! * A manifest is *consistent* when every listed shard was listed by the JVM with the listed
//!   `bytes` as its length. An inconsistent manifest is not trusted: its files need headers,
//!   and only the files it lists that exist are read.
//! * A manifest with an unknown `format_version` is an error naming the manifest.
//!
//! Schemas: each Spark field's `nullable` is the nullability of the Arrow field the tasks
//! produce (per-sample tensor columns are always nullable: a file may lack the tensor). Column
//! types are the whole scan's (predicates never change them): per tensor, the `decoded` type
//! comes from a consistent manifest's column dtypes and from the headers of files outside one.
//! [`plan`] needs those headers too, plus, per tensor and per file, the headers of the files it
//! plans (those a `file` predicate keeps) unless an index serves them.
//!
//! Errors name the file (and tensor/column) and the rule; with `ignore_corrupt` a file whose
//! header is invalid is left out (reported in `excluded` with the reason) instead.

use super::arrow_types::metadata_type;
use super::decode::{common_element, spark_element};
use super::error::{ReadError, ReadErrorKind};
use super::forensic_columns;
use super::rows::{
    batch_samples, ragged_columns, sample_target_type, FileColumn, SampleTarget, TensorColumn,
    TensorField, MODE_KEY,
};
use arrow_schema::{DataType, Field, Fields};
use parquet::file::reader::ChunkReader;
use safetensors_spark_dataset::index::{
    lookup_sparse, read_index_from, IndexRow, KeyFilter, SparseFile, SparseLookup,
};
use safetensors_spark_dataset::manifest::{ragged_offsets_name, RaggedElement};
use safetensors_spark_dataset::names::{INDEX_DIR_NAME, MANIFEST_FILE_NAME};
use safetensors_spark_dataset::{parse_manifest, DatasetMode, Manifest};
use safetensors_spark_format::dtype::Dtype;
use safetensors_spark_format::header::{self, Header, PREFIX_LEN};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

/// Row layout requested by the `layout` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayoutOption {
    /// `sample` when every file is a batch-mode shard (manifest `layout: batch`, or
    /// `__metadata__` `safetensors_spark.layout` = `batch`) and there is at least one file or
    /// manifest; `tensor` otherwise.
    Auto,
    Sample,
    Tensor,
    File,
}

/// A resolved layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    Sample,
    Tensor,
    File,
}

/// One listed file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInput {
    /// URI as the JVM lists it (`file:/…`, `hdfs://…`); rows' `file` column carries it.
    pub file: String,
    /// Length from the file system listing.
    pub length: u64,
    /// The header JSON text (all N bytes after the 8-byte prefix, trailing padding included,
    /// as [`validated_header_text`] returns it), when the JVM has read it.
    #[serde(default)]
    pub header: Option<String>,
    /// Set instead of `header` when the prefix or header could not be read or is invalid
    /// before JSON parsing (the JVM calls [`safetensors_spark_format::header::check_prefix`] through JNI): the
    /// message. With `ignore_corrupt` the file is excluded, otherwise this is the scan's error.
    #[serde(default)]
    pub header_error: Option<String>,
}

/// A `dataset_manifest.json` found in a listed directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestInput {
    /// The directory's URI, without trailing slash (files in it have URI `dir + "/" + name`).
    pub dir: String,
    /// The manifest's text.
    pub text: String,
    /// The directory also holds `_tensor_index.parquet` (seen while listing).
    #[serde(default)]
    pub has_index: bool,
    /// The index's summary for this scan's predicates ([`index_summary`]), given once the
    /// planner asked for it ([`Answer::NeedIndex`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<IndexSummary>,
}

/// What a dataset's `_tensor_index.parquet` says for one scan ([`index_summary`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexSummary {
    /// Rows per `file_name`, over the whole index (matching the predicates or not).
    #[serde(default)]
    pub files: BTreeMap<String, u64>,
    /// The rows the pushed predicates keep, in index order.
    #[serde(default)]
    pub rows: Vec<IndexEntry>,
    /// Set (by the JVM) instead of the rest when the index could not be read or is invalid:
    /// the planner then uses the directory's headers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One row of a `_tensor_index.parquet` (spec/dataset.md §6), as far as planning needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexEntry {
    pub file_name: String,
    pub tensor_key: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// Absolute byte offsets `[data_start, data_end)` in the file.
    pub data_start: u64,
    pub data_end: u64,
}

/// The one mapping of an index row to what planning needs of it (the KV key and column are
/// left out: planning finds tensors by name).
impl From<IndexRow> for IndexEntry {
    fn from(r: IndexRow) -> Self {
        IndexEntry {
            file_name: r.file_name,
            tensor_key: r.tensor_key,
            dtype: r.dtype,
            shape: r.shape,
            data_start: r.data_start,
            data_end: r.data_end,
        }
    }
}

/// What the JVM found and read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanInput {
    pub files: Vec<FileInput>,
    #[serde(default)]
    pub manifests: Vec<ManifestInput>,
    #[serde(default)]
    pub ignore_corrupt: bool,
    /// A shard a manifest lists that was not listed: excluded (with the reason) instead of the
    /// scan's error.
    #[serde(default)]
    pub ignore_missing: bool,
    /// The per-file layout's limit on tensors per file and on tensor columns over the scan
    /// (read option `file_layout_max_tensors`); `None`: [`FILE_LAYOUT_MAX_TENSORS`].
    #[serde(default)]
    pub file_layout_max_tensors: Option<u64>,
}

/// Default of the per-file layout's limit on tensors (one Spark column each) per file and over
/// the scan (`spec/reading.md` §2.3): beyond it Spark's planning of the schema alone takes the
/// driver's memory (200,000 columns: out of memory in a 1 GiB driver).
pub const FILE_LAYOUT_MAX_TENSORS: u64 = 10_000;

impl ScanInput {
    fn file_layout_max_tensors(&self) -> u64 {
        self.file_layout_max_tensors
            .unwrap_or(FILE_LAYOUT_MAX_TENSORS)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeRequest {
    pub layout: LayoutOption,
    #[serde(flatten)]
    pub input: ScanInput,
}

/// Result of [`describe`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScanDescription {
    pub layout: Layout,
    /// Spark `StructType` JSON of the scan's columns (see `spec/reading.md` for each layout).
    pub schema: serde_json::Value,
    /// Spark `StructType` JSON of the hidden metadata columns: `_file`, `_metadata` of the
    /// per-sample layout; per file, `_<name>` for each of its own columns a tensor's name
    /// displaced ([`OutputColumn::is_hidden`]); otherwise an empty struct.
    pub metadata_columns: serde_json::Value,
    /// Files left out, with why (not in their directory's manifest, or corrupt under
    /// `ignore_corrupt`).
    pub excluded: Vec<Excluded>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Excluded {
    pub file: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[must_use]
pub enum Answer<T> {
    Ready(T),
    /// Read these files' headers (URIs as listed) and ask again.
    NeedHeaders(Vec<String>),
    /// Read the `_tensor_index.parquet` of these dataset directories ([`ManifestInput::dir`]),
    /// summarise each with [`index_summary`] and ask again with [`ManifestInput::index`] set.
    NeedIndex(Vec<String>),
}

impl<T> Answer<T> {
    /// The value when ready, else the same question as an answer of another type.
    fn ready<U>(self) -> Result<T, Answer<U>> {
        match self {
            Answer::Ready(t) => Ok(t),
            Answer::NeedHeaders(files) => Err(Answer::NeedHeaders(files)),
            Answer::NeedIndex(dirs) => Err(Answer::NeedIndex(dirs)),
        }
    }
}

/// A required output column as Spark's pruning gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequiredColumn {
    pub name: String,
    /// For a Tensor Struct column of the per-file layout pruned to some of its fields: those
    /// fields (`data`, `shape`, `dtype`), in the order Spark wants them. `None`: all fields
    /// (or not a struct column).
    #[serde(default)]
    pub fields: Option<Vec<String>>,
}

/// A pushed predicate on a header column, all of which must hold (AND).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Predicate {
    /// `key` and `dtype` (per-tensor layout) or `file` (every layout, including `_file`).
    pub column: String,
    #[serde(flatten)]
    pub test: PredicateTest,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", content = "values", rename_all = "lowercase")]
pub enum PredicateTest {
    /// Equal to one of the values (`=` and `IN`).
    In(Vec<String>),
    /// Starts with one of the prefixes.
    Prefix(Vec<String>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanRequest {
    /// As resolved by [`describe`].
    pub layout: Layout,
    #[serde(flatten)]
    pub input: ScanInput,
    /// The columns to produce, in order (may be empty: `count()`). Names may include the
    /// per-sample layout's `_file` / `_metadata`.
    pub required: Vec<RequiredColumn>,
    #[serde(default)]
    pub predicates: Vec<Predicate>,
    /// Most bytes of data per partition (`spark.sql.files.maxPartitionBytes`).
    pub max_partition_bytes: u64,
    /// Cost of opening a file, in bytes (`spark.sql.files.openCostInBytes`).
    pub open_cost_bytes: u64,
    /// Partitions a small scan should still spread over (`spark.sql.files.minPartitionNum`, by
    /// default the session's leaf-node parallelism): the split size is Spark's
    /// `FilePartition.maxSplitBytes`, see [`max_split_bytes`]. 0 (absent) counts as 1: no
    /// spreading.
    #[serde(default)]
    pub min_partitions: u64,
    /// Upper bounds of one Arrow batch: rows and data bytes.
    pub batch_rows: u64,
    pub batch_bytes: u64,
    /// Read option `verify_checksums`: every shard a task reads whose manifest entry has a
    /// `crc32c` is checked whole against it ([`PartitionSpec::checksums`]).
    #[serde(default)]
    pub verify_checksums: bool,
}

/// What a dataset's manifest records of a shard file, checked whole by the task that reads it
/// (read option `verify_checksums`, spec/reading.md §5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardChecksum {
    /// `shards[].crc32c`: 8 hex digits.
    pub crc32c: String,
    /// `shards[].bytes`.
    pub bytes: u64,
}

/// The work of one Spark input partition, run by [`super::task::ReadTask`]. Opaque to the
/// JVM except `units[].file` / `units[].length` (to open the file) and `bytes` (an estimate).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionSpec {
    pub layout: Layout,
    /// The output columns with everything needed to build them (target types, struct fields).
    pub columns: Vec<OutputColumn>,
    pub units: Vec<Unit>,
    /// Data bytes this partition will read (for balancing and tests).
    pub bytes: u64,
    pub batch_rows: u64,
    pub batch_bytes: u64,
    /// The scan's `ignore_corrupt`: a unit whose file turns out corrupt when opened yields no
    /// rows instead of failing the task (see [`super::task::ReadTask::skipped`]).
    #[serde(default)]
    pub ignore_corrupt: bool,
    /// With `verify_checksums`: the units' files (URI) whose manifest entry records a CRC-32C,
    /// with it; each is read whole and checked before its rows are read.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub checksums: BTreeMap<String, ShardChecksum>,
}

/// One output column of a partition: its Spark name and how to fill it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputColumn {
    pub name: String,
    /// Layout-specific recipe (tensor name and target element type for per-sample columns;
    /// `file`/`key`/…/`decoded` for the per-tensor layout; key + fields for per-file).
    pub source: ColumnSource,
}

/// How to fill one output column (JSON: an object with a `kind` tag).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ColumnSource {
    /// The file's URI (`_file` of the per-sample layout, `file` of the others): Utf8,
    /// non-null.
    File,
    /// The file's `__metadata__` (`_metadata` / `metadata`): `Map<Utf8, Utf8>`, nullable.
    Metadata,
    /// `flags` (per tensor and per file): the file's forensic flags, cut to `fields`.
    Flags { fields: Vec<String> },
    /// `model_info` (per tensor and per file): the file's model information, cut to `fields`.
    ModelInfo { fields: Vec<String> },
    /// `sha256` (per tensor: of the tensor's data bytes; per file: of the whole file), computed
    /// only when selected: the only forensic column that reads data bytes.
    Sha256,
    /// Per tensor: `key`.
    Key,
    /// Per tensor: `dtype`.
    Dtype,
    /// Per tensor: `shape`.
    Shape,
    /// Per tensor: `byte_size`.
    ByteSize,
    /// Per tensor: `data`.
    Data,
    /// Per tensor: `decoded`, widened to `element`.
    Decoded { element: ElementType },
    /// Per sample: tensor `tensor`'s samples (rank `rank`), decoded and widened to `element`
    /// nested `rank` times in arrays, or each sample's raw bytes when `element` is `binary`.
    /// Nullable: null rows where the file lacks the tensor. `ragged`: a ragged column
    /// (spec/dataset.md §2.1): each row is its slice of the values tensor `tensor`, bounded by
    /// `<tensor>.offsets` (`rank` counts the row's own level; `string`: UTF-8 text).
    Sample {
        tensor: String,
        element: ElementType,
        rank: usize,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        ragged: bool,
    },
    /// Per file: the Tensor Struct of `key` with `fields` (in that order); null where the file
    /// lacks the tensor.
    Tensor {
        key: String,
        fields: Vec<TensorField>,
    },
}

/// A column's element type, by its Spark name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ElementType {
    Boolean,
    Byte,
    Short,
    Integer,
    Long,
    Float,
    Double,
    /// Raw bytes per sample (dtypes without a Spark element type; ragged `binary` columns).
    Binary,
    /// UTF-8 text per sample (ragged `string` columns).
    String,
}

impl ElementType {
    /// The Arrow type.
    pub fn arrow(self) -> DataType {
        match self {
            ElementType::Boolean => DataType::Boolean,
            ElementType::Byte => DataType::Int8,
            ElementType::Short => DataType::Int16,
            ElementType::Integer => DataType::Int32,
            ElementType::Long => DataType::Int64,
            ElementType::Float => DataType::Float32,
            ElementType::Double => DataType::Float64,
            ElementType::Binary => DataType::Binary,
            ElementType::String => DataType::Utf8,
        }
    }

    /// The element type of an Arrow type, if it is one.
    pub fn from_arrow(t: &DataType) -> Option<ElementType> {
        Some(match t {
            DataType::Boolean => ElementType::Boolean,
            DataType::Int8 => ElementType::Byte,
            DataType::Int16 => ElementType::Short,
            DataType::Int32 => ElementType::Integer,
            DataType::Int64 => ElementType::Long,
            DataType::Float32 => ElementType::Float,
            DataType::Float64 => ElementType::Double,
            DataType::Binary => ElementType::Binary,
            DataType::Utf8 => ElementType::String,
            _ => return None,
        })
    }

    fn target(self) -> SampleTarget {
        match self {
            ElementType::Binary => SampleTarget::Bytes,
            ElementType::String => SampleTarget::Text,
            e => SampleTarget::Values(e.arrow()),
        }
    }
}

impl OutputColumn {
    /// A hidden metadata column (selected by name only): a layout's own column named `_…` —
    /// `_file` and `_metadata` per sample, and per file the columns a tensor's name displaced.
    pub fn is_hidden(&self) -> bool {
        !matches!(
            self.source,
            ColumnSource::Sample { .. } | ColumnSource::Tensor { .. }
        ) && self.name.starts_with('_')
    }

    /// The Arrow field of this column in every batch (named [`OutputColumn::name`]).
    pub fn arrow_field(&self) -> Field {
        let named = |f: Field| f.with_name(self.name.clone());
        match &self.source {
            ColumnSource::File => Field::new(self.name.clone(), DataType::Utf8, false),
            ColumnSource::Metadata => Field::new(self.name.clone(), metadata_type(), true),
            ColumnSource::Sample { element, rank, .. } => Field::new(
                self.name.clone(),
                sample_target_type(&element.target(), *rank),
                true,
            ),
            ColumnSource::Tensor { key, fields } => named(
                FileColumn::Tensor {
                    key,
                    fields: fields.as_slice(),
                }
                .field(),
            ),
            other => match other.tensor_column() {
                Some(c) => named(c.field()),
                None => Field::new(self.name.clone(), DataType::Null, true),
            },
        }
    }
}

impl ColumnSource {
    /// The per-tensor layout column this source builds (`None` for per-sample/per-file ones).
    pub fn tensor_column(&self) -> Option<TensorColumn> {
        Some(match self {
            ColumnSource::File => TensorColumn::File,
            ColumnSource::Metadata => TensorColumn::Metadata,
            ColumnSource::Key => TensorColumn::Key,
            ColumnSource::Dtype => TensorColumn::Dtype,
            ColumnSource::Shape => TensorColumn::Shape,
            ColumnSource::ByteSize => TensorColumn::ByteSize,
            ColumnSource::Data => TensorColumn::Data,
            ColumnSource::Decoded { element } => TensorColumn::Decoded(element.arrow()),
            ColumnSource::Flags { fields } => TensorColumn::Flags(fields.clone()),
            ColumnSource::ModelInfo { fields } => TensorColumn::ModelInfo(fields.clone()),
            ColumnSource::Sha256 => TensorColumn::Sha256,
            ColumnSource::Sample { .. } | ColumnSource::Tensor { .. } => return None,
        })
    }

    /// The per-sample target of a [`ColumnSource::Sample`].
    pub fn sample_target(&self) -> Option<(&str, SampleTarget, usize)> {
        match self {
            ColumnSource::Sample {
                tensor,
                element,
                rank,
                ..
            } => Some((tensor, element.target(), *rank)),
            _ => None,
        }
    }

    /// A per-sample column read from a ragged column's values and offsets.
    pub fn is_ragged(&self) -> bool {
        matches!(self, ColumnSource::Sample { ragged: true, .. })
    }
}

/// Part of one file a partition reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unit {
    pub file: String,
    pub length: u64,
    /// Per sample: the sample rows `[start, end)` of the shard. Per tensor: the tensors (by
    /// name, in header order) whose rows to produce. Per file: the whole file.
    pub part: UnitPart,
    /// Data bytes this unit reads.
    pub bytes: u64,
}

/// What the plan assumed about one tensor of a unit's file; the task checks it at open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorAssumption {
    pub name: String,
    pub dtype: Dtype,
    /// The whole tensor's shape (per sample: leading dimension = samples + padded samples).
    /// A ragged column's: `[rows, …inner shape]` (its values tensor has the inner shape after
    /// a first dimension of any size, its offsets tensor `[rows + 1]`).
    pub shape: Vec<u64>,
    /// Per sample: the column is ragged (spec/dataset.md §2.1), its rows read back as this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ragged: Option<RaggedElement>,
}

/// The part of a file a unit reads (JSON: an object with a `kind` tag).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum UnitPart {
    /// Sample rows `[start, end)` of a shard of `samples` real and `padded_samples` padding
    /// rows. `tensors`: the required per-sample tensors the file has; a required tensor not
    /// listed must be absent (null rows).
    Sample {
        start: u64,
        end: u64,
        samples: u64,
        padded_samples: u64,
        tensors: Vec<TensorAssumption>,
    },
    /// One row per listed tensor, in this order (header order).
    Tensors { tensors: Vec<TensorAssumption> },
    /// The file's one row. `tensors`: the required Tensor Struct columns the file has; a
    /// required key not listed must be absent (null).
    File { tensors: Vec<TensorAssumption> },
}

// ---------------------------------------------------------------------------------------------
// Catalog: which files belong to the scan and what is known about them
// ---------------------------------------------------------------------------------------------

struct ParsedManifest<'a> {
    dir: String,
    manifest: Manifest,
    /// Every listed shard was listed by the JVM with the listed length.
    consistent: bool,
    input: &'a ManifestInput,
    /// `shards[].file` → position in `shards`.
    shard_at: HashMap<String, usize>,
}

struct Entry<'a> {
    input: &'a FileInput,
    /// The consistent manifest listing this file and the file's index in its `shards`.
    shard: Option<(usize, usize)>,
    header: Option<Header>,
}

struct Catalog<'a> {
    manifests: Vec<ParsedManifest<'a>>,
    /// Included files, sorted by URI.
    files: Vec<Entry<'a>>,
    excluded: Vec<Excluded>,
    /// [`ScanInput::file_layout_max_tensors`].
    file_layout_max_tensors: u64,
}

fn split_uri(uri: &str) -> (&str, &str) {
    uri.rsplit_once('/').unwrap_or(("", uri))
}

/// `per_file`: the scan's layout is `file`, whose limit on tensors per file
/// ([`ScanInput::file_layout_max_tensors`]) makes a file beyond it an error of that file.
fn catalog(input: &ScanInput, per_file: bool) -> Result<Catalog<'_>, ReadError> {
    let mut manifests = Vec::with_capacity(input.manifests.len());
    for m in &input.manifests {
        let name = format!("{}/{MANIFEST_FILE_NAME}", m.dir);
        let manifest = parse_manifest(&m.text)
            .map_err(|e| ReadErrorKind::Manifest(e.to_string()).in_file(&name))?;
        let shard_at = manifest
            .shards
            .iter()
            .enumerate()
            .map(|(i, s)| (s.shard_path.clone(), i))
            .collect();
        manifests.push(ParsedManifest {
            dir: m.dir.clone(),
            manifest,
            consistent: false,
            input: m,
            shard_at,
        });
    }
    let lengths: HashMap<&str, u64> = input
        .files
        .iter()
        .map(|f| (f.file.as_str(), f.length))
        .collect();
    let mut excluded = Vec::new();
    for m in &manifests {
        for s in &m.manifest.shards {
            let uri = format!("{}/{}", m.dir, s.shard_path);
            if !lengths.contains_key(uri.as_str()) {
                let e = ReadErrorKind::MissingShard {
                    manifest: format!("{}/{MANIFEST_FILE_NAME}", m.dir),
                }
                .in_file(&uri);
                if !input.ignore_missing {
                    return Err(e);
                }
                excluded.push(Excluded {
                    file: uri,
                    reason: e.to_string(),
                });
            }
        }
    }
    for m in &mut manifests {
        m.consistent =
            m.manifest.shards.iter().all(|s| {
                lengths.get(format!("{}/{}", m.dir, s.shard_path).as_str()) == Some(&s.bytes)
            });
    }
    let mut sorted: Vec<&FileInput> = input.files.iter().collect();
    sorted.sort_by(|a, b| a.file.cmp(&b.file));
    sorted.dedup_by(|a, b| a.file == b.file);
    let mut files = Vec::with_capacity(sorted.len());
    for f in sorted {
        let (dir, name) = split_uri(&f.file);
        let mut shard = None;
        // A dataset is its manifest's shards: a file deeper under a manifest's directory (a
        // stray copy in a subdirectory, a nested dataset, a path through a link back into the
        // directory) is never one of them, whoever listed it.
        if let Some(m) = manifests.iter().find(|m| {
            dir.strip_prefix(m.dir.as_str())
                .is_some_and(|rest| rest.starts_with('/'))
        }) {
            excluded.push(Excluded {
                file: f.file.clone(),
                reason: format!(
                    "in a subdirectory of the dataset {}, whose {MANIFEST_FILE_NAME} lists its \
                     shards (a dataset is its manifest's shards; shard paths have no directory)",
                    m.dir
                ),
            });
            continue;
        }
        if let Some((mi, m)) = manifests.iter().enumerate().find(|(_, m)| m.dir == dir) {
            match m.shard_at.get(name).copied() {
                // A published-only manifest decides membership; its shards' layout and
                // padding come from their headers.
                Some(si) => shard = (m.consistent && m.manifest.ext.is_some()).then_some((mi, si)),
                None => {
                    excluded.push(Excluded {
                        file: f.file.clone(),
                        reason: format!("not listed in {dir}/{MANIFEST_FILE_NAME}"),
                    });
                    continue;
                }
            }
        }
        let header = match (&f.header_error, &f.header) {
            (Some(msg), _) => Err(ReadErrorKind::Corrupt(msg.clone()).in_file(&f.file)),
            (None, Some(text)) => header::parse_header(text.as_bytes(), f.length)
                .map_err(|e| ReadErrorKind::Format(e).in_file(&f.file))
                .and_then(|h| {
                    let (count, limit) = (h.tensors.len() as u64, input.file_layout_max_tensors());
                    if per_file && count > limit {
                        Err(ReadErrorKind::TooManyColumns {
                            what: "",
                            count,
                            limit,
                        }
                        .in_file(&f.file))
                    } else {
                        Ok(Some(h))
                    }
                }),
            (None, None) => Ok(None),
        };
        match header {
            Ok(header) => files.push(Entry {
                input: f,
                shard,
                header,
            }),
            Err(e) if input.ignore_corrupt => excluded.push(Excluded {
                file: f.file.clone(),
                reason: e.to_string(),
            }),
            Err(e) => return Err(e),
        }
    }
    Ok(Catalog {
        manifests,
        files,
        excluded,
        file_layout_max_tensors: input.file_layout_max_tensors(),
    })
}

impl Catalog<'_> {
    fn manifest_of(&self, e: &Entry) -> Option<(&Manifest, usize)> {
        e.shard
            .and_then(|(mi, si)| self.manifests.get(mi).map(|m| (&m.manifest, si)))
    }

    fn resolve(&self, option: LayoutOption) -> Answer<Layout> {
        match option {
            LayoutOption::Sample => return Answer::Ready(Layout::Sample),
            LayoutOption::Tensor => return Answer::Ready(Layout::Tensor),
            LayoutOption::File => return Answer::Ready(Layout::File),
            LayoutOption::Auto => {}
        }
        if self.files.is_empty() && self.manifests.is_empty()
            || self
                .manifests
                .iter()
                // a published-only manifest (no layout) leaves it to the shards' headers
                .any(|m| m.manifest.mode() == Some(DatasetMode::Kv))
        {
            return Answer::Ready(Layout::Tensor);
        }
        let mut need = Vec::new();
        for e in &self.files {
            if self.manifest_of(e).is_some() {
                continue; // a consistent batch manifest lists it
            }
            match &e.header {
                None => need.push(e.input.file.clone()),
                Some(h) => {
                    let mode = h.metadata.as_ref().and_then(|m| m.get(MODE_KEY));
                    if mode.map(String::as_str) != Some("batch") {
                        return Answer::Ready(Layout::Tensor);
                    }
                }
            }
        }
        if need.is_empty() {
            Answer::Ready(Layout::Sample)
        } else {
            Answer::NeedHeaders(need)
        }
    }

    /// Files whose header is missing.
    fn missing_headers<'e>(&self, files: impl Iterator<Item = &'e Entry<'e>>) -> Vec<String>
    where
        Self: 'e,
    {
        files
            .filter(|e| e.header.is_none())
            .map(|e| e.input.file.clone())
            .collect()
    }

    fn headers(&self) -> Result<Vec<(&Entry<'_>, &Header)>, Vec<String>> {
        let need = self.missing_headers(self.files.iter());
        if !need.is_empty() {
            return Err(need);
        }
        Ok(self
            .files
            .iter()
            .filter_map(|e| e.header.as_ref().map(|h| (e, h)))
            .collect())
    }
}

// ---------------------------------------------------------------------------------------------
// Schemas
// ---------------------------------------------------------------------------------------------

/// What the per-sample layout needs of one shard.
struct SampleFile<'a> {
    entry: &'a Entry<'a>,
    samples: u64,
    padded: u64,
    /// In the file's column order (manifest `tensors` order, else header order); a ragged
    /// column once (its offsets tensor is no column).
    tensors: Vec<TensorAssumption>,
    /// Estimated data bytes of one row of each ragged column (values and offsets).
    ragged_row_bytes: HashMap<String, u64>,
}

impl SampleFile<'_> {
    fn tensor(&self, name: &str) -> Option<&TensorAssumption> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

struct SampleColumn {
    name: String,
    element: ElementType,
    rank: usize,
    ragged: bool,
}

enum ScanSchema<'a> {
    Sample {
        columns: Vec<SampleColumn>,
        files: Vec<SampleFile<'a>>,
    },
    /// The files and tensors come from [`tensor_files`] (planning only).
    Tensor { decoded: Option<DataType> },
    File {
        keys: Vec<String>,
        files: Vec<(&'a Entry<'a>, &'a Header)>,
    },
}

fn describe_tensor(t: &TensorAssumption) -> String {
    match t.ragged {
        None => format!("{} {:?}", t.dtype, t.shape),
        Some(e) => format!(
            "a ragged {} column of {} with inner shape {:?}",
            ragged_element_name(e),
            t.dtype,
            t.shape.get(1..).unwrap_or_default()
        ),
    }
}

fn ragged_element_name(e: RaggedElement) -> &'static str {
    match e {
        RaggedElement::Array => "array",
        RaggedElement::Binary => "binary",
        RaggedElement::String => "string",
    }
}

/// The error names the later file (in URI order) and quotes the earlier one.
fn conflict(
    column: &str,
    x: (&str, &TensorAssumption),
    y: (&str, &TensorAssumption),
    problem: &'static str,
) -> ReadError {
    let ((file_a, a), (file_b, b)) = if x.0 <= y.0 { (x, y) } else { (y, x) };
    ReadErrorKind::ColumnConflict(format!(
        "column `{column}`: file `{file_a}` has {} but this file has {}; {problem}",
        describe_tensor(a),
        describe_tensor(b)
    ))
    .at(file_b, column)
}

fn sample_file<'a>(
    cat: &'a Catalog<'a>,
    e: &'a Entry<'a>,
) -> Result<Option<SampleFile<'a>>, ReadError> {
    let uri = e.input.file.as_str();
    if let Some((m, si)) = cat.manifest_of(e) {
        if m.mode() == Some(DatasetMode::Kv) {
            return Err(ReadErrorKind::ReservedMetadata {
                key: MODE_KEY,
                value: "kv".into(),
                problem: "a KV shard has no sample rows; read it per tensor",
            }
            .in_file(uri));
        }
        let Some(shard) = m.shards.get(si) else {
            return Ok(None);
        };
        let rows = shard.samples_count.saturating_add(shard.padded());
        let mut tensors = Vec::with_capacity(m.schema.len());
        let mut ragged_row_bytes = HashMap::new();
        for (name, t) in &m.schema.0 {
            let mut shape = vec![rows];
            match &t.ragged {
                Some(r) => {
                    shape.extend(&r.inner_shape);
                    // the values' size is in the shard's header only: the shard's bytes per row
                    // bound it
                    ragged_row_bytes.insert(
                        name.clone(),
                        shard.bytes.checked_div(rows).unwrap_or(0).saturating_add(8),
                    );
                }
                None => shape.extend(m.sample_shape(name).into_iter().flatten()),
            }
            tensors.push(TensorAssumption {
                name: name.clone(),
                dtype: t.dtype,
                shape,
                ragged: t.ragged.as_ref().map(|r| r.element),
            });
        }
        return Ok(Some(SampleFile {
            entry: e,
            samples: shard.samples_count,
            padded: shard.padded(),
            tensors,
            ragged_row_bytes,
        }));
    }
    let Some(h) = &e.header else {
        return Ok(None);
    };
    let (samples, padded) = batch_samples(uri, h)?;
    let ragged = ragged_columns(uri, h)?;
    let offsets: HashSet<String> = ragged.iter().map(|c| ragged_offsets_name(c)).collect();
    let rows = samples.saturating_add(padded);
    let mut ragged_row_bytes = HashMap::new();
    let tensors = h
        .tensors
        .iter()
        .filter(|t| !offsets.contains(&t.name))
        .map(|t| {
            if !ragged.contains(&t.name) {
                return assumption(t);
            }
            ragged_row_bytes.insert(
                t.name.clone(),
                (t.byte_len() / rows.max(1)).saturating_add(8),
            );
            let mut shape = vec![rows];
            shape.extend(t.shape.iter().skip(1));
            // A shard alone does not say what its rows were written from: bytes (U8 rows of
            // scalars) read back as binary, the rest as arrays.
            let element = if t.dtype == Dtype::U8 && t.shape.len() == 1 {
                RaggedElement::Binary
            } else {
                RaggedElement::Array
            };
            TensorAssumption {
                name: t.name.clone(),
                dtype: t.dtype,
                shape,
                ragged: Some(element),
            }
        })
        .collect();
    Ok(Some(SampleFile {
        entry: e,
        samples,
        padded,
        tensors,
        ragged_row_bytes,
    }))
}

fn sample_columns(files: &[SampleFile]) -> Result<Vec<SampleColumn>, ReadError> {
    let mut order: Vec<&str> = Vec::new();
    let mut seen: HashMap<&str, Vec<(&str, &TensorAssumption)>> = HashMap::new();
    for f in files {
        for t in &f.tensors {
            let list = seen.entry(t.name.as_str()).or_default();
            if list.is_empty() {
                order.push(&t.name);
            }
            list.push((f.entry.input.file.as_str(), t));
        }
    }
    let mut columns = Vec::with_capacity(order.len());
    for name in order {
        let all = seen.get(name).map(Vec::as_slice).unwrap_or_default();
        let Some(&first) = all.first() else { continue };
        if name == "_file" || name == "_metadata" {
            return Err(ReadErrorKind::Invalid(format!(
                "tensor `{name}` has the name of a hidden metadata column"
            ))
            .at(first.0, name));
        }
        let rank = first.1.shape.len().saturating_sub(1);
        if let Some(&other) = all
            .iter()
            .find(|(_, t)| t.ragged.is_some() != first.1.ragged.is_some())
        {
            return Err(conflict(
                name,
                first,
                other,
                "a ragged column cannot share a column with a fixed-shape one",
            ));
        }
        if let Some(&other) = all
            .iter()
            .find(|(_, t)| t.shape.len() != first.1.shape.len())
        {
            return Err(conflict(name, first, other, "the samples' ranks differ"));
        }
        let ragged = first.1.ragged;
        if let Some(&other) = all.iter().find(|(_, t)| t.ragged != ragged) {
            return Err(conflict(
                name,
                first,
                other,
                "the rows are read back as different Spark types",
            ));
        }
        if let Some(e @ (RaggedElement::Binary | RaggedElement::String)) = ragged {
            if let Some(&other) = all
                .iter()
                .find(|(_, t)| t.dtype != Dtype::U8 || t.shape.len() != 1)
            {
                return Err(conflict(
                    name,
                    first,
                    other,
                    "a ragged binary or string column holds U8 bytes (inner shape [])",
                ));
            }
            columns.push(SampleColumn {
                name: name.to_owned(),
                element: if e == RaggedElement::String {
                    ElementType::String
                } else {
                    ElementType::Binary
                },
                rank: 0,
                ragged: true,
            });
            continue;
        }
        let bytes_only: Vec<_> = all
            .iter()
            .filter(|(_, t)| spark_element(t.dtype).is_none())
            .collect();
        let element = if let Some(&&b) = bytes_only.first() {
            if let Some(&d) = all.iter().find(|(_, t)| spark_element(t.dtype).is_some()) {
                return Err(conflict(
                    name,
                    d,
                    b,
                    "a dtype without a Spark type (read as bytes) cannot share a column with decodable dtypes",
                ));
            }
            if let Some(&&o) = bytes_only.iter().find(|(_, t)| t.dtype != b.1.dtype) {
                return Err(conflict(
                    name,
                    b,
                    o,
                    "different dtypes without a Spark type cannot share a column",
                ));
            }
            for (file, t) in all {
                let elements = t
                    .shape
                    .iter()
                    .skip(1)
                    .try_fold(1u64, |a, &d| a.checked_mul(d));
                if elements.and_then(|e| t.dtype.checked_byte_len(e)).is_none() {
                    return Err(ReadErrorKind::Invalid(format!(
                        "a sample of {} is not a whole number of bytes, so it cannot be read as binary",
                        describe_tensor(t)
                    ))
                    .at(file, name));
                }
            }
            ElementType::Binary
        } else {
            match common_element(all.iter().map(|(_, t)| t.dtype))
                .as_ref()
                .and_then(ElementType::from_arrow)
            {
                Some(e) => e,
                None => {
                    let mut pair = (first, all.last().copied().unwrap_or(first));
                    'outer: for (i, a) in all.iter().enumerate() {
                        for b in &all[i + 1..] {
                            if common_element([a.1.dtype, b.1.dtype]).is_none() {
                                pair = (*a, *b);
                                break 'outer;
                            }
                        }
                    }
                    return Err(conflict(
                        name,
                        pair.0,
                        pair.1,
                        "the dtypes have no common Spark type they all widen to exactly",
                    ));
                }
            }
        };
        // A ragged array's rows are nested once more than its elements; bytes-only dtypes give
        // each row's bytes.
        let rank = match (ragged, element) {
            (None, _) => rank,
            (Some(_), ElementType::Binary) => 0,
            (Some(_), _) => rank + 1,
        };
        columns.push(SampleColumn {
            name: name.to_owned(),
            element,
            rank,
            ragged: ragged.is_some(),
        });
    }
    Ok(columns)
}

fn scan_schema<'a>(
    cat: &'a Catalog<'a>,
    layout: Layout,
) -> Result<Answer<ScanSchema<'a>>, ReadError> {
    Ok(Answer::Ready(match layout {
        Layout::Sample => {
            let mut files = Vec::with_capacity(cat.files.len());
            let mut need = Vec::new();
            for e in &cat.files {
                match sample_file(cat, e)? {
                    Some(f) => files.push(f),
                    None => need.push(e.input.file.clone()),
                }
            }
            if !need.is_empty() {
                return Ok(Answer::NeedHeaders(need));
            }
            let columns = sample_columns(&files)?;
            ScanSchema::Sample { columns, files }
        }
        Layout::Tensor => {
            // A consistent manifest's column dtypes are its shards' dtypes (every shard holds
            // every column), so only files outside one need their header.
            let mut dtypes = Vec::new();
            let mut manifests = HashSet::new();
            let mut need = Vec::new();
            for e in &cat.files {
                if let Some((mi, _)) = e.shard {
                    if manifests.insert(mi) {
                        if let Some(m) = cat.manifests.get(mi) {
                            dtypes.extend(m.manifest.schema.0.iter().map(|(_, t)| t.dtype));
                            // a ragged column's offsets tensor is I64 (not in the schema)
                            if m.manifest.schema.0.iter().any(|(_, t)| t.ragged.is_some()) {
                                dtypes.push(Dtype::I64);
                            }
                        }
                    }
                    continue;
                }
                match &e.header {
                    Some(h) => dtypes.extend(h.tensors.iter().map(|t| t.dtype)),
                    None => need.push(e.input.file.clone()),
                }
            }
            if !need.is_empty() {
                return Ok(Answer::NeedHeaders(need));
            }
            ScanSchema::Tensor {
                decoded: common_element(dtypes),
            }
        }
        Layout::File => {
            let files = match cat.headers() {
                Ok(f) => f,
                Err(need) => return Ok(Answer::NeedHeaders(need)),
            };
            let mut keys: Vec<String> = Vec::new();
            let mut seen = std::collections::HashSet::new();
            for (e, h) in &files {
                for t in &h.tensors {
                    if seen.insert(t.name.as_str()) {
                        keys.push(t.name.clone());
                        let limit = cat.file_layout_max_tensors;
                        if keys.len() as u64 > limit {
                            return Err(ReadErrorKind::TooManyColumns {
                                what: " named differently over the files read (this file adds the one beyond the limit)",
                                count: keys.len() as u64,
                                limit,
                            }
                            .in_file(&e.input.file));
                        }
                    }
                }
            }
            // A tensor named like one of the layout's own columns takes its place; that column
            // is then the hidden `_<name>`, which must not be a tensor's name too.
            for fixed in FILE_LAYOUT_COLUMNS {
                let hidden = format!("_{fixed}");
                let holder = files.iter().find(|(_, h)| h.tensor(&hidden).is_some());
                if let (true, Some((e, _))) = (seen.contains(fixed), holder) {
                    return Err(ReadErrorKind::Invalid(format!(
                        "tensors `{fixed}` and `{hidden}`: a tensor named `{fixed}` moves the \
                         per-file layout's `{fixed}` column to the hidden column `{hidden}`, \
                         which a tensor has the name of"
                    ))
                    .at(&e.input.file, &hidden));
                }
            }
            ScanSchema::File { keys, files }
        }
    }))
}

impl ScanSchema<'_> {
    /// Every column (name, source) of the scan, metadata columns last.
    fn columns(&self) -> Vec<OutputColumn> {
        let col = |name: &str, source| OutputColumn {
            name: name.to_owned(),
            source,
        };
        match self {
            ScanSchema::Sample { columns, .. } => {
                let mut out: Vec<OutputColumn> = columns
                    .iter()
                    .map(|c| {
                        col(
                            &c.name,
                            ColumnSource::Sample {
                                tensor: c.name.clone(),
                                element: c.element,
                                rank: c.rank,
                                ragged: c.ragged,
                            },
                        )
                    })
                    .collect();
                out.push(col("_file", ColumnSource::File));
                out.push(col("_metadata", ColumnSource::Metadata));
                out
            }
            ScanSchema::Tensor { decoded, .. } => {
                let mut out = vec![
                    col("file", ColumnSource::File),
                    col("key", ColumnSource::Key),
                    col("dtype", ColumnSource::Dtype),
                    col("shape", ColumnSource::Shape),
                    col("byte_size", ColumnSource::ByteSize),
                    col("data", ColumnSource::Data),
                ];
                if let Some(e) = decoded.as_ref().and_then(ElementType::from_arrow) {
                    out.push(col("decoded", ColumnSource::Decoded { element: e }));
                }
                out.push(col("metadata", ColumnSource::Metadata));
                out.extend(forensic_columns());
                out
            }
            ScanSchema::File { keys, .. } => {
                // The layout's own columns keep their names unless a tensor has one: then the
                // tensor is that column and the layout's is the hidden `_<name>` (as a data
                // column named `_metadata` hides Spark file sources' `_metadata`).
                let own = |c: OutputColumn| {
                    if keys.contains(&c.name) {
                        OutputColumn {
                            name: format!("_{}", c.name),
                            ..c
                        }
                    } else {
                        c
                    }
                };
                let mut out = vec![own(col("file", ColumnSource::File))];
                out.extend(keys.iter().map(|k| {
                    col(
                        k,
                        ColumnSource::Tensor {
                            key: k.clone(),
                            fields: TensorField::ALL.to_vec(),
                        },
                    )
                }));
                out.push(own(col("metadata", ColumnSource::Metadata)));
                out.extend(forensic_columns().map(own));
                out
            }
        }
    }

    /// Visible columns and hidden metadata columns as Spark struct JSON.
    fn spark_json(&self) -> (serde_json::Value, serde_json::Value) {
        let all = self.columns();
        let hidden = |c: &OutputColumn| c.is_hidden();
        let visible: Vec<Field> = all
            .iter()
            .filter(|c| !hidden(c))
            .map(OutputColumn::arrow_field)
            .collect();
        let meta: Vec<Field> = all
            .iter()
            .filter(|c| hidden(c))
            .map(OutputColumn::arrow_field)
            .collect();
        (
            spark_type_json(&DataType::Struct(Fields::from(visible))),
            spark_type_json(&DataType::Struct(Fields::from(meta))),
        )
    }
}

/// Resolves the layout and the schema.
pub fn describe(req: &DescribeRequest) -> Result<Answer<ScanDescription>, ReadError> {
    let cat = catalog(&req.input, req.layout == LayoutOption::File)?;
    let layout = match cat.resolve(req.layout).ready() {
        Ok(l) => l,
        Err(ask) => return Ok(ask),
    };
    let schema = match scan_schema(&cat, layout)?.ready() {
        Ok(s) => s,
        Err(ask) => return Ok(ask),
    };
    let (schema_json, metadata_columns) = schema.spark_json();
    Ok(Answer::Ready(ScanDescription {
        layout,
        schema: schema_json,
        metadata_columns,
        excluded: cat.excluded.clone(),
    }))
}

// ---------------------------------------------------------------------------------------------
// Planning
// ---------------------------------------------------------------------------------------------

fn layout_name(layout: Layout) -> &'static str {
    match layout {
        Layout::Sample => "sample",
        Layout::Tensor => "tensor",
        Layout::File => "file",
    }
}

/// The per-file layout's own columns: a tensor of one of these names takes the column's place,
/// and the column becomes the hidden metadata column `_<name>`.
const FILE_LAYOUT_COLUMNS: [&str; 5] = ["file", "metadata", "flags", "model_info", "sha256"];

/// The forensic report's columns of the per-tensor and per-file layouts, every field.
fn forensic_columns() -> [OutputColumn; 3] {
    [
        OutputColumn {
            name: "flags".to_owned(),
            source: ColumnSource::Flags {
                fields: forensic_columns::all_fields(&forensic_columns::FLAG_FIELDS),
            },
        },
        OutputColumn {
            name: "model_info".to_owned(),
            source: ColumnSource::ModelInfo {
                fields: forensic_columns::all_fields(&forensic_columns::MODEL_INFO_FIELDS),
            },
        },
        OutputColumn {
            name: "sha256".to_owned(),
            source: ColumnSource::Sha256,
        },
    ]
}

fn output_column(
    layout: Layout,
    all: &[OutputColumn],
    by_name: &HashMap<&str, &OutputColumn>,
    rc: &RequiredColumn,
) -> Result<OutputColumn, ReadError> {
    let Some(&found) = by_name.get(rc.name.as_str()) else {
        let names: Vec<&str> = all.iter().map(|c| c.name.as_str()).collect();
        return Err(ReadErrorKind::UnknownColumn {
            column: rc.name.clone(),
            layout: layout_name(layout),
            available: names.join(", "),
        }
        .in_scan());
    };
    let mut out = found.clone();
    if let (ColumnSource::Tensor { fields, .. }, Some(wanted)) = (&mut out.source, &rc.fields) {
        *fields = wanted
            .iter()
            .map(|f| {
                TensorField::from_name(f).ok_or_else(|| {
                    ReadError::new(
                        "",
                        Some(&rc.name),
                        ReadErrorKind::Invalid(format!(
                            "no field `{f}` in a Tensor Struct (data, shape, dtype)"
                        )),
                    )
                })
            })
            .collect::<Result<_, _>>()?;
    }
    let struct_fields = match &mut out.source {
        ColumnSource::Flags { fields } => Some((fields, &forensic_columns::FLAG_FIELDS[..])),
        ColumnSource::ModelInfo { fields } => {
            Some((fields, &forensic_columns::MODEL_INFO_FIELDS[..]))
        }
        _ => None,
    };
    if let (Some((fields, all)), Some(wanted)) = (struct_fields, &rc.fields) {
        forensic_columns::check_fields(&rc.name, wanted, all)
            .map_err(|m| ReadError::new("", Some(&rc.name), ReadErrorKind::Invalid(m)))?;
        *fields = wanted.clone();
    }
    Ok(out)
}

/// The pushed predicates, grouped by what they test.
#[derive(Default)]
struct Filters<'a> {
    file: Vec<&'a PredicateTest>,
    key: Vec<&'a PredicateTest>,
    dtype: Vec<&'a PredicateTest>,
}

impl PredicateTest {
    /// Whether `value` passes.
    pub fn test(&self, value: &str) -> bool {
        match self {
            PredicateTest::In(values) => values.iter().any(|v| v == value),
            PredicateTest::Prefix(prefixes) => {
                prefixes.iter().any(|p| value.starts_with(p.as_str()))
            }
        }
    }
}

fn filters(layout: Layout, predicates: &[Predicate]) -> Result<Filters<'_>, ReadError> {
    let mut f = Filters::default();
    for p in predicates {
        match (p.column.as_str(), layout) {
            ("file" | "_file", _) => f.file.push(&p.test),
            ("key", Layout::Tensor) => f.key.push(&p.test),
            ("dtype", Layout::Tensor) => f.dtype.push(&p.test),
            (other, _) => {
                return Err(ReadError::new(
                    "",
                    Some(other),
                    ReadErrorKind::Invalid(format!(
                    "a predicate on `{other}` cannot be pushed to the {} layout (only `file`{})",
                    layout_name(layout),
                    if layout == Layout::Tensor {
                        ", `key`, `dtype`"
                    } else {
                        ""
                    }
                )),
                ))
            }
        }
    }
    Ok(f)
}

fn passes(tests: &[&PredicateTest], value: &str) -> bool {
    tests.iter().all(|t| t.test(value))
}

fn assumption(t: &safetensors_spark_format::header::TensorInfo) -> TensorAssumption {
    TensorAssumption {
        name: t.name.clone(),
        dtype: t.dtype,
        shape: t.shape.clone(),
        ragged: None,
    }
}

/// Data bytes of one sample of `t` (whole tensor bytes / rows).
fn sample_bytes(t: &TensorAssumption) -> u64 {
    let elements = t
        .shape
        .iter()
        .skip(1)
        .try_fold(1u64, |a, &d| a.checked_mul(d));
    elements
        .and_then(|e| t.dtype.checked_byte_len(e))
        .unwrap_or(u64::MAX)
}

fn units(
    schema: &ScanSchema<'_>,
    tensor_files: &[TensorFile<'_>],
    columns: &[OutputColumn],
    filters: &Filters<'_>,
    max_bytes: u64,
) -> Vec<Unit> {
    let max_bytes = max_bytes.max(1);
    let mut out = Vec::new();
    match schema {
        ScanSchema::Sample { files, .. } => {
            let wanted: Vec<&str> = columns
                .iter()
                .filter_map(|c| c.source.sample_target().map(|(t, _, _)| t))
                .collect();
            for f in files {
                let uri = &f.entry.input.file;
                if f.samples == 0 || !passes(&filters.file, uri) {
                    continue;
                }
                let tensors: Vec<TensorAssumption> =
                    wanted.iter().filter_map(|n| f.tensor(n)).cloned().collect();
                let row_bytes = tensors.iter().fold(0u64, |a, t| {
                    a.saturating_add(match t.ragged {
                        Some(_) => f.ragged_row_bytes.get(&t.name).copied().unwrap_or(8),
                        None => sample_bytes(t),
                    })
                });
                let per_unit = max_bytes
                    .checked_div(row_bytes)
                    .map_or(f.samples, |n| n.max(1));
                let mut start = 0;
                while start < f.samples {
                    let end = start.saturating_add(per_unit).min(f.samples);
                    out.push(Unit {
                        file: uri.clone(),
                        length: f.entry.input.length,
                        part: UnitPart::Sample {
                            start,
                            end,
                            samples: f.samples,
                            padded_samples: f.padded,
                            tensors: tensors.clone(),
                        },
                        bytes: row_bytes.saturating_mul(end - start),
                    });
                    start = end;
                }
            }
        }
        ScanSchema::Tensor { .. } => {
            let reads = |dtype: Dtype| {
                columns
                    .iter()
                    .filter_map(|c| c.source.tensor_column())
                    .any(|c| c.reads_data(dtype))
            };
            for f in tensor_files {
                let uri = &f.entry.input.file;
                let mut group: Vec<TensorAssumption> = Vec::new();
                let mut group_bytes = 0u64;
                let mut flush = |group: &mut Vec<TensorAssumption>, bytes: &mut u64| {
                    if !group.is_empty() {
                        out.push(Unit {
                            file: uri.clone(),
                            length: f.entry.input.length,
                            part: UnitPart::Tensors {
                                tensors: std::mem::take(group),
                            },
                            bytes: *bytes,
                        });
                    }
                    *bytes = 0;
                };
                for (t, len) in &f.tensors {
                    let b = if reads(t.dtype) { *len } else { 0 };
                    if !group.is_empty() && b > 0 && group_bytes.saturating_add(b) > max_bytes {
                        flush(&mut group, &mut group_bytes);
                    }
                    group.push(t.clone());
                    group_bytes = group_bytes.saturating_add(b);
                }
                flush(&mut group, &mut group_bytes);
            }
        }
        ScanSchema::File { files, .. } => {
            for (e, h) in files {
                let uri = &e.input.file;
                if !passes(&filters.file, uri) {
                    continue;
                }
                let mut tensors = Vec::new();
                // the file's digest reads every byte of it
                let mut bytes = if columns.iter().any(|c| c.source == ColumnSource::Sha256) {
                    e.input.length
                } else {
                    0
                };
                for c in columns {
                    if let ColumnSource::Tensor { key, fields } = &c.source {
                        if let Some(t) = h.tensor(key) {
                            if fields.contains(&TensorField::Data) {
                                bytes = bytes.saturating_add(t.byte_len());
                            }
                            tensors.push(assumption(t));
                        }
                    }
                }
                out.push(Unit {
                    file: uri.clone(),
                    length: e.input.length,
                    part: UnitPart::File { tensors },
                    bytes,
                });
            }
        }
    }
    out
}

/// One file of a per-tensor plan: its matching tensors (in file order) with their byte sizes.
struct TensorFile<'a> {
    entry: &'a Entry<'a>,
    tensors: Vec<(TensorAssumption, u64)>,
}

/// Whether an index's rows cover exactly the manifest's shards: the same file names, each with
/// as many rows as the shard has tensors.
fn index_covers(m: &Manifest, index: &IndexSummary) -> bool {
    index.error.is_none()
        && index.files.len() == m.shards.len()
        && m.shards.iter().all(|s| {
            s.num_tensors.is_some() && index.files.get(&s.shard_path) == s.num_tensors.as_ref()
        })
}

/// Per manifest of the catalog: whether the per-tensor plan takes its directory's tensors
/// from its index. Only with a `key` predicate (the index answers which files hold a key),
/// only for a consistent manifest whose directory has an index and a shard the `file`
/// predicates keep; asks for the summaries it lacks ([`Answer::NeedIndex`]).
fn indexed_manifests(cat: &Catalog<'_>, filters: &Filters<'_>) -> Answer<Vec<bool>> {
    let mut use_index = vec![false; cat.manifests.len()];
    if filters.key.is_empty() {
        return Answer::Ready(use_index);
    }
    let mut need = Vec::new();
    for (m, used) in cat.manifests.iter().zip(&mut use_index) {
        let wanted = m.consistent
            && m.input.has_index
            && m.manifest
                .shards
                .iter()
                .any(|s| passes(&filters.file, &format!("{}/{}", m.dir, s.shard_path)));
        if !wanted {
            continue;
        }
        match &m.input.index {
            None => need.push(m.dir.clone()),
            Some(index) => *used = index_covers(&m.manifest, index),
        }
    }
    if need.is_empty() {
        Answer::Ready(use_index)
    } else {
        Answer::NeedIndex(need)
    }
}

/// The files a per-tensor plan reads, with their matching tensors: from the index for the
/// directories `indexed` marks, else from headers (asked for when missing). Files the `file`
/// predicates exclude need nothing.
fn tensor_files<'a>(
    cat: &'a Catalog<'a>,
    filters: &Filters<'_>,
    indexed: &[bool],
) -> Answer<Vec<TensorFile<'a>>> {
    let mut rows: HashMap<(usize, &str), Vec<&IndexEntry>> = HashMap::new();
    for (mi, m) in cat.manifests.iter().enumerate() {
        if !indexed.get(mi).copied().unwrap_or(false) {
            continue;
        }
        for r in m.input.index.iter().flat_map(|i| &i.rows) {
            rows.entry((mi, r.file_name.as_str())).or_default().push(r);
        }
    }
    let keep = |name: &str, dtype: Dtype| {
        passes(&filters.key, name) && passes(&filters.dtype, dtype.name())
    };
    let mut out = Vec::new();
    let mut need = Vec::new();
    for e in &cat.files {
        let uri = e.input.file.as_str();
        if !passes(&filters.file, uri) {
            continue;
        }
        let from_index = e
            .shard
            .filter(|(mi, _)| indexed.get(*mi).copied().unwrap_or(false));
        if let Some((mi, _)) = from_index {
            let (_, name) = split_uri(uri);
            let mut found: Vec<&IndexEntry> = rows.remove(&(mi, name)).unwrap_or_default();
            found.sort_by_key(|r| r.data_start);
            let tensors: Vec<_> = found
                .into_iter()
                .filter(|r| keep(&r.tensor_key, r.dtype))
                .map(|r| {
                    (
                        TensorAssumption {
                            name: r.tensor_key.clone(),
                            dtype: r.dtype,
                            shape: r.shape.clone(),
                            ragged: None,
                        },
                        r.data_end.saturating_sub(r.data_start),
                    )
                })
                .collect();
            if !tensors.is_empty() {
                out.push(TensorFile { entry: e, tensors });
            }
            continue;
        }
        match &e.header {
            None => need.push(uri.to_owned()),
            Some(h) => {
                let tensors: Vec<_> = h
                    .tensors
                    .iter()
                    .filter(|t| keep(&t.name, t.dtype))
                    .map(|t| (assumption(t), t.byte_len()))
                    .collect();
                if !tensors.is_empty() {
                    out.push(TensorFile { entry: e, tensors });
                }
            }
        }
    }
    if need.is_empty() {
        Answer::Ready(out)
    } else {
        Answer::NeedHeaders(need)
    }
}

/// Summarises a dataset directory's `_tensor_index.parquet` (the whole file's bytes, or any
/// Parquet source) for a per-tensor plan with `predicates`: every file's row count and the rows
/// the `key`/`dtype`/`file` predicates keep (a row's file is `dir + "/" + file_name`). Errors:
/// an invalid predicate, or an index that is not valid Parquet with the index's columns.
pub fn index_summary<R: ChunkReader + 'static>(
    dir: &str,
    parquet: R,
    predicates: &[Predicate],
) -> Result<IndexSummary, ReadError> {
    let f = filters(Layout::Tensor, predicates)?;
    let name = format!("{dir}/{INDEX_DIR_NAME}");
    let mut files: BTreeMap<String, u64> = BTreeMap::new();
    let rows = read_index_from(parquet, Path::new(&name), |r| {
        match files.get_mut(r.file_name) {
            Some(n) => *n += 1,
            None => {
                files.insert(r.file_name.to_owned(), 1);
            }
        }
        passes(&f.key, r.tensor_key)
            && passes(&f.dtype, r.dtype)
            && (f.file.is_empty() || passes(&f.file, &format!("{dir}/{}", r.file_name)))
    })
    .map_err(|e| ReadErrorKind::Index(e.to_string()).in_scan())?;
    Ok(IndexSummary {
        files,
        rows: rows.into_iter().map(IndexEntry::from).collect(),
        error: None,
    })
}

/// The answer of [`index_part_summary`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PartAnswer {
    /// Fetch these `[start, length]` byte ranges of the part too and ask again.
    Need(Vec<(u64, u64)>),
    /// The part's summary: its shard's row count and the rows the predicates keep.
    Summary(IndexSummary),
}

/// A key lookup in the index part of shard `shard` of the dataset directory `dir`
/// (spec/dataset.md §6.1) of which the JVM fetched some byte ranges (`file`): asks for the
/// footer, then for the row groups whose `tensor_key` statistics can hold a key the `key`
/// predicates want (all of them without a `key` predicate), then summarises those rows like
/// [`index_summary`]. Every row must name `shard`.
pub fn index_part_summary(
    dir: &str,
    shard: &str,
    file: &SparseFile,
    predicates: &[Predicate],
) -> Result<PartAnswer, ReadError> {
    let f = filters(Layout::Tensor, predicates)?;
    let name = format!("{dir}/{INDEX_DIR_NAME}/{shard}");
    let bad = |e: String| ReadErrorKind::Index(e).in_scan();
    // the key tests all hold (AND): any one of them bounds the row groups; an exact one best
    let key_test = f
        .key
        .iter()
        .find(|t| matches!(t, PredicateTest::In(_)))
        .or_else(|| f.key.first());
    let filter = match key_test {
        Some(PredicateTest::In(v)) => KeyFilter {
            exact: v.iter().map(String::as_str).collect(),
            prefixes: Vec::new(),
        },
        Some(PredicateTest::Prefix(v)) => KeyFilter {
            exact: Vec::new(),
            prefixes: v.iter().map(String::as_str).collect(),
        },
        None => KeyFilter::default(),
    };
    let mut other_file = None;
    let answer = lookup_sparse(file, Path::new(&name), &filter, |r| {
        if r.file_name != shard && other_file.is_none() {
            other_file = Some(r.file_name.to_string());
        }
        passes(&f.key, r.tensor_key)
            && passes(&f.dtype, r.dtype)
            && (f.file.is_empty() || passes(&f.file, &format!("{dir}/{}", r.file_name)))
    })
    .map_err(|e| bad(e.to_string()))?;
    if let Some(other) = other_file {
        return Err(bad(format!(
            "{name}: the index part of {shard} lists rows of {other}"
        )));
    }
    Ok(match answer {
        SparseLookup::NeedRanges(r) => PartAnswer::Need(r),
        SparseLookup::Ready(total, rows) => PartAnswer::Summary(IndexSummary {
            files: BTreeMap::from([(shard.to_string(), total)]),
            rows: rows.into_iter().map(IndexEntry::from).collect(),
            error: None,
        }),
    })
}

/// Spark's `FilePartition.maxSplitBytes`: `min(max_bytes, max(open_cost, total / min_partitions))`,
/// `total` being the selected bytes of every file plus `open_cost` per file. Below
/// `max_bytes` only for scans smaller than `min_partitions × max_bytes`, which would otherwise
/// fill a few partitions and leave cores idle.
fn max_split_bytes(units: &[Unit], max_bytes: u64, open_cost: u64, min_partitions: u64) -> u64 {
    let mut files = HashSet::new();
    let total = units.iter().fold(0u64, |a, u| {
        let open = if files.insert(u.file.as_str()) {
            open_cost
        } else {
            0
        };
        a.saturating_add(u.bytes).saturating_add(open)
    });
    max_bytes.min(open_cost.max(total / min_partitions.max(1)))
}

/// Spark's `FilePartition.getFilePartitions`: largest first, a partition is closed when the
/// next unit would take it beyond `max_bytes`; every unit also costs `open_cost`.
fn pack(mut units: Vec<Unit>, max_bytes: u64, open_cost: u64) -> Vec<Vec<Unit>> {
    units.sort_by_key(|u| std::cmp::Reverse(u.bytes.saturating_add(open_cost)));
    let mut parts = Vec::new();
    let mut current: Vec<Unit> = Vec::new();
    let mut size = 0u64;
    for u in units {
        if !current.is_empty() && size.saturating_add(u.bytes) > max_bytes {
            parts.push(std::mem::take(&mut current));
            size = 0;
        }
        size = size.saturating_add(u.bytes).saturating_add(open_cost);
        current.push(u);
    }
    if !current.is_empty() {
        parts.push(current);
    }
    parts
}

/// Plans the partitions.
///
/// Needs the headers [`describe`] needs (the column types are the whole scan's, whatever the
/// predicates) and those of the files it plans, or, for a key lookup, the index summaries
/// ([`Answer::NeedIndex`], module docs); validates `required` and `predicates` against the
/// layout, and drops files and tensors the predicates exclude: they appear in no unit and are
/// never opened.
pub fn plan(req: &PlanRequest) -> Result<Answer<Vec<PartitionSpec>>, ReadError> {
    let cat = catalog(&req.input, req.layout == Layout::File)?;
    let filters = filters(req.layout, &req.predicates)?;
    let mut files = Vec::new();
    if req.layout == Layout::Tensor {
        let indexed = match indexed_manifests(&cat, &filters).ready() {
            Ok(i) => i,
            Err(ask) => return Ok(ask),
        };
        files = match tensor_files(&cat, &filters, &indexed) {
            Answer::Ready(f) => f,
            Answer::NeedHeaders(mut need) => {
                // Ask in one round for the schema's headers too (files the predicates exclude).
                if let Answer::NeedHeaders(more) = scan_schema(&cat, req.layout)? {
                    need.extend(more);
                    need.sort();
                    need.dedup();
                }
                return Ok(Answer::NeedHeaders(need));
            }
            Answer::NeedIndex(dirs) => return Ok(Answer::NeedIndex(dirs)),
        };
    }
    let schema = match scan_schema(&cat, req.layout)?.ready() {
        Ok(s) => s,
        Err(ask) => return Ok(ask),
    };
    let all = schema.columns();
    if let Some(p) = req.predicates.iter().find(|p| {
        p.column == "file"
            && all
                .iter()
                .any(|c| c.name == "file" && c.source != ColumnSource::File)
    }) {
        return Err(ReadError::new(
            "",
            Some(&p.column),
            ReadErrorKind::Invalid(
                "`file` is a tensor column here; a predicate on the file's URI names `_file`"
                    .into(),
            ),
        ));
    }
    // by name: the per-file layout may have thousands of columns, all of them required
    let by_name: HashMap<&str, &OutputColumn> =
        all.iter().rev().map(|c| (c.name.as_str(), c)).collect();
    let columns = req
        .required
        .iter()
        .map(|rc| output_column(req.layout, &all, &by_name, rc))
        .collect::<Result<Vec<_>, _>>()?;
    let mut planned = units(&schema, &files, &columns, &filters, req.max_partition_bytes);
    let split = max_split_bytes(
        &planned,
        req.max_partition_bytes,
        req.open_cost_bytes,
        req.min_partitions,
    );
    if split < req.max_partition_bytes {
        // A file's selected bytes do not depend on how it is split: `total` stays the same.
        planned = units(&schema, &files, &columns, &filters, split);
    }
    // the files of datasets whose manifest records their CRC-32C (others: no check)
    let mut recorded: HashMap<String, ShardChecksum> = HashMap::new();
    if req.verify_checksums {
        for m in &cat.manifests {
            for s in &m.manifest.shards {
                if let Some(crc) = &s.crc32c {
                    recorded.insert(
                        format!("{}/{}", m.dir, s.shard_path),
                        ShardChecksum {
                            crc32c: crc.clone(),
                            bytes: s.bytes,
                        },
                    );
                }
            }
        }
    }
    let specs = pack(planned, split, req.open_cost_bytes)
        .into_iter()
        .map(|units| PartitionSpec {
            checksums: units
                .iter()
                .filter_map(|u| recorded.get(&u.file).map(|c| (u.file.clone(), c.clone())))
                .collect(),
            layout: req.layout,
            columns: columns.clone(),
            bytes: units.iter().fold(0u64, |a, u| a.saturating_add(u.bytes)),
            units,
            batch_rows: req.batch_rows,
            batch_bytes: req.batch_bytes,
            ignore_corrupt: req.input.ignore_corrupt,
        })
        .collect();
    Ok(Answer::Ready(specs))
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn spark_field_json(f: &Field) -> serde_json::Value {
    json!({
        "name": f.name(),
        "type": spark_type_json(f.data_type()),
        "nullable": f.is_nullable(),
        "metadata": {},
    })
}

/// Spark's JSON form of the type Spark gives an Arrow array of type `t` (as `ArrowUtils`
/// maps it): Boolean → `"boolean"`, Int8 → `"byte"`, Int16 → `"short"`, Int32 →
/// `"integer"`, Int64 → `"long"`, Float32 → `"float"`, Float64 → `"double"`, Utf8 →
/// `"string"`, Binary → `"binary"`, List → `{"type":"array","elementType":…,"containsNull":…}`,
/// Struct → `{"type":"struct","fields":[{"name","type","nullable","metadata":{}}]}`, Map →
/// `{"type":"map","keyType":…,"valueType":…,"valueContainsNull":…}`. Other Arrow types (never
/// produced by the read path) give `"null"`.
pub fn spark_type_json(t: &DataType) -> serde_json::Value {
    match t {
        DataType::Boolean => json!("boolean"),
        DataType::Int8 => json!("byte"),
        DataType::Int16 => json!("short"),
        DataType::Int32 => json!("integer"),
        DataType::Int64 => json!("long"),
        DataType::Float32 => json!("float"),
        DataType::Float64 => json!("double"),
        DataType::Utf8 => json!("string"),
        DataType::Binary => json!("binary"),
        DataType::List(f) => json!({
            "type": "array",
            "elementType": spark_type_json(f.data_type()),
            "containsNull": f.is_nullable(),
        }),
        DataType::Struct(fields) => json!({
            "type": "struct",
            "fields": fields.iter().map(|f| spark_field_json(f)).collect::<Vec<_>>(),
        }),
        DataType::Map(entries, _) => {
            let (key, value) = match entries.data_type() {
                DataType::Struct(kv) if kv.len() == 2 => {
                    (spark_type_json(kv[0].data_type()), Some(&kv[1]))
                }
                _ => (json!("null"), None),
            };
            json!({
                "type": "map",
                "keyType": key,
                "valueType": value.map_or(json!("null"), |v| spark_type_json(v.data_type())),
                "valueContainsNull": value.is_none_or(|v| v.is_nullable()),
            })
        }
        _ => json!("null"),
    }
}

/// Validates a file's first `8 + N` bytes (prefix and header JSON) against its length and
/// returns the header JSON text (what [`FileInput::header`] carries): all N bytes, trailing
/// padding included, so that its length is the file's N. Errors name `file`.
pub fn validated_header_text(
    file: &str,
    prefix_and_header: &[u8],
    file_len: u64,
) -> Result<String, ReadError> {
    let fmt = |e| ReadErrorKind::Format(e).in_file(file);
    let n = header::check_prefix(prefix_and_header, file_len).map_err(fmt)?;
    let end = PREFIX_LEN + n; // n ≤ 100 MB: no overflow
    let json = prefix_and_header
        .get(PREFIX_LEN as usize..end as usize)
        .ok_or_else(|| {
            ReadErrorKind::Invalid(format!(
                "{} bytes given, but the prefix and header are {end} bytes",
                prefix_and_header.len()
            ))
            .in_file(file)
        })?;
    header::parse_header(json, file_len).map_err(fmt)?;
    String::from_utf8(json.to_vec())
        .map_err(|e| ReadErrorKind::Invalid(format!("header is not UTF-8: {e}")).in_file(file))
}

#[cfg(test)]
pub(crate) mod tests;
