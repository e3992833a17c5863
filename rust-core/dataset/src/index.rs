//! `_tensor_index.parquet` (spec/dataset.md §6): a directory holding one Parquet part per shard
//! (`<shard stem>.parquet`, [`super::names::shard_index_part_file_name`]), one row per tensor of that
//! shard, sorted by `tensor_key` (UTF-8 bytes), in row groups of [`PART_ROW_GROUP_ROWS`] rows with
//! min/max statistics, so a key lookup reads a part's footer and the row groups whose
//! `tensor_key` range can hold the key ([`row_groups_for_keys`]), and the commit checks KV keys
//! by streaming the sorted parts ([`KeyRun`]). Written uncompressed (the parquet crate is built
//! without codecs) through a temporary sibling and a rename.

use super::names::check_shard_path;
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
use safetensors_spark_format::file::temp_sibling;
use safetensors_spark_format::Dtype;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Rows per record batch / row group chunk when writing a whole-dataset index.
pub const BATCH_ROWS: usize = 64 * 1024;

/// Rows per row group (and record batch) of an index part: a lookup reads one row group of a
/// part per key (about 100 bytes a row), and the footer keeps one statistics entry per group.
pub const PART_ROW_GROUP_ROWS: usize = 8192;

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
    write_sorted(path, &rows, false)
}

/// Writes the index part of one shard at `path` (temporary sibling + rename; spec/dataset.md
/// §6.1): its rows sorted by `tensor_key` as UTF-8 bytes, row groups of [`PART_ROW_GROUP_ROWS`]
/// rows, min/max statistics on `tensor_key` and `sample_key` only (a small footer). Every row
/// must name the same `file_name`. Returns the number of rows.
pub fn write_index_part(
    path: &Path,
    rows: impl IntoIterator<Item = IndexRow>,
) -> Result<u64, IndexError> {
    let mut rows: Vec<IndexRow> = rows.into_iter().collect();
    if let Some(bad) = rows.iter().find(|r| r.file_name != rows[0].file_name) {
        return Err(IndexError::BadRow {
            tensor: bad.tensor_key.clone(),
            file: bad.file_name.clone(),
            problem: format!(
                "an index part holds one shard's rows, and this one also has rows of {}",
                rows[0].file_name
            ),
        });
    }
    rows.sort_by(|a, b| a.tensor_key.as_bytes().cmp(b.tensor_key.as_bytes()));
    if let Some(w) = rows.windows(2).find(|w| w[0].tensor_key == w[1].tensor_key) {
        return Err(IndexError::BadRow {
            tensor: w[0].tensor_key.clone(),
            file: w[0].file_name.clone(),
            problem: "two rows for the same tensor".to_string(),
        });
    }
    write_sorted(path, &rows, true)
}

