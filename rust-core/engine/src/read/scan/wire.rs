//! The scan's wire types: what the JVM sends and what it gets back (serde JSON).

use super::*;
/// Row layout requested by the `layout` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RowLayoutOption {
    /// `sample` when every file is a batch-mode shard (manifest `layout: batch`, or
    /// `__metadata__` `safetensors_spark.layout` = `batch`) and there is at least one file or
    /// manifest; `tensor` otherwise.
    Auto,
    Sample,
    Tensor,
    File,
}

impl RowLayoutOption {
    /// Every value of the `layout` option, in the order the docs list them.
    pub const ALL: [RowLayoutOption; 4] = [
        RowLayoutOption::Auto,
        RowLayoutOption::Sample,
        RowLayoutOption::Tensor,
        RowLayoutOption::File,
    ];

    /// The option value that names this layout.
    pub fn name(self) -> &'static str {
        match self {
            RowLayoutOption::Auto => "auto",
            RowLayoutOption::Sample => "sample",
            RowLayoutOption::Tensor => "tensor",
            RowLayoutOption::File => "file",
        }
    }

    /// The option's values, comma-separated (for messages).
    pub fn names() -> String {
        Self::ALL.map(Self::name).join(", ")
    }

    /// The `layout` option's value (trimmed, any case); another value is an error naming the
    /// option, the allowed values and the value given.
    pub fn parse(given: &str) -> Result<Self, String> {
        let wanted = given.trim().to_ascii_lowercase();
        Self::ALL
            .into_iter()
            .find(|l| l.name() == wanted)
            .ok_or_else(|| {
                format!(
                    "option 'layout' must be one of {}, got '{given}'",
                    Self::names()
                )
            })
    }
}

/// A resolved layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RowLayout {
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
    /// The manifest's text (the JVM passes it beside the request, in `manifestTexts`, never
    /// escaped into it: tens of MB at 100,000 shards).
    #[serde(default)]
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
    pub rows: Vec<IndexedTensor>,
    /// Set (by the JVM) instead of the rest when the index could not be read or is invalid:
    /// the planner then uses the directory's headers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One row of a `_tensor_index.parquet` (spec/dataset.md §6), as far as planning needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexedTensor {
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
impl From<IndexRow> for IndexedTensor {
    fn from(r: IndexRow) -> Self {
        IndexedTensor {
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
    pub(super) fn file_layout_max_tensors(&self) -> u64 {
        self.file_layout_max_tensors
            .unwrap_or(FILE_LAYOUT_MAX_TENSORS)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeRequest {
    pub layout: RowLayoutOption,
    #[serde(flatten)]
    pub input: ScanInput,
}

/// Result of [`describe`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScanDescription {
    pub layout: RowLayout,
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
    pub(super) fn ready<U>(self) -> Result<T, Answer<U>> {
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
    pub layout: RowLayout,
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

/// The work of one Spark input partition, run by [`crate::read::task::ReadTask`]. Opaque to the
/// JVM except `units[].file` / `units[].length` (to open the file) and `bytes` (an estimate).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionSpec {
    pub layout: RowLayout,
    /// The output columns with everything needed to build them (target types, struct fields).
    pub columns: Vec<OutputColumn>,
    pub units: Vec<Unit>,
    /// Data bytes this partition will read (for balancing and tests).
    pub bytes: u64,
    pub batch_rows: u64,
    pub batch_bytes: u64,
    /// The scan's `ignore_corrupt`: a unit whose file turns out corrupt when opened yields no
    /// rows instead of failing the task (see [`crate::read::task::ReadTask::skipped`]).
    #[serde(default)]
    pub ignore_corrupt: bool,
    /// With `verify_checksums`: the units' files (URI) whose manifest entry records a CRC-32C,
    /// with it; each is read whole and checked before its rows are read.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub checksums: BTreeMap<String, ShardChecksum>,
    /// With `_added_version` required: the units' files (URI) whose manifest records the
    /// version that added them, with it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub added_versions: BTreeMap<String, u64>,
}

/// One output column of a partition: its Spark name and how to fill it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputColumn {
    pub name: String,
    /// RowLayout-specific recipe (tensor name and target element type for per-sample columns;
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
    /// Per sample (`_row_index`, row provenance): the row's index among its shard's real rows,
    /// from 0: Int64, non-null.
    RowIndex,
    /// Per sample (`_added_version`, row provenance): the dataset version that first listed the
    /// row's shard (`shards[].added_version`): Int64, null when the manifest does not record it
    /// or the file is not a dataset's shard.
    AddedVersion,
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

    pub(super) fn target(self) -> SampleTarget {
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
            ColumnSource::RowIndex => Field::new(self.name.clone(), DataType::Int64, false),
            ColumnSource::AddedVersion => Field::new(self.name.clone(), DataType::Int64, true),
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
            ColumnSource::Sample { .. }
            | ColumnSource::Tensor { .. }
            | ColumnSource::RowIndex
            | ColumnSource::AddedVersion => return None,
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
