//! The read path's error: which file, which tensor, and what went wrong.

use safetensors_spark_format::dtype::Dtype;
use safetensors_spark_format::error::FormatError;
use std::fmt;

/// A read failure, naming the file and (when one is involved) the tensor.
#[derive(Debug, thiserror::Error)]
pub struct ReadError {
    /// The file as the caller named it (path or URI).
    pub file: String,
    /// The tensor involved, if any.
    pub tensor: Option<String>,
    #[source]
    pub kind: ReadErrorKind,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // An error about the scan as a whole (no file) names no file.
        if !self.file.is_empty() {
            write!(f, "file `{}`", self.file)?;
            if let Some(t) = &self.tensor {
                write!(f, ", tensor `{t}`")?;
            }
            f.write_str(": ")?;
        } else if let Some(t) = &self.tensor {
            write!(f, "column `{t}`: ")?;
        }
        write!(f, "{}", self.kind)
    }
}

impl ReadError {
    pub fn new(file: &str, tensor: Option<&str>, kind: ReadErrorKind) -> Self {
        ReadError {
            file: file.to_owned(),
            tensor: tensor.map(str::to_owned),
            kind,
        }
    }

    /// An error about one tensor of a file.
    pub fn tensor(file: &str, tensor: &str, kind: ReadErrorKind) -> Self {
        ReadError::new(file, Some(tensor), kind)
    }

    /// An error about a file as a whole.
    pub fn file(file: &str, kind: ReadErrorKind) -> Self {
        ReadError::new(file, None, kind)
    }
}

/// What went wrong; [`ReadError`] adds the file and tensor.
#[derive(Debug, thiserror::Error)]
pub enum ReadErrorKind {
    /// The file is not a valid safetensors file (or could not be read).
    #[error(transparent)]
    Format(#[from] FormatError),

    #[error("dtype {dtype} has no Spark element type; read it as bytes (the per-tensor layout's `data` column)")]
    NotDecodable { dtype: Dtype },

    #[error("{len} bytes are not a whole number of {dtype} elements")]
    ByteLength { dtype: Dtype, len: usize },

    #[error("expected {expected} data bytes, got {actual}")]
    DataLength { expected: u64, actual: u64 },

    #[error("U64 element {index} is {value}, larger than the largest Spark long ({}); U64 values are read as signed longs only when they fit", i64::MAX)]
    U64Overflow { index: u64, value: u64 },

    #[error("a scalar tensor (shape []) has no row dimension to read per sample")]
    NoRowDimension,

    #[error("row range [{start}, {end}) is not within the tensor's {rows} rows")]
    RowRange { start: u64, end: u64, rows: u64 },

    #[error("leading dimension {rows} differs from the file's {expected} rows (samples + padded samples)")]
    RowCount { rows: u64, expected: u64 },

    #[error("{count} {what} do not fit one Arrow batch (limit {limit}); read fewer rows or tensors per batch")]
    TooLarge {
        what: &'static str,
        count: u64,
        limit: u64,
    },

    #[error("no such tensor")]
    MissingTensor,

    /// A ragged column whose offsets (or the metadata naming it) break the convention of
    /// spec/dataset.md §2.1 (the error's `tensor` is the column).
    #[error("ragged column: {0}")]
    RaggedOffsets(String),

    /// A `string` row whose bytes are not UTF-8 (`row`: the row within the file).
    #[error("row {row} is not valid UTF-8 ({detail}); the column is read as string")]
    NotUtf8 { row: u64, detail: String },

    #[error("reserved metadata `{key}` = `{value}`: {problem}")]
    ReservedMetadata {
        key: &'static str,
        value: String,
        problem: &'static str,
    },

    #[error("{from} values cannot be widened losslessly to {to}")]
    NotWidenable { from: String, to: String },

    /// A `dataset_manifest.json` that cannot be read (the error's `file` is the manifest).
    #[error("invalid dataset manifest: {0}")]
    Manifest(String),

    /// A shard a dataset's manifest lists is not in the directory (the error's `file` is the
    /// missing shard).
    #[error("listed in {manifest} but missing; a dataset whose shards are gone cannot be read whole (set ignoreMissingFiles=true, or spark.sql.files.ignoreMissingFiles, to read what is left)")]
    MissingShard { manifest: String },

    /// A `_tensor_index.parquet` that cannot be read (the message names the index).
    #[error("invalid tensor index: {0}")]
    Index(String),

    /// The JVM could not read or validate the file's prefix/header (`FileInput::header_error`).
    #[error("corrupt file: {0}")]
    Corrupt(String),

    /// A column's tensors in two files cannot share one Spark type (the error's `file` is the
    /// later file, its `tensor` the column; the message quotes the earlier file and both
    /// dtypes and shapes).
    #[error("{0}")]
    ColumnConflict(String),

    /// A required column or predicate column the scan does not have.
    #[error("no column `{column}` in this scan ({layout} layout); columns: {available}")]
    UnknownColumn {
        column: String,
        layout: &'static str,
        available: String,
    },

    /// A file (or the union of the files' tensor names) with more tensors than the per-file
    /// layout's column limit (`spec/reading.md` §2.3).
    #[error("{count} tensors{what}; the per-file layout makes a column of each tensor and allows at most {limit} (read option `file_layout_max_tensors`; or read per tensor, layout `tensor`)")]
    TooManyColumns {
        what: &'static str,
        count: u64,
        limit: u64,
    },

    /// A request the read core cannot serve (bad predicate, bad field, bad call order).
    #[error("{0}")]
    Invalid(String),

    /// The file's header differs from what the plan was computed from.
    #[error("changed since the scan was planned: {0}")]
    Changed(String),

    /// The file is not the one the dataset's manifest records (read option `verify_checksums`):
    /// another CRC-32C or size than `shards[].crc32c` / `shards[].bytes`.
    #[error("{0} (read option verify_checksums; the object is corrupt, truncated or was replaced; a retried task fetches it again)")]
    Checksum(String),

    /// A remote batch needed file bytes that were not supplied.
    #[error("file bytes [{start}, {end}) are needed but were not supplied")]
    NotSupplied { start: u64, end: u64 },

    #[error("Arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
}

impl ReadErrorKind {
    /// Names the file and tensor.
    pub fn at(self, file: &str, tensor: &str) -> ReadError {
        ReadError::tensor(file, tensor, self)
    }

    /// Names no file: an error about the scan as a whole.
    pub fn in_scan(self) -> ReadError {
        ReadError::file("", self)
    }

    /// Names the file.
    pub fn in_file(self, file: &str) -> ReadError {
        ReadError::file(file, self)
    }
}
