//! Rust engine of the safetensors Spark data source.
//!
//! * [`alloc_stats`] — the counted global allocator: live native bytes for leak soaks.
//! * [`dtype`] — the one dtype table.
//! * [`header`] — strict header parsing/validation and reference-compatible serialisation.
//! * [`convert`] — bulk conversions from Spark's value types to every writable dtype.
//! * [`dataset`] — the dataset layout: file names, `dataset_manifest.json`, the tensor index;
//!   used by the write path, the read path and the Python package.
//! * [`file`] — writing files (temp file + rename) and reading them through a memory map.
//! * [`forensics`] — model-lake forensics: per-file and per-checkpoint reports (hashes, flags,
//!   model information from `__metadata__`).
//! * `jni` — the JNI bridge to the JVM connector (the only module using the `jni` crate); behind
//!   the default cargo feature `jni`, which the Python extension (`rust-core/python`) turns off.
//! * [`read`] — the Spark read path: dtype decoding and the per-sample, per-tensor and per-file
//!   row layouts as Arrow record batches.
//! * [`tensor_fn`] — the value rules of the SQL functions `arr_to_st` / `st_to_array`.
//! * [`write`] — the Spark write path: plan, per-task shard writers, manifest and index.

pub mod alloc_stats;
pub mod convert;
pub mod dataset;
pub mod dtype;
pub mod error;
pub mod file;
pub mod forensics;
pub mod header;
#[cfg(feature = "jni")]
pub mod jni;
pub mod read;
pub mod tensor_fn;
pub mod write;

pub use convert::ConvertError;
pub use dtype::Dtype;
pub use error::FormatError;

/// Version of this library; the JVM side refuses a native library whose version differs.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
