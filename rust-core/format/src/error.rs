//! Errors of the format core: one variant per rule, each naming the tensor and the numbers.

use crate::dtype::Dtype;
use std::path::PathBuf;

/// Why a safetensors header or file is invalid, or why a file cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error(
        "header too small: a safetensors file needs at least 8 bytes, this one has {file_len}"
    )]
    HeaderTooSmall { file_len: u64 },

    #[error("header too large: the header length is {header_len} bytes, the limit is {limit}")]
    HeaderTooLarge { header_len: u64, limit: u64 },

    #[error("invalid header length: the header claims {header_len} bytes after the 8-byte prefix but the file has only {file_len} bytes in all")]
    HeaderBeyondFile { header_len: u64, file_len: u64 },

    #[error("invalid UTF-8 in header at byte {valid_up_to} of the header")]
    HeaderNotUtf8 { valid_up_to: usize },

    #[error("invalid JSON in header: {message}")]
    InvalidJson { message: String },

    #[error("header must be a JSON object, found {found}")]
    HeaderNotObject { found: &'static str },

    #[error("duplicate key `{key}` in {context}")]
    DuplicateKey { key: String, context: String },

    #[error("`__metadata__` must be an object of string values, found {found}")]
    MetadataNotObject { found: &'static str },

    #[error("`__metadata__` value of key `{key}` must be a string, found {found}")]
    MetadataValueNotString { key: String, found: &'static str },

    #[error("tensor `{name}`: entry must be an object with dtype, shape and data_offsets, found {found}")]
    TensorNotObject { name: String, found: &'static str },

    #[error("tensor `{name}`: missing field `{field}`")]
    MissingField { name: String, field: &'static str },

    #[error("tensor `{name}`: unknown field `{field}` (allowed: dtype, shape, data_offsets)")]
    UnknownField { name: String, field: String },

    #[error("tensor `{name}`: dtype must be a string, found {found}")]
    DtypeNotString { name: String, found: &'static str },

    #[error("tensor `{name}`: unknown dtype `{dtype}` (dtype names are exact and case-sensitive)")]
    UnknownDtype { name: String, dtype: String },

    #[error("tensor `{name}`: shape must be an array of non-negative integers, {problem}")]
    InvalidShape { name: String, problem: String },

    #[error("tensor `{name}`: data_offsets must be exactly two non-negative integers [begin, end], {problem}")]
    InvalidOffsets { name: String, problem: String },

    #[error("tensor `{name}`: data_offsets [{begin}, {end}] end before they begin")]
    ReversedOffsets { name: String, begin: u64, end: u64 },

    #[error("tensor `{name}`: data_offsets [{begin}, {end}] leave a hole: the previous tensor ends at byte {expected}")]
    OffsetHole {
        name: String,
        begin: u64,
        end: u64,
        expected: u64,
    },

    #[error("tensor `{name}`: data_offsets [{begin}, {end}] overlap the previous tensor, which ends at byte {expected}")]
    OffsetOverlap {
        name: String,
        begin: u64,
        end: u64,
        expected: u64,
    },

    #[error(
        "tensor `{name}`: overflow computing the byte size of shape {shape:?} with dtype {dtype}"
    )]
    SizeOverflow {
        name: String,
        dtype: Dtype,
        shape: Vec<u64>,
    },

    #[error("tensor `{name}`: {elements} elements of {dtype} ({bits} bits each) do not end on a byte boundary")]
    MisalignedSubByte {
        name: String,
        dtype: Dtype,
        elements: u64,
        bits: u32,
    },

    #[error("tensor `{name}`: shape {shape:?} of {dtype} needs {expected} bytes but data_offsets give {actual}")]
    SizeMismatch {
        name: String,
        dtype: Dtype,
        shape: Vec<u64>,
        expected: u64,
        actual: u64,
    },

    #[error("file not fully covered: 8-byte prefix + {header_len}-byte header + {data_len} data bytes = {expected} bytes, but the file has {file_len}")]
    FileLengthMismatch {
        header_len: u64,
        data_len: u64,
        expected: u64,
        file_len: u64,
    },

    #[error("file not fully covered: 8-byte prefix + {header_len}-byte header + {data_len} data bytes overflows 64 bits")]
    FileLengthOverflow { header_len: u64, data_len: u64 },

    #[error("tensor name `__metadata__` is reserved for the metadata map")]
    ReservedName,

    #[error("duplicate tensor name `{name}`")]
    DuplicateTensorName { name: String },

    #[error("tensor `{name}` not found")]
    TensorNotFound { name: String },

    #[error("tensor `{name}`: expected {expected} more data bytes, got {actual}")]
    DataLengthMismatch {
        name: String,
        expected: u64,
        actual: u64,
    },

    /// A file became shorter than its validated length while it was being read (truncated or
    /// replaced by another process): spec/format.md §"Reading a file that changes".
    #[error("{path}: the file changed while being read: it is now {actual} bytes, but its header (checked when it was opened) says {expected}; bytes [{start}, {end}) are gone")]
    Shrank {
        path: PathBuf,
        expected: u64,
        actual: u64,
        start: u64,
        end: u64,
    },

    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl FormatError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        FormatError::Io {
            path: path.into(),
            source,
        }
    }
}
