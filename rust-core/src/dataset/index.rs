//! `_tensor_index.parquet` (spec/dataset.md §6): a directory holding one Parquet part per
//! manifest version, one row per tensor per shard, sorted by `file_name` then `data_start`.
//! Written uncompressed (the parquet crate is built without codecs) through a temporary sibling
//! and a rename.

use super::names::check_shard_path;
use crate::file::temp_sibling;
use crate::Dtype;
use arrow_array::builder::{Int64Builder, ListBuilder, StringBuilder};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::ChunkReader;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Rows per record batch / row group chunk when writing.
const BATCH_ROWS: usize = 64 * 1024;

/// One tensor of one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexRow {
    pub tensor_key: String,
    pub file_name: String,
    pub dtype: Dtype,
    /// Full shape (batch mode: with the batch dimension).
    pub shape: Vec<u64>,
    /// Absolute byte offsets `[data_start, data_end)` in the file.
    pub data_start: u64,
    pub data_end: u64,
    /// KV mode: the key. `None` in batch mode.
    pub sample_key: Option<String>,
    /// The column the tensor holds (batch mode: the tensor name).
    pub column: String,
}

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: parquet: {message}")]
    Parquet { path: PathBuf, message: String },
    #[error("{path}: not a tensor index: {problem}")]
    Invalid { path: PathBuf, problem: String },
    #[error("index row for tensor '{tensor}' of {file}: {problem}")]
    BadRow {
        tensor: String,
        file: String,
        problem: String,
    },
}

/// The index's Arrow schema (spec/dataset.md §6). Only `sample_key` is nullable.
pub fn index_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("tensor_key", DataType::Utf8, false),
        Field::new("file_name", DataType::Utf8, false),
        Field::new("dtype", DataType::Utf8, false),
        Field::new("shape", DataType::List(Arc::new(shape_item())), false),
        Field::new("data_start", DataType::Int64, false),
        Field::new("data_end", DataType::Int64, false),
        Field::new("sample_key", DataType::Utf8, true),
        Field::new("column", DataType::Utf8, false),
    ]))
}

fn shape_item() -> Field {
    Field::new("item", DataType::Int64, false)
}

fn to_i64(row: &IndexRow, what: &str, v: u64) -> Result<i64, IndexError> {
    i64::try_from(v).map_err(|_| IndexError::BadRow {
        tensor: row.tensor_key.clone(),
        file: row.file_name.clone(),
        problem: format!("{what} {v} does not fit in int64"),
    })
}

fn batch(schema: &SchemaRef, rows: &[IndexRow]) -> Result<RecordBatch, IndexError> {
    let mut key = StringBuilder::new();
    let mut file = StringBuilder::new();
    let mut dtype = StringBuilder::new();
    let mut shape = ListBuilder::new(Int64Builder::new()).with_field(Arc::new(shape_item()));
    let mut start = Int64Builder::new();
    let mut end = Int64Builder::new();
    let mut sample = StringBuilder::new();
    let mut column = StringBuilder::new();
    for r in rows {
        key.append_value(&r.tensor_key);
        file.append_value(&r.file_name);
        dtype.append_value(r.dtype.name());
        for d in &r.shape {
            shape.values().append_value(to_i64(r, "dimension", *d)?);
        }
        shape.append(true);
        start.append_value(to_i64(r, "data_start", r.data_start)?);
        end.append_value(to_i64(r, "data_end", r.data_end)?);
        sample.append_option(r.sample_key.as_deref());
        column.append_value(&r.column);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(key.finish()),
        Arc::new(file.finish()),
        Arc::new(dtype.finish()),
        Arc::new(shape.finish()),
        Arc::new(start.finish()),
        Arc::new(end.finish()),
        Arc::new(sample.finish()),
        Arc::new(column.finish()),
    ];
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| IndexError::BadRow {
        tensor: String::new(),
        file: String::new(),
        problem: e.to_string(),
    })
}

/// Writes the index at `path` (temporary sibling + rename), rows sorted by file name then
/// `data_start`. Returns the number of rows.
pub fn write_index(
    path: &Path,
    rows: impl IntoIterator<Item = IndexRow>,
) -> Result<u64, IndexError> {
    let mut rows: Vec<IndexRow> = rows.into_iter().collect();
    rows.sort_by(|a, b| {
        (a.file_name.as_bytes(), a.data_start).cmp(&(b.file_name.as_bytes(), b.data_start))
    });
    let tmp = temp_sibling(path);
    let result = write_to(&tmp, &rows).and_then(|()| {
        fs::rename(&tmp, path).map_err(|source| IndexError::Io {
            path: path.to_path_buf(),
            source,
        })
    });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map(|()| rows.len() as u64)
}

