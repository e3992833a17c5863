//! The three row layouts as Arrow record batches.
//!
//! Common column types: `file`, `key`, `dtype` are Utf8; `shape` is `List<Int64>` (non-null
//! elements); `metadata` is `Map<Utf8, Utf8>` with Spark's field names (`entries`, `key`,
//! `value`), null when the file has no `__metadata__`. List child fields are named `element` and
//! are non-nullable (tensors have no nulls).

use super::arrow_types::{metadata_type, string_map_builder, MAX_OFFSET};
use super::decode::{decode_values, spark_element, widen};
use super::error::{ReadError, ReadErrorKind};
use super::forensic_columns::{
    flags_column, flags_of, flags_type, model_info_column, model_info_of, model_info_type,
};
use super::{tensor_bytes, TensorSource};
use arrow_array::builder::{BinaryBuilder, Int64Builder, ListBuilder, StringBuilder};
use arrow_array::cast::AsArray;
use arrow_array::{
    make_array, new_null_array, Array, ArrayRef, BinaryArray, Int64Array, ListArray, RecordBatch,
    StringArray, StructArray,
};
use arrow_buffer::{NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_data::transform::MutableArrayData;
use arrow_schema::{DataType, Field, FieldRef, Fields, Schema, SchemaRef};
use safetensors_spark_dataset::manifest::ragged_offsets_name;
use safetensors_spark_format::dtype::Dtype;
use safetensors_spark_format::forensics::flags::Flag;
use safetensors_spark_format::forensics::hash;
use safetensors_spark_format::forensics::metadata::ModelInfo;
use safetensors_spark_format::header::{Header, TensorInfo};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

mod file;
mod ragged;
mod sample;
mod tensor;

pub use file::*;
pub use ragged::*;
pub use sample::*;
pub use tensor::*;

// the shard `__metadata__` keys are the dataset crate's (`names`), one name each
pub use safetensors_spark_dataset::names::{
    LAYOUT_METADATA_KEY, PADDED_SAMPLES_METADATA_KEY, RAGGED_METADATA_KEY, SAMPLES_METADATA_KEY,
};

fn element_field(data_type: DataType) -> FieldRef {
    Arc::new(Field::new("element", data_type, false))
}

fn list_of(data_type: DataType) -> DataType {
    DataType::List(element_field(data_type))
}

/// The `shape` column's type: `List<Int64>` (non-null elements).
pub fn shape_type() -> DataType {
    list_of(DataType::Int64)
}

fn metadata_field() -> Field {
    Field::new("metadata", metadata_type(), true)
}

fn too_large(what: &'static str, count: u64) -> ReadErrorKind {
    ReadErrorKind::TooLarge {
        what,
        count,
        limit: MAX_OFFSET,
    }
}
