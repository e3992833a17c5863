//! The dataset format (spec/dataset.md): what a dataset directory holds and what its files mean,
//! shared by the write path, the read path and the Python package.
//!
//! * [`names`] — file names (shards, manifest, manifest log, index parts) and the trust rule for
//!   names read from a manifest or an index.
//! * [`manifest`] — `dataset_manifest.json`: the published fields and this connector's own, parse,
//!   validation, and the next manifest of a commit (append or overwrite).
//! * `index` — `_tensor_index.parquet`: its Arrow schema, writing and reading its parts. Behind
//!   the default cargo feature `index`, the only part of this crate that needs arrow and parquet;
//!   the Python extension, which reads the index with pyarrow, leaves it off. Its tests, which
//!   build index rows from the write path's reports, live in the engine crate.
//! * [`vacuum`] — retention and vacuum: which versions are retained, what a vacuum deletes;
//!   [`local`] runs it (and the commit protocol) on a local directory.
//! * [`compaction`] — merging small shards into full ones as one version, the same rows;
//!   [`compaction::local`] runs it on a local directory.
//! * [`log`] — `_manifest_log/`: delta entries, checkpoints, rebuilding a version, the chores
//!   after a commit (checkpoint, prune).
//! * [`commit`] — what a commit writes at the cost of its change: the base's head (own fields,
//!   shard count), the entry from the shards added and removed, when the chores list the log.
//! * [`versions`] — the versions in `_manifest_log/`: reading one by number or time, checking
//!   its shards (size, CRC-32C), the history, validating every version.
//! * [`own`] — the one rule for a local dataset's own files: its directories are never followed
//!   through a link, only its regular files are deleted, manifests and log entries are read
//!   through the regular-file rule with a size bound and trusted only when they agree with
//!   their names.
//! * [`kv`] — KV shards through their parsed header: tensor names split into key and column, and
//!   an index row checked against the header it describes (no arrow: every reader calls it).
//! * [`ragged`] — ragged columns of batch shards: the values and offsets tensors checked.
//! * [`progress`] — the observer the long local runs ([`versions::validate_dir`],
//!   [`local::vacuum_dir`], [`compaction::local::compact_path`]) tell how far they are; the
//!   CLI and the Python package plug in their own (a bar, log records).

pub mod commit;
pub mod compaction;
pub mod delete;
#[cfg(feature = "index")]
pub mod index;
pub mod kv;
pub mod local;
pub mod log;
pub mod manifest;
pub mod names;
pub mod own;
pub mod ragged;
pub mod vacuum;
pub mod versions;

pub use manifest::{
    parse_manifest, DatasetMode, Manifest, ManifestExt, ManifestShard, TailStrategy,
};
pub use names::check_shard_path;
/// The observer of long work (validation, vacuum, compaction), from the format crate.
pub use safetensors_spark_format::progress;

/// How many times a commit (a write's, a vacuum's, a compaction's, in every language) is tried on
/// top of a newer version committed meanwhile before it fails naming the count: enough for a
/// hundred writers racing for one version, a bound so that no commit retries forever.
pub const MAX_COMMIT_ATTEMPTS: usize = 100;

/// Why a manifest cannot be used, or a name from it cannot be trusted.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("invalid dataset manifest: {problem}")]
    InvalidManifest { problem: String },

    #[error("dataset manifest has format_version {found}; this version of safetensors-spark reads only format_version \"{}\"", manifest::FORMAT_VERSION)]
    UnsupportedVersion { found: String },

    #[error("'{name}' is not a shard file name: {problem}; a dataset lists plain file names of its own directory ending in .safetensors")]
    UnsafeShardPath { name: String, problem: &'static str },

    #[error("cannot append to the existing dataset: {problem}")]
    AppendMismatch { problem: String },

    /// A version that cannot be read as asked (spec/dataset.md §5.8): never committed, no
    /// longer kept, a time before the first commit, or a listed shard missing or changed.
    #[error("dataset version: {problem}")]
    Version { problem: String },

    /// A streaming micro-batch that cannot be committed (spec/dataset.md §5.7).
    #[error("streaming write: {problem}")]
    StreamBatch { problem: String },

    /// A vacuum that cannot run (spec/dataset.md §5.8.1).
    #[error("vacuum: {problem}")]
    Vacuum { problem: String },

    /// A compaction that cannot run or commit (spec/dataset.md §5.8.2).
    #[error("compaction: {problem}")]
    Compaction { problem: String },

    /// A delete that cannot run or commit (spec/dataset.md §5.11).
    #[error("delete: {problem}")]
    Delete { problem: String },
}