fn write_to(tmp: &Path, rows: &[IndexRow]) -> Result<(), IndexError> {
    let pq = |e: parquet::errors::ParquetError| IndexError::Parquet {
        path: tmp.to_path_buf(),
        message: e.to_string(),
    };
    let io = |source| IndexError::Io {
        path: tmp.to_path_buf(),
        source,
    };
    let schema = index_schema();
    let file = File::create(tmp).map_err(io)?;
    let props = WriterProperties::builder()
        .set_compression(Compression::UNCOMPRESSED)
        .set_created_by(format!("safetensors-spark {}", crate::VERSION))
        .build();
    let mut writer = ArrowWriter::try_new(file, schema.clone(), Some(props)).map_err(pq)?;
    for chunk in rows.chunks(BATCH_ROWS) {
        writer.write(&batch(&schema, chunk)?).map_err(pq)?;
    }
    let file = writer.into_inner().map_err(pq)?;
    file.sync_all().map_err(io)
}

/// Reads an index back (e.g. to merge the rows of an append). The columns must be exactly those
/// of [`index_schema`] (names and types; nullability is not compared).
pub fn read_index(path: &Path) -> Result<Vec<IndexRow>, IndexError> {
    let file = File::open(path).map_err(|source| IndexError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    read_index_from(file, path, |_| true)
}

/// The fields of one index row a [`read_index_from`] filter sees (before the row is built).
#[derive(Debug, Clone, Copy)]
pub struct IndexRowRef<'a> {
    pub tensor_key: &'a str,
    pub file_name: &'a str,
    pub dtype: &'a str,
}

/// Reads the rows of an index from any Parquet source (a `File`, or `bytes::Bytes` holding the
/// whole file), keeping those `keep` accepts; `keep` sees every row, in file order. `path`
/// names the index in errors. Columns as for [`read_index`].
pub fn read_index_from<R: ChunkReader + 'static>(
    reader: R,
    path: &Path,
    mut keep: impl FnMut(IndexRowRef<'_>) -> bool,
) -> Result<Vec<IndexRow>, IndexError> {
    let pq = |e: parquet::errors::ParquetError| IndexError::Parquet {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let invalid = |problem: String| IndexError::Invalid {
        path: path.to_path_buf(),
        problem,
    };
    let builder = ParquetRecordBatchReaderBuilder::try_new(reader).map_err(pq)?;
    let expected = index_schema();
    let found = builder.schema().clone();
    let same = found.fields().len() == expected.fields().len()
        && found
            .fields()
            .iter()
            .zip(expected.fields())
            .all(|(f, e)| f.name() == e.name() && types_match(f.data_type(), e.data_type()));
    if !same {
        return Err(invalid(format!("columns are {found}, expected {expected}")));
    }
    let reader = builder.build().map_err(pq)?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| invalid(e.to_string()))?;
        read_batch(&batch, &mut out, &mut keep).map_err(invalid)?;
    }
    Ok(out)
}

fn types_match(a: &DataType, b: &DataType) -> bool {
    match (a, b) {
        (DataType::List(x), DataType::List(y)) => x.data_type() == y.data_type(),
        _ => a == b,
    }
}

fn read_batch(
    b: &RecordBatch,
    out: &mut Vec<IndexRow>,
    keep: &mut impl FnMut(IndexRowRef<'_>) -> bool,
) -> Result<(), String> {
    let col = |i: usize| b.column(i);
    let key = col(0).as_string::<i32>();
    let file = col(1).as_string::<i32>();
    let dtype = col(2).as_string::<i32>();
    let shape = col(3).as_list::<i32>();
    let start = col(4).as_primitive::<Int64Type>();
    let end = col(5).as_primitive::<Int64Type>();
    let sample = col(6).as_string::<i32>();
    let column = col(7).as_string::<i32>();
    for (name, a) in [
        ("tensor_key", col(0)),
        ("file_name", col(1)),
        ("dtype", col(2)),
        ("shape", col(3)),
        ("data_start", col(4)),
        ("data_end", col(5)),
        ("column", col(7)),
    ] {
        if a.null_count() != 0 {
            return Err(format!("column {name} has nulls"));
        }
    }
    let to_u64 = |what: &str, v: i64| u64::try_from(v).map_err(|_| format!("negative {what} {v}"));
    for i in 0..b.num_rows() {
        let d = dtype.value(i);
        if !keep(IndexRowRef {
            tensor_key: key.value(i),
            file_name: file.value(i),
            dtype: d,
        }) {
            continue;
        }
        let dims = shape.value(i);
        let dims = dims.as_primitive::<Int64Type>();
        if dims.null_count() != 0 {
            return Err(format!("row {i}: null dimension"));
        }
        let file_name = file.value(i);
        check_shard_path(file_name).map_err(|e| format!("row {i}: {e}"))?;
        out.push(IndexRow {
            tensor_key: key.value(i).to_string(),
            file_name: file_name.to_string(),
            dtype: Dtype::from_name(d).ok_or_else(|| format!("row {i}: unknown dtype '{d}'"))?,
            shape: dims
                .values()
                .iter()
                .map(|v| to_u64("dimension", *v))
                .collect::<Result<_, _>>()?,
            data_start: to_u64("data_start", start.value(i))?,
            data_end: to_u64("data_end", end.value(i))?,
            sample_key: sample.is_valid(i).then(|| sample.value(i).to_string()),
            column: column.value(i).to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