fn write_sorted(path: &Path, rows: &[IndexRow], part: bool) -> Result<u64, IndexError> {
    let tmp = temp_sibling(path);
    let result = write_to(&tmp, rows, part).and_then(|()| {
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

fn write_to(tmp: &Path, rows: &[IndexRow], part: bool) -> Result<(), IndexError> {
    let mut w = SortedWriter::create(tmp, part)?;
    for chunk in rows.chunks(w.chunk_rows) {
        w.write(chunk)?;
    }
    w.finish()
}

/// A Parquet writer of index rows at a temporary path: row groups of [`PART_ROW_GROUP_ROWS`]
/// rows with key statistics for a part, else [`BATCH_ROWS`] per batch.
struct SortedWriter {
    tmp: PathBuf,
    schema: SchemaRef,
    writer: ArrowWriter<File>,
    chunk_rows: usize,
}

impl SortedWriter {
    fn create(tmp: &Path, part: bool) -> Result<Self, IndexError> {
        let pq = |e: parquet::errors::ParquetError| IndexError::Parquet {
            path: tmp.to_path_buf(),
            message: e.to_string(),
        };
        let schema = index_schema();
        let file = File::create(tmp).map_err(|source| IndexError::Io {
            path: tmp.to_path_buf(),
            source,
        })?;
        // Columns with a value per tensor (names, byte offsets) are written plain: a dictionary
        // of values that hardly repeat only costs hashing every value before Parquet falls back
        // to plain encoding anyway.
        let plain = |p: parquet::file::properties::WriterPropertiesBuilder, c: &str| {
            p.set_column_dictionary_enabled(parquet::schema::types::ColumnPath::from(c), false)
        };
        let props = ["tensor_key", "data_start", "data_end", "sample_key"]
            .into_iter()
            .fold(WriterProperties::builder(), plain)
            .set_compression(Compression::UNCOMPRESSED)
            .set_created_by(format!(
                "safetensors-spark {}",
                safetensors_spark_format::VERSION
            ));
        let (props, chunk_rows) = if part {
            use parquet::file::properties::EnabledStatistics;
            use parquet::schema::types::ColumnPath;
            let stats = |p: parquet::file::properties::WriterPropertiesBuilder, c: &str| {
                p.set_column_statistics_enabled(ColumnPath::from(c), EnabledStatistics::Chunk)
            };
            let p = props
                .set_statistics_enabled(EnabledStatistics::None)
                .set_max_row_group_row_count(Some(PART_ROW_GROUP_ROWS));
            (
                stats(stats(p, "tensor_key"), "sample_key"),
                PART_ROW_GROUP_ROWS,
            )
        } else {
            (props, BATCH_ROWS)
        };
        let writer = ArrowWriter::try_new(file, schema.clone(), Some(props.build())).map_err(pq)?;
        Ok(Self {
            tmp: tmp.to_path_buf(),
            schema,
            writer,
            chunk_rows,
        })
    }

    fn pq(&self, e: parquet::errors::ParquetError) -> IndexError {
        IndexError::Parquet {
            path: self.tmp.clone(),
            message: e.to_string(),
        }
    }

    fn write(&mut self, rows: &[IndexRow]) -> Result<(), IndexError> {
        let b = batch(&self.schema, rows)?;
        self.writer.write(&b).map_err(|e| self.pq(e))
    }

    fn finish(self) -> Result<(), IndexError> {
        let tmp = self.tmp.clone();
        let file = self.writer.into_inner().map_err(|e| IndexError::Parquet {
            path: tmp.clone(),
            message: e.to_string(),
        })?;
        file.sync_all()
            .map_err(|source| IndexError::Io { path: tmp, source })
    }
}

/// Writes the index part of one shard, as [`write_index_part`], from rows that already come in
/// `tensor_key` order (UTF-8 bytes, no name twice), holding one row group at a time: memory does
/// not grow with the shard's tensors. A row out of that order, or of another shard, is an error
/// (and nothing is left at `path`). `rows` may fail with an error of the caller's: it is returned
/// as `Err(Err(e))`.
pub fn write_index_part_streamed<E>(
    path: &Path,
    rows: impl IntoIterator<Item = Result<IndexRow, E>>,
) -> Result<u64, Result<IndexError, E>> {
    let tmp = temp_sibling(path);
    let result = (|| {
        let mut w = SortedWriter::create(&tmp, true).map_err(Ok)?;
        let mut buf: Vec<IndexRow> = Vec::with_capacity(w.chunk_rows);
        let mut last: Option<(String, String)> = None; // (file, key) of the previous row
        let mut n = 0u64;
        for row in rows {
            let row = row.map_err(Err)?;
            if let Some((file, key)) = &last {
                if row.file_name != *file {
                    return Err(Ok(IndexError::BadRow {
                        tensor: row.tensor_key.clone(),
                        file: row.file_name.clone(),
                        problem: format!(
                            "an index part holds one shard's rows, and this one also has rows of {file}"
                        ),
                    }));
                }
                if row.tensor_key.as_bytes() <= key.as_bytes() {
                    return Err(Ok(IndexError::BadRow {
                        tensor: row.tensor_key.clone(),
                        file: row.file_name.clone(),
                        problem: format!(
                            "rows must come sorted by tensor name, each name once (after {key})"
                        ),
                    }));
                }
            }
            last = Some((row.file_name.clone(), row.tensor_key.clone()));
            buf.push(row);
            n += 1;
            if buf.len() == w.chunk_rows {
                w.write(&buf).map_err(Ok)?;
                buf.clear();
            }
        }
        if !buf.is_empty() {
            w.write(&buf).map_err(Ok)?;
        }
        w.finish().map_err(Ok)?;
        fs::rename(&tmp, path).map_err(|source| {
            Ok(IndexError::Io {
                path: path.to_path_buf(),
                source,
            })
        })?;
        Ok(n)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
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
    let invalid = |problem: String| IndexError::Invalid {
        path: path.to_path_buf(),
        problem,
    };
    let builder = index_builder(reader, path)?;
    let reader = builder
        .with_batch_size(PART_ROW_GROUP_ROWS)
        .build()
        .map_err(|e| parquet_err(path, e))?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| invalid(e.to_string()))?;
        read_batch(&batch, &mut out, &mut keep).map_err(invalid)?;
    }
    Ok(out)
}

fn parquet_err(path: &Path, e: parquet::errors::ParquetError) -> IndexError {
    IndexError::Parquet {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Opens an index part and checks its columns are exactly those of [`index_schema`] (names and
/// types; nullability is not compared).
fn index_builder<R: ChunkReader + 'static>(
    reader: R,
    path: &Path,
) -> Result<ParquetRecordBatchReaderBuilder<R>, IndexError> {
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(reader).map_err(|e| parquet_err(path, e))?;
    let expected = index_schema();
    let found = builder.schema().clone();
    let same = found.fields().len() == expected.fields().len()
        && found
            .fields()
            .iter()
            .zip(expected.fields())
            .all(|(f, e)| f.name() == e.name() && types_match(f.data_type(), e.data_type()));
    if !same {
        return Err(IndexError::Invalid {
            path: path.to_path_buf(),
            problem: format!("columns are {found}, expected {expected}"),
        });
    }
    Ok(builder)
}

/// Which `tensor_key` values a lookup wants: exact names and/or prefixes (empty: any).
#[derive(Debug, Clone, Default)]
pub struct KeyFilter<'a> {
    pub exact: Vec<&'a str>,
    pub prefixes: Vec<&'a str>,
}

impl KeyFilter<'_> {
    /// The filter says nothing: every row group is needed.
    pub fn is_any(&self) -> bool {
        self.exact.is_empty() && self.prefixes.is_empty()
    }

    /// Some wanted name can lie in `[min, max]` (bytewise).
    fn may_hit(&self, min: &[u8], max: &[u8]) -> bool {
        self.exact
            .iter()
            .any(|k| min <= k.as_bytes() && k.as_bytes() <= max)
            || self.prefixes.iter().any(|p| {
                let p = p.as_bytes();
                // names starting with p lie in [p, p + 0xFF…]: overlaps [min, max] unless max < p
                // or min is beyond every name starting with p
                max >= p && (min <= p || min.starts_with(p))
            })
    }
}

/// Row groups of an index part (its footer `metadata`) whose `tensor_key` min/max statistics
/// can hold a name `filter` wants; a group without statistics is always read. All groups for
/// an empty filter.
pub fn row_groups_for_keys(
    metadata: &parquet::file::metadata::ParquetMetaData,
    filter: &KeyFilter<'_>,
) -> Vec<usize> {
    (0..metadata.num_row_groups())
        .filter(|&i| {
            if filter.is_any() {
                return true;
            }
            let stats = metadata.row_group(i).column(0).statistics();
            match stats {
                Some(parquet::file::statistics::Statistics::ByteArray(s)) => {
                    match (s.min_opt(), s.max_opt()) {
                        (Some(min), Some(max)) => filter.may_hit(min.data(), max.data()),
                        _ => true,
                    }
                }
                _ => true,
            }
        })
        .collect()
}

/// An index part read for a key lookup: its footer, then only the row groups
/// [`row_groups_for_keys`] selects. Returns the part's total row count and the rows of those
/// groups `keep` accepts.
pub fn lookup_index_part<R: ChunkReader + 'static>(
    reader: R,
    path: &Path,
    filter: &KeyFilter<'_>,
    keep: impl FnMut(IndexRowRef<'_>) -> bool,
) -> Result<(u64, Vec<IndexRow>), IndexError> {
    let builder = index_builder(reader, path)?;
    let total = u64::try_from(builder.metadata().file_metadata().num_rows()).unwrap_or(0);
    let groups = row_groups_for_keys(builder.metadata(), filter);
    let reader = builder
        .with_row_groups(groups)
        .with_batch_size(PART_ROW_GROUP_ROWS)
        .build()
        .map_err(|e| parquet_err(path, e))?;
    let mut keep = keep;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| IndexError::Invalid {
            path: path.to_path_buf(),
            problem: e.to_string(),
        })?;
        read_batch(&batch, &mut out, &mut keep).map_err(|problem| IndexError::Invalid {
            path: path.to_path_buf(),
            problem,
        })?;
    }
    Ok((total, out))
}

/// Byte ranges of an index part of `len` bytes that a caller fetched with ranged reads (e.g. the
/// JVM through Hadoop): a [`ChunkReader`] that fails on any byte it was not given.
#[derive(Debug, Clone, Default)]
pub struct SparseFile {
    len: u64,
    /// (start, bytes), sorted by start, not overlapping.
    chunks: Vec<(u64, bytes::Bytes)>,
}

impl SparseFile {
    pub fn new(len: u64) -> Self {
        SparseFile {
            len,
            chunks: Vec::new(),
        }
    }

    /// Adds the bytes `[start, start + bytes.len())` (ranges the file already has are kept).
    pub fn add(&mut self, start: u64, bytes: bytes::Bytes) {
        let end = start + bytes.len() as u64;
        if end > self.len || self.has(start, bytes.len() as u64) {
            return;
        }
        self.chunks.push((start, bytes));
        self.chunks.sort_by_key(|(s, _)| *s);
    }

    /// Total bytes held (what was fetched).
    pub fn bytes_held(&self) -> u64 {
        self.chunks.iter().map(|(_, b)| b.len() as u64).sum()
    }

    fn find(&self, start: u64, len: u64) -> Option<bytes::Bytes> {
        self.chunks.iter().find_map(|(s, b)| {
            let end = *s + b.len() as u64;
            (start >= *s && start + len <= end).then(|| {
                let from = (start - s) as usize;
                b.slice(from..from + len as usize)
            })
        })
    }

    fn has(&self, start: u64, len: u64) -> bool {
        self.find(start, len).is_some()
    }
}

impl parquet::file::reader::Length for SparseFile {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for SparseFile {
    type T = bytes::buf::Reader<bytes::Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        use bytes::Buf;
        let chunk = self
            .chunks
            .iter()
            .find(|(s, b)| start >= *s && start < *s + b.len() as u64)
            .ok_or_else(|| {
                parquet::errors::ParquetError::General(format!("byte {start} was not fetched"))
            })?;
        Ok(chunk.1.slice((start - chunk.0) as usize..).reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<bytes::Bytes> {
        self.find(start, length as u64).ok_or_else(|| {
            parquet::errors::ParquetError::General(format!(
                "bytes [{start}, {}) were not fetched",
                start + length as u64
            ))
        })
    }
}

/// The answer of [`lookup_sparse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SparseLookup {
    /// Fetch these `(start, length)` ranges, add them and ask again.
    NeedRanges(Vec<(u64, u64)>),
    /// The part's total row count and the rows `keep` accepted.
    Ready(u64, Vec<IndexRow>),
}

/// How many bytes at the end of a part to fetch first: most parts' footers fit.
pub const PART_TAIL_GUESS: u64 = 64 * 1024;

/// A key lookup in an index part of which the caller holds some byte ranges (`file`): asks for
/// the footer, then for the column chunks of the row groups [`row_groups_for_keys`] selects,
/// then reads them. Start with the last [`PART_TAIL_GUESS`] bytes (or the whole part).
pub fn lookup_sparse(
    file: &SparseFile,
    path: &Path,
    filter: &KeyFilter<'_>,
    keep: impl FnMut(IndexRowRef<'_>) -> bool,
) -> Result<SparseLookup, IndexError> {
    let invalid = |problem: String| IndexError::Invalid {
        path: path.to_path_buf(),
        problem,
    };
    let len = file.len;
    if len < 12 {
        return Err(invalid(format!("{len} bytes is too short for Parquet")));
    }
    let Some(tail) = file.find(len - 8, 8) else {
        return Ok(SparseLookup::NeedRanges(vec![(len - 8, 8)]));
    };
    if &tail[4..] != b"PAR1" {
        return Err(invalid("no Parquet footer magic".to_string()));
    }
    let footer = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    if footer + 12 > len {
        return Err(invalid(format!(
            "footer of {footer} bytes in a file of {len}"
        )));
    }
    if !file.has(len - 8 - footer, footer + 8) {
        return Ok(SparseLookup::NeedRanges(vec![(
            len - 8 - footer,
            footer + 8,
        )]));
    }
    let metadata = parquet::file::metadata::ParquetMetaDataReader::new()
        .parse_and_finish(file)
        .map_err(|e| parquet_err(path, e))?;
    let groups = row_groups_for_keys(&metadata, filter);
    let missing: Vec<(u64, u64)> = groups
        .iter()
        .flat_map(|&g| {
            metadata
                .row_group(g)
                .columns()
                .iter()
                .map(|c| c.byte_range())
        })
        .filter(|&(s, l)| !file.has(s, l))
        .collect();
    if !missing.is_empty() {
        return Ok(SparseLookup::NeedRanges(missing));
    }
    let (total, rows) = lookup_index_part(file.clone(), path, filter, keep)?;
    Ok(SparseLookup::Ready(total, rows))
}

/// A file read through [`ChunkReader`] that counts the bytes it hands out (a lookup's bytes read).
pub struct CountingFile {
    file: File,
    read: Arc<std::sync::atomic::AtomicU64>,
}

impl CountingFile {
    pub fn new(file: File) -> Self {
        CountingFile {
            file,
            read: Arc::default(),
        }
    }

    /// A handle on the count that outlives the reader.
    pub fn counter(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.read.clone()
    }
}

impl parquet::file::reader::Length for CountingFile {
    fn len(&self) -> u64 {
        self.file.len()
    }
}

impl ChunkReader for CountingFile {
    type T = <File as ChunkReader>::T;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        // a reader from `start` to the end: counted as it is handed out (parquet reads it to a
        // column chunk's end only when the caller asks for the chunk's bytes with get_bytes)
        self.file.get_read(start)
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<bytes::Bytes> {
        self.read
            .fetch_add(length as u64, std::sync::atomic::Ordering::Relaxed);
        self.file.get_bytes(start, length)
    }
}

/// The sorted `(tensor_key, sample_key)` sequence of one index part, read a record batch at a
/// time (two columns): one run of [`crate::write::commit::merge_key_runs`]. Fails on a part
/// whose names are not strictly increasing.
pub struct KeyRun {
    path: PathBuf,
    reader: parquet::arrow::arrow_reader::ParquetRecordBatchReader,
    batch: Option<(arrow_array::StringArray, arrow_array::StringArray)>,
    pos: usize,
    prev: Option<String>,
}

impl KeyRun {
    pub fn open(path: &Path) -> Result<Self, IndexError> {
        let file = File::open(path).map_err(|source| IndexError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let builder = index_builder(file, path)?;
        let mask = parquet::arrow::ProjectionMask::roots(builder.parquet_schema(), [0, 6]);
        let reader = builder
            .with_projection(mask)
            .with_batch_size(PART_ROW_GROUP_ROWS)
            .build()
            .map_err(|e| parquet_err(path, e))?;
        let mut run = KeyRun {
            path: path.to_path_buf(),
            reader,
            batch: None,
            pos: 0,
            prev: None,
        };
        run.fill()?;
        Ok(run)
    }

    fn invalid(&self, problem: String) -> IndexError {
        IndexError::Invalid {
            path: self.path.clone(),
            problem,
        }
    }

    /// Loads the next non-empty batch when the current one is used up.
    fn fill(&mut self) -> Result<(), IndexError> {
        while self.batch.as_ref().is_none_or(|(k, _)| self.pos >= k.len()) {
            self.batch = None;
            self.pos = 0;
            let Some(b) = self.reader.next() else {
                return Ok(());
            };
            let b = b.map_err(|e| self.invalid(e.to_string()))?;
            let key = b.column(0).as_string::<i32>().clone();
            let sample = b.column(1).as_string::<i32>().clone();
            if key.null_count() != 0 {
                return Err(self.invalid("column tensor_key has nulls".to_string()));
            }
            self.batch = Some((key, sample));
        }
        if let Some((k, _)) = &self.batch {
            let cur = k.value(self.pos);
            if let Some(p) = &self.prev {
                if p.as_bytes() >= cur.as_bytes() {
                    return Err(self.invalid(format!(
                        "rows are not sorted by tensor_key ('{p}' before '{cur}')"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The current `(tensor_key, sample_key)`, `None` at the end.
    pub fn current(&self) -> Option<(&str, Option<&str>)> {
        let (k, s) = self.batch.as_ref()?;
        Some((
            k.value(self.pos),
            s.is_valid(self.pos).then(|| s.value(self.pos)),
        ))
    }

    /// Moves to the next row.
    pub fn advance(&mut self) -> Result<(), IndexError> {
        if let Some((k, _)) = &self.batch {
            self.prev = Some(k.value(self.pos).to_string());
        }
        self.pos += 1;
        self.fill()
    }
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
