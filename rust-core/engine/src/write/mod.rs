//! The Spark write path's engine: the validated write plan, per-task shard writers, and the
//! job-level manifest and index.
//!
//! Flow (spec/jni.md has the JNI side):
//! 1. Driver, plan time: [`plan::plan_write`] turns the DataFrame's schema (Spark's own schema
//!    JSON) and the user's options into a [`WritePlan`], or an error naming the option/column.
//!    Nothing on disk has changed yet.
//! 2. Each task: a [`task::TaskWriter`] opened from the plan receives Arrow record batches (the
//!    "wire" format below), validates every row, converts values and writes sealed shards into a
//!    local work directory, reporting each sealed shard as a [`ShardReport`].
//! 3. Driver, job commit: [`commit`] checks the tasks' reports against each other (dtypes and
//!    sample shapes agree, KV keys unique across the write) and builds this write's manifest and
//!    index rows; the dataset crate ([`safetensors_spark_dataset`]) puts them on top of the directory's
//!    latest manifest and writes `_tensor_index.parquet`.
//!
//! ## Wire format of a record batch (JVM → Rust, Arrow C Data Interface)
//! A struct array whose children are, in order: the KV key column (Utf8, KV mode only), then one
//! child per [`ColumnPlan`] in plan order. Child types by [`InputKind`]:
//! * `NumericArray { element, depth }`: `List` nested `depth` times around the primitive of
//!   `element` (Boolean travels as Int8 0/1, matching Spark's one byte per boolean);
//! * `Scalar { element }`: the primitive itself;
//! * `Binary`: Binary;
//! * `TensorStruct`: Struct{data: Binary, shape: List<Int64>, dtype: Utf8};
//! * `MlVector`: Struct{type: Int8, size: Int32, indices: List<Int32>, values: List<Float64>}
//!   (Spark ML's VectorUDT storage: type 0 = sparse, 1 = dense);
//! * `String`: Utf8.
//!
//! A ragged column ([`ColumnPlan::ragged`]) travels in the same types: its rows are Arrow lists
//! (or binary/UTF-8 values) of any length.
//!
//! Nulls travel as Arrow validity; a null value or element is an error naming column and row.

pub mod commit;
pub mod plan;
pub mod task;

use safetensors_spark_dataset::index::IndexRow;
pub use safetensors_spark_dataset::manifest::{RaggedElement, TailStrategy};
pub use safetensors_spark_dataset::names::shard_file_name;
use safetensors_spark_format::header::TensorInfo;
use safetensors_spark_format::Dtype;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A Spark numeric element type (of an array column, a scalar column or a vector).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SparkNumeric {
    Boolean,
    Byte,
    Short,
    Int,
    Long,
    Float,
    Double,
}

impl SparkNumeric {
    /// The dtype a column of this type gets when no `dtype` option applies.
    pub fn natural_dtype(self) -> Dtype {
        match self {
            SparkNumeric::Boolean => Dtype::Bool,
            SparkNumeric::Byte => Dtype::I8,
            SparkNumeric::Short => Dtype::I16,
            SparkNumeric::Int => Dtype::I32,
            SparkNumeric::Long => Dtype::I64,
            SparkNumeric::Float => Dtype::F32,
            SparkNumeric::Double => Dtype::F64,
        }
    }

    /// Spark's name of the type, as in its schema JSON (`"float"`, `"long"`, …).
    pub fn spark_name(self) -> &'static str {
        match self {
            SparkNumeric::Boolean => "boolean",
            SparkNumeric::Byte => "byte",
            SparkNumeric::Short => "short",
            SparkNumeric::Int => "integer",
            SparkNumeric::Long => "long",
            SparkNumeric::Float => "float",
            SparkNumeric::Double => "double",
        }
    }
}

/// What a written column holds in Spark, and so how it travels and is read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum InputKind {
    /// `array<…array<T>…>` nested `depth` ≥ 1 times; a row's tensor has rank `depth`
    /// (rows of different lengths are an error unless the column is ragged, [`RaggedPlan`]).
    NumericArray { element: SparkNumeric, depth: u32 },
    /// A numeric scalar column: one element per row.
    Scalar { element: SparkNumeric },
    /// A binary column holding raw little-endian element bytes; needs `dtype` and `shapes`.
    Binary,
    /// The Tensor Struct: `data` binary, `shape` array of int or long, `dtype` string
    /// (matched by field name, nullability ignored). Keeps its own dtype unless one is set.
    TensorStruct,
    /// A Spark ML vector (dense, or sparse densified); values are doubles.
    MlVector,
    /// A string column (batch mode only): always ragged, stored as its UTF-8 bytes (U8).
    String,
}

/// How a ragged column (spec/dataset.md §2.1) is written: each shard holds the values of its
/// rows concatenated along the first dimension, and the row boundaries as
/// `ragged_offsets_name(column)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaggedPlan {
    /// What a row is (and is read back as).
    pub element: RaggedElement,
    /// The shape of one element of a row (the values tensor's dimensions after the first) when
    /// the plan knows it: `[]` for binary and string columns and `array<T>`; an append's from
    /// the dataset. `None`: fixed by the first row that shows it (array nested ≥ 2 deep).
    pub inner_shape: Option<Vec<u64>>,
}

