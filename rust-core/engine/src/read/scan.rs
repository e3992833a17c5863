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
    TensorField, LAYOUT_METADATA_KEY,
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

mod catalog;
mod index_lookup;
mod planning;
mod schema;
mod spark_json;
mod wire;

use catalog::*;
pub use index_lookup::*;
pub use planning::*;
pub use schema::*;
pub use spark_json::*;
pub use wire::*;

#[cfg(test)]
pub(crate) mod tests;
