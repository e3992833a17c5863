//! The safetensors format, as this project writes and reads it (spec/format.md), with no Arrow,
//! Parquet, JNI or Python dependency: every other crate of the workspace builds on this one.
//!
//! * [`dtype`] — the one dtype table.
//! * [`header`] — strict header parsing/validation and reference-compatible serialisation.
//! * [`file`] — writing files (temp file + rename) and reading them through a memory map.
//! * [`convert`] — bulk conversions from Spark's value types to every writable dtype.
//! * [`forensics`] — model-lake forensics: per-file and per-checkpoint reports (hashes, flags,
//!   model information from `__metadata__`).
//! * [`alloc_stats`] — the counted global allocator: live native bytes for leak soaks, in every
//!   program that links this crate (the JVM's native library, the Python extension, the CLI).

pub mod alloc_stats;
pub mod convert;
pub mod dtype;
pub mod error;
pub mod file;
pub mod forensics;
pub mod header;
pub mod json_object;
pub mod progress;

pub use convert::ConvertError;
pub use dtype::Dtype;
pub use error::FormatError;

/// Version of this project's crates (one workspace version); the JVM side refuses a native
/// library whose version differs, and manifests and index parts record it as their writer.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