/// One column to write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnPlan {
    /// The Spark column name: the tensor name in batch mode, the suffix in KV mode.
    pub name: String,
    /// Position of the column in the DataFrame's schema (where the JVM reads it from).
    pub field_index: usize,
    pub input: InputKind,
    /// The dtype written. `None` only for a Tensor Struct without a `dtype` option: each value
    /// keeps its own dtype.
    pub dtype: Option<Dtype>,
    /// The `shapes` option for this column: the per-sample shape each value is reshaped to
    /// (element counts must match). `None`: the value's own shape.
    pub sample_shape: Option<Vec<u64>>,
    /// Batch mode: the column is ragged (option `ragged`, or a binary column without a `shapes`
    /// entry, or a string column). `None`: every row has the same shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ragged: Option<RaggedPlan>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DuplicatesStrategy {
    Fail,
    LastWin,
}

/// Batch or KV mode with its mode-specific options.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "layout", rename_all = "snake_case")]
pub enum WriteMode {
    Batch {
        batch_size: u64,
        tail_strategy: TailStrategy,
    },
    Kv {
        name_col: String,
        /// Position of the key column in the DataFrame's schema.
        name_field_index: usize,
        kv_separator: String,
        /// `target_shard_size_mb` × 2^20.
        target_shard_bytes: u64,
        duplicates: DuplicatesStrategy,
    },
}

/// Everything a write needs, validated; produced on the driver and shipped to every task as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WritePlan {
    /// One random UUID per write; part of every shard name.
    pub write_id: String,
    #[serde(rename = "layout")]
    pub mode: WriteMode,
    /// Columns in output order.
    pub columns: Vec<ColumnPlan>,
    /// User metadata added to every shard's `__metadata__`.
    pub metadata: BTreeMap<String, String>,
    pub generate_index: bool,
    /// The `retention` option in seconds (spec/dataset.md §5.8.1); `None`: the dataset's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_seconds: Option<u64>,
    /// `checkpoint_interval` (spec/dataset.md §5.10), recorded in the manifest.
    pub checkpoint_interval: Option<u64>,
}

/// One tensor of a sealed shard, as the index and the commit checks need it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// Absolute byte offsets of the tensor's data in the file.
    pub data_start: u64,
    pub data_end: u64,
    /// KV mode: the key (name_col value) and the column this tensor came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<String>,
}

impl SealedTensor {
    /// Reports for the tensors of a file whose data section starts at `data_start`; `origin`
    /// gives a tensor's KV key and column from its name (`(None, None)` in batch mode).
    pub fn for_tensors(
        tensors: &[TensorInfo],
        data_start: u64,
        origin: impl Fn(&str) -> (Option<String>, Option<String>),
    ) -> Vec<SealedTensor> {
        tensors
            .iter()
            .map(|t| {
                let (sample_key, column) = origin(&t.name);
                SealedTensor {
                    name: t.name.clone(),
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    data_start: data_start + t.data_offsets[0],
                    data_end: data_start + t.data_offsets[1],
                    sample_key,
                    column,
                }
            })
            .collect()
    }

    /// This tensor's row of the index (spec/dataset.md §6) when it is in the shard `file_name`:
    /// the one mapping of a written tensor to an index row. The column is the tensor name when
    /// the report has none (batch mode).
    pub fn into_index_row(self, file_name: &str) -> IndexRow {
        IndexRow {
            column: self.column.unwrap_or_else(|| self.name.clone()),
            tensor_key: self.name,
            file_name: file_name.to_string(),
            dtype: self.dtype,
            shape: self.shape,
            data_start: self.data_start,
            data_end: self.data_end,
            sample_key: self.sample_key,
        }
    }
}

/// A shard a task has sealed: a complete safetensors file in the task's work directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardReport {
    /// Final file name, `part-{partition:05d}-{shard:04d}-{write_id}.safetensors`.
    pub file: String,
    /// Where the task wrote it (local path in the work directory).
    pub local_path: String,
    pub partition: u32,
    pub shard: u32,
    /// Real rows (batch) or stored keys (KV) in this shard.
    pub samples: u64,
    /// Zero rows appended by `tail_strategy=pad`.
    pub padded_samples: u64,
    /// File size in bytes.
    pub bytes: u64,
    /// CRC-32C of the file, 8 lowercase hex digits, computed as it was written (the manifest's
    /// `shards[].crc32c`). `None` for a shard rebuilt from its header (an earlier write's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32c: Option<String>,
    /// Omitted when empty: the task's report file appends a KV shard's tensors after the other
    /// fields, serialised one at a time from compact records (see `task::write_report`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensors: Vec<SealedTensor>,
    /// KV shards: the tensor count, reported instead of `tensors` (the shard's index part lists
    /// them, spec/dataset.md §6.1). `None`: `tensors` lists every tensor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_tensors: Option<u64>,
}

impl ShardReport {
    /// Tensors in the shard: `num_tensors` when reported, else the listed tensors.
    pub fn tensor_count(&self) -> u64 {
        self.num_tensors.unwrap_or(self.tensors.len() as u64)
    }
}

/// What a task reports when it finishes: every shard it sealed, and what the job-level checks
/// need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskReport {
    pub partition: u32,
    /// Omitted when empty (see [`ShardReport::tensors`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardReport>,
    /// Batch mode: tail rows dropped by `tail_strategy=drop`.
    pub dropped_samples: u64,
    /// Per column: the dtype and per-sample shape this task wrote (batch mode: one shape per
    /// column; KV mode: `None` when rows differed).
    pub columns: BTreeMap<String, ColumnReport>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnReport {
    pub dtype: Dtype,
    /// Fixed-shape columns: the per-sample shape (batch mode: always known). `None` for a
    /// ragged column.
    pub sample_shape: Option<Vec<u64>>,
    /// A ragged column: its inner shape as far as this task's rows showed it (`None` for a
    /// dimension no row determined: the column's rows were all empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inner_shape: Option<Vec<Option<u64>>>,
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod index_tests;
