//! The per-task shard writer: receives wire-format record batches (see the `write` module docs),
//! validates every row, converts values and writes sealed shards into the task's work directory.
//!
//! ## Memory bounds
//! * **Batch mode**: the converted bytes of the shard being filled are held in memory, one
//!   buffer per column (`batch_size` × the row's converted size, summed over the columns), plus
//!   the Arrow batch the JVM handed over. A full shard is streamed to disk with
//!   [`FileWriter`] and its buffers are reused.
//! * **KV mode**: independent of the shard size, and nearly of the rows written. Rows are
//!   converted in chunks of at most [`KV_CHUNK_ROWS`] rows per column; everything the task has
//!   written (tensor bytes of the open shard, a record per row and per tensor, the keys, the
//!   sealed tensors for the report) goes to hidden scratch files in the work directory (`kv`
//!   module docs). In memory it keeps one 8-byte hash-map slot per row (duplicate detection is
//!   exact: hash hits are confirmed against the stored key) and fixed-size buffers. Sealing a
//!   shard sorts its tensors into the reference layout in memory (its keys plus a 32-byte entry
//!   per tensor, released after the seal), streams the header into the shard and copies the
//!   bytes from a read-only map of the spill file (page-cache pages, not the task's heap). The task report
//!   is serialised into a file at `finish`, one tensor at a time.
//!
//! ## Sealing
//! A full shard is written to a hidden temporary sibling and flushed on the task's thread; its
//! `fsync` and the rename onto its final name run on the writer's sealer thread ([`sealer`]
//! module docs) while the task fills the next shard. A shard is reported (returned by
//! [`TaskWriter::write_batch`] or [`TaskWriter::finish`]) only once it is in place: a call
//! returns the shards that came into place since the previous one, `finish` all the others.
//!
//! Row numbers in errors count from 0 within the partition, across batches.

mod encode;
mod kv;
mod sealer;

use crate::write::commit::index_rows;
use crate::write::{
    shard_file_name, ColumnReport, SealedTensor, ShardReport, TailStrategy, TaskReport, WriteMode,
    WritePlan,
};
use arrow_array::ffi::{FFI_ArrowArray, FFI_ArrowSchema};
use arrow_array::{Array, StructArray};
use arrow_schema::DataType;
use encode::{expected_type, type_matches, ColumnState};
use safetensors_spark_dataset::index::{write_index_part, write_index_part_streamed, IndexError};
use safetensors_spark_dataset::manifest::ragged_offsets_name;
use safetensors_spark_dataset::names::{self, shard_index_part_file_name, RAGGED_METADATA_KEY};
use safetensors_spark_format::convert::ConvertError;
use safetensors_spark_format::error::FormatError;
use safetensors_spark_format::file::{crc32c_hex, FileWriter, PendingFile};
use safetensors_spark_format::header::TensorEntry;
use safetensors_spark_format::Dtype;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// KV mode converts at most this many rows of a column at once.
pub const KV_CHUNK_ROWS: usize = 256;

/// Why a task cannot write its rows.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// A row's value is invalid (null, ragged, wrong shape or dtype, bad length, …).
    #[error("column '{column}', row {row}: {message}")]
    Row {
        column: String,
        row: u64,
        message: String,
    },
    /// A row's value cannot be converted to the column's dtype.
    #[error("column '{column}', row {row}: {source}")]
    Convert {
        column: String,
        row: u64,
        source: ConvertError,
    },
    /// The batch does not have the wire format the plan expects.
    #[error("column '{column}': malformed batch: {message}")]
    Malformed { column: String, message: String },
    /// The batch as a whole does not match the plan (child count, not a struct, …).
    #[error("malformed batch: {0}")]
    Batch(String),
    /// KV mode: a key occurs twice in the task with `duplicatesStrategy=fail`.
    #[error("column '{column}', row {row}: duplicate key '{key}' (first seen at row {first_row}); duplicatesStrategy=fail")]
    DuplicateKey {
        column: String,
        key: String,
        row: u64,
        first_row: u64,
    },
    /// KV mode: a tensor name is invalid or collides with another row's.
    #[error("column '{column}', row {row}: {message}")]
    TensorName {
        column: String,
        row: u64,
        message: String,
    },
    /// A shard could not be synced and renamed into place (reported by the call after the
    /// one that handed it to the sealer thread, at the latest by `finish`).
    #[error("shard '{file}' could not be sealed: {source}")]
    Seal { file: String, source: FormatError },
    /// The writer failed earlier and can only be aborted.
    #[error("the task writer failed earlier and can only be aborted")]
    Failed,
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl WriteError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        WriteError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// What [`TaskWriter::finish`] produced.
#[derive(Debug)]
pub struct Finished {
    /// Shards sealed or rewritten by `finish` itself (KV: without their tensors, which only the
    /// report file lists).
    pub sealed: Vec<ShardReport>,
    /// The index parts (spec/dataset.md §6.1) of every shard of the task: `(shard file name,
    /// part file name, part path in the work directory)`; staged and placed like the shards.
    pub index_parts: Vec<(String, String, PathBuf)>,
    /// The task report file: its name and its path in the work directory. It holds one
    /// [`TaskReport`] as JSON; [`read_report`] reads it back.
    pub report_file: String,
    pub report_path: PathBuf,
}

/// Reads a task report file written by [`TaskWriter::finish`].
pub fn read_report(path: &Path) -> Result<TaskReport, WriteError> {
    let file = fs::File::open(path).map_err(|e| WriteError::io(path, e))?;
    serde_json::from_reader(std::io::BufReader::new(file))
        .map_err(|e| WriteError::io(path, std::io::Error::other(e)))
}

/// Writes the task report file: `task` plus `shards` (KV shards without their tensors, which
/// their index parts list).
fn write_report(
    path: &Path,
    mut task: TaskReport,
    shards: Vec<ShardReport>,
) -> Result<(), WriteError> {
    let file = fs::File::create(path).map_err(|e| WriteError::io(path, e))?;
    let mut out = BufWriter::with_capacity(1 << 16, file);
    task.shards = shards;
    serde_json::to_writer(&mut out, &task)
        .map_err(|e| WriteError::io(path, std::io::Error::other(e)))?;
    out.flush().map_err(|e| WriteError::io(path, e))
}

/// Writes one partition's rows as shards (see the module docs).
pub struct TaskWriter {
    plan: WritePlan,
    partition: u32,
    work_dir: PathBuf,
    columns: Vec<ColumnState>,
    /// Rows received so far (the next row's number).
    rows_seen: u64,
    next_shard: u32,
    /// Sealed shards, in sealing order (KV rewrites replace their entry).
    shards: Vec<ShardReport>,
    /// Every shard file this writer created or handed to the sealer (for abort).
    created: Vec<PathBuf>,
    /// Syncs and renames full shards into place in the background.
    sealer: sealer::Sealer,
    failed: bool,
    mode: Mode,
}

enum Mode {
    Batch(BatchState),
    Kv(Box<kv::KvState>),
}

impl Mode {
    /// An empty stand-in left in `self.mode` while the real state is taken out to be worked on.
    fn placeholder() -> Mode {
        Mode::Batch(BatchState {
            batch_size: 1,
            tail: TailStrategy::Write,
            buffers: Vec::new(),
            offsets: Vec::new(),
            rows: 0,
        })
    }
}

struct BatchState {
    batch_size: u64,
    tail: TailStrategy,
    /// Converted bytes of the open shard, one buffer per column (a ragged column's: the
    /// values of its rows, concatenated).
    buffers: Vec<Vec<u8>>,
    /// Per column: `Some` for a ragged column, the open shard's row offsets (`rows + 1`
    /// entries from 0, spec/dataset.md §2.1).
    offsets: Vec<Option<Vec<i64>>>,
    rows: u64,
}

impl TaskWriter {
    /// Opens a writer for `partition`; shards are written into `work_dir` (created if missing).
    pub fn open(plan: WritePlan, partition: u32, work_dir: PathBuf) -> Result<Self, WriteError> {
        fs::create_dir_all(&work_dir).map_err(|e| WriteError::io(&work_dir, e))?;
        let batch = matches!(plan.mode, WriteMode::Batch { .. });
        let columns = plan
            .columns
            .iter()
            .map(|c| ColumnState::new(c.clone(), batch))
            .collect();
        let mode = match &plan.mode {
            WriteMode::Batch {
                batch_size,
                tail_strategy,
            } => {
                if *batch_size == 0 {
                    return Err(WriteError::Batch("batch_size must be at least 1".into()));
                }
                Mode::Batch(BatchState {
                    batch_size: *batch_size,
                    tail: *tail_strategy,
                    buffers: vec![Vec::new(); plan.columns.len()],
                    offsets: plan
                        .columns
                        .iter()
                        .map(|c| c.ragged.as_ref().map(|_| vec![0i64]))
                        .collect(),
                    rows: 0,
                })
            }
            WriteMode::Kv {
                name_col,
                kv_separator,
                target_shard_bytes,
                duplicates,
                ..
            } => Mode::Kv(Box::new(kv::KvState::new(
                name_col.clone(),
                kv_separator.clone(),
                *target_shard_bytes,
                *duplicates,
                &plan,
            ))),
        };
        let sealer = sealer::Sealer::new(partition, &work_dir);
        Ok(TaskWriter {
            plan,
            partition,
            work_dir,
            columns,
            rows_seen: 0,
            next_shard: 0,
            shards: Vec::new(),
            created: Vec::new(),
            sealer,
            failed: false,
            mode,
        })
    }

    /// Writes one wire-format batch. Returns the shards that came into place (synced and renamed
    /// onto their final names) since the previous call; a shard filled by this batch may come
    /// later (module docs).
    pub fn write_batch(&mut self, batch: &StructArray) -> Result<Vec<ShardReport>, WriteError> {
        if self.failed {
            return Err(WriteError::Failed);
        }
        let result = self.write_batch_inner(batch);
        if result.is_err() {
            self.failed = true;
        }
        result
    }

    /// Ends the partition: writes (or drops, or pads) the batch-mode tail, seals the last KV
    /// shard, waits until every shard is in place and applies `lastWin` to sealed KV shards, then
    /// writes the task report (every shard, every tensor) as a JSON file into the work
    /// directory. Returns the shards not reported yet and those rewritten now (each once), and
    /// that file.
    ///
    /// The report goes to a file, not into memory: a KV task's report has one entry per row and
    /// column, so building it (or its JSON) would hold several hundred bytes per row at once; it
    /// is serialised from the compact records one tensor at a time instead.
    ///
    /// On error every file this writer created is deleted, as by [`TaskWriter::abort`] (the
    /// writer is consumed, so it could not be aborted afterwards).
    pub fn finish(mut self) -> Result<Finished, WriteError> {
        let result = self.finish_inner();
        if result.is_err() {
            self.abort_files();
        }
        result
    }

    fn finish_inner(&mut self) -> Result<Finished, WriteError> {
        if self.failed {
            return Err(WriteError::Failed);
        }
        let mut rewritten = Vec::new();
        let mut dropped = 0;
        let mode = std::mem::replace(&mut self.mode, Mode::placeholder());
        match mode {
            Mode::Batch(mut b) => {
                if b.rows > 0 {
                    match b.tail {
                        TailStrategy::Write => {
                            let rows = b.rows;
                            self.seal_batch(&mut b, rows, 0)?;
                        }
                        TailStrategy::Drop => dropped = b.rows,
                        TailStrategy::Pad => {
                            let rows = b.rows;
                            let pad = b.batch_size - rows;
                            // A ragged column's padding rows are empty: its offsets repeat.
                            for off in b.offsets.iter_mut().flatten() {
                                let last = off.last().copied().unwrap_or(0);
                                let pad = usize::try_from(pad).map_err(|_| {
                                    WriteError::Batch("padding does not fit in memory".into())
                                })?;
                                off.resize(off.len() + pad, last);
                            }
                            for (buf, _) in b
                                .buffers
                                .iter_mut()
                                .zip(&b.offsets)
                                .filter(|(_, o)| o.is_none())
                            {
                                // Every row of a fixed-shape column has the same size.
                                let row_bytes = buf.len() as u64 / rows;
                                let extra = row_bytes
                                    .checked_mul(pad)
                                    .and_then(|b| usize::try_from(b).ok())
                                    .ok_or_else(|| {
                                        WriteError::Batch("padding does not fit in memory".into())
                                    })?;
                                buf.resize(buf.len() + extra, 0);
                            }
                            self.seal_batch(&mut b, rows, pad)?;
                        }
                    }
                }
            }
            Mode::Kv(mut k) => {
                let result = k.finish(self);
                self.mode = Mode::Kv(k);
                rewritten = result?;
            }
        }
        let mut sealed = self.sealer.finish()?;
        // `lastWin` may have rewritten (reported below) or deleted some of these.
        let current: HashSet<&str> = self.shards.iter().map(|s| s.file.as_str()).collect();
        let again: HashSet<&str> = rewritten.iter().map(|s| s.file.as_str()).collect();
        sealed.retain(|s| current.contains(s.file.as_str()) && !again.contains(s.file.as_str()));
        sealed.extend(rewritten);
        let columns = self.column_reports();
        let shards = std::mem::take(&mut self.shards);
        let task = TaskReport {
            partition: self.partition,
            shards: Vec::new(),
            dropped_samples: dropped,
            columns,
        };
        let report_file = format!(
            "task-{:05}-{}.report.json",
            self.partition, self.plan.write_id
        );
        let report_path = self.work_dir.join(&report_file);
        self.created.push(report_path.clone());
        let mut shards = shards;
        let index_parts = self.write_index_parts(&mut shards)?;
        write_report(&report_path, task, shards)?;
        Ok(Finished {
            sealed,
            index_parts,
            report_file,
            report_path,
        })
    }

    /// Writes the index part of every shard (spec/dataset.md §6.1) into the work directory: in KV
    /// mode always (the job commit checks keys across shards by merging them), in batch mode with
    /// `generate_index`. A KV shard's report then carries its tensor count instead of its
    /// tensors, so the task report holds O(shards). Returns `(file name, path)` of each part.
    fn write_index_parts(
        &mut self,
        shards: &mut [ShardReport],
    ) -> Result<Vec<(String, String, PathBuf)>, WriteError> {
        let kv = match &self.mode {
            Mode::Kv(k) => Some(&**k),
            Mode::Batch(_) => None,
        };
        if kv.is_none() && !self.plan.generate_index {
            return Ok(Vec::new());
        }
        let mut parts = Vec::with_capacity(shards.len());
        for s in shards.iter_mut() {
            let name = shard_index_part_file_name(&s.file).ok_or_else(|| {
                WriteError::Batch(format!("shard name {} has no index part", s.file))
            })?;
            let path = self.work_dir.join(&name);
            self.created.push(path.clone());
            let part_err =
                |e: IndexError| WriteError::io(&path, std::io::Error::other(e.to_string()));
            let n = match kv {
                // tensors stored in name order (one dtype): streamed, one row group in memory
                Some(k) if k.names_in_data_order(s.shard) => {
                    write_index_part_streamed(&path, k.index_row_iter(s.shard, &s.file)?)
                        .map_err(|e| e.map_or_else(|w| w, part_err))?
                }
                Some(k) => {
                    write_index_part(&path, k.index_rows(s.shard, &s.file)?).map_err(part_err)?
                }
                None => write_index_part(&path, index_rows(s)).map_err(part_err)?,
            };
            if kv.is_some() {
                s.num_tensors = Some(n);
            }
            parts.push((s.file.clone(), name, path));
        }
        Ok(parts)
    }

    /// Deletes every file this writer created in the work directory (sealed shards and
    /// temporaries).
    pub fn abort(mut self) {
        self.abort_files();
    }

    fn abort_files(&mut self) {
        // First stop the sealer thread: nothing is renamed into place after this.
        self.sealer.cancel();
        for path in std::mem::take(&mut self.created) {
            let _ = fs::remove_file(path);
        }
        if let Mode::Kv(k) = &mut self.mode {
            k.discard();
        }
    }

    fn write_batch_inner(&mut self, batch: &StructArray) -> Result<Vec<ShardReport>, WriteError> {
        let key_child = usize::from(matches!(self.mode, Mode::Kv(_)));
        let expected = self.columns.len() + key_child;
        if batch.num_columns() != expected {
            return Err(WriteError::Batch(format!(
                "expected {expected} children ({}{} columns), found {}",
                if key_child == 1 { "the key and " } else { "" },
                self.columns.len(),
                batch.num_columns()
            )));
        }
        if batch.null_count() > 0 {
            if let Some(i) = (0..batch.len()).find(|&i| batch.is_null(i)) {
                return Err(WriteError::Batch(format!(
                    "row {} is null as a whole",
                    self.rows_seen + i as u64
                )));
            }
        }
        for (c, col) in self.columns.iter().enumerate() {
            let child = batch.column(c + key_child);
            if !type_matches(&col.plan.input, child.data_type()) {
                return Err(WriteError::Malformed {
                    column: col.plan.name.clone(),
                    message: format!(
                        "expected Arrow type {}, found {:?}",
                        expected_type(&col.plan.input),
                        child.data_type()
                    ),
                });
            }
        }
        // An earlier shard's failure surfaces before more work is done.
        let mut sealed = self.take_sealed()?;
        let mut mode = std::mem::replace(&mut self.mode, Mode::placeholder());
        let result = match &mut mode {
            Mode::Batch(b) => self.batch_rows(b, batch),
            Mode::Kv(k) => {
                let keys = batch.column(0);
                if *keys.data_type() != DataType::Utf8 {
                    Err(WriteError::Malformed {
                        column: k.name_col().to_string(),
                        message: format!(
                            "expected Arrow type Utf8 for the key column, found {:?}",
                            keys.data_type()
                        ),
                    })
                } else {
                    k.write_rows(self, batch)
                }
            }
        };
        self.mode = mode;
        self.rows_seen += batch.len() as u64;
        result?;
        sealed.extend(self.take_sealed()?);
        Ok(sealed)
    }

    /// The shards in place to hand out now. KV `lastWin` hands out none before `finish`: `finish`
    /// may rewrite any sealed shard (a later row replaced one of its keys) and reads it from the
    /// work directory, which a shard handed out may already have left (the JVM uploads and
    /// deletes it when the destination is not local).
    fn take_sealed(&mut self) -> Result<Vec<ShardReport>, WriteError> {
        let held = matches!(&self.mode, Mode::Kv(k) if k.rewrites_sealed_shards());
        if held {
            self.sealer.poll()?;
            Ok(Vec::new())
        } else {
            self.sealer.take_ready()
        }
    }

    fn batch_rows(&mut self, b: &mut BatchState, batch: &StructArray) -> Result<(), WriteError> {
        let n = batch.len();
        let mut i = 0usize;
        while i < n {
            let room = usize::try_from(b.batch_size - b.rows).unwrap_or(usize::MAX);
            let take = room.min(n - i);
            for (c, col) in self.columns.iter_mut().enumerate() {
                let (Some(buf), Some(offsets)) = (b.buffers.get_mut(c), b.offsets.get_mut(c))
                else {
                    return Err(WriteError::Batch("column buffers out of sync".into()));
                };
                match offsets {
                    None => {
                        encode::extract(col, batch.column(c), i..i + take, self.rows_seen, buf)?;
                    }
                    Some(offsets) => encode::extract_ragged(
                        col,
                        batch.column(c),
                        i..i + take,
                        self.rows_seen,
                        buf,
                        offsets,
                    )?,
                }
            }
            b.rows += take as u64;
            i += take;
            if b.rows == b.batch_size {
                let rows = b.rows;
                self.seal_batch(b, rows, 0)?;
            }
        }
        Ok(())
    }

    /// Takes the next shard number and returns (number, file name, local path).
    fn next_shard_path(&mut self) -> (u32, String, PathBuf) {
        let shard = self.next_shard;
        self.next_shard += 1;
        let file = shard_file_name(self.partition, shard, &self.plan.write_id);
        let path = self.work_dir.join(&file);
        (shard, file, path)
    }

    /// Hands a complete shard to the sealer thread, which syncs it and renames it into place;
    /// its report reaches the caller of a later `write_batch` or of `finish`.
    fn seal_in_background(
        &mut self,
        file: PendingFile,
        report: ShardReport,
    ) -> Result<(), WriteError> {
        self.created.push(file.dest().to_path_buf());
        self.sealer.submit(file, report)
    }

    /// Writes the open shard and hands it to the sealer.
    fn seal_batch(&mut self, b: &mut BatchState, rows: u64, padded: u64) -> Result<(), WriteError> {
        let mut entries = Vec::with_capacity(self.columns.len());
        // tensor name → (column, whether it is the column's offsets tensor)
        let mut by_name = HashMap::with_capacity(self.columns.len());
        let mut offset_bytes: Vec<Vec<u8>> = vec![Vec::new(); self.columns.len()];
        for (c, col) in self.columns.iter().enumerate() {
            if let Some(Some(offsets)) = b.offsets.get(c) {
                let dtype = col.plan.dtype.ok_or_else(|| {
                    WriteError::Batch(format!("column '{}' has no dtype", col.plan.name))
                })?;
                let total = offsets.last().copied().unwrap_or(0);
                let mut shape = Vec::with_capacity(4);
                shape.push(u64::try_from(total).unwrap_or(0));
                shape.extend(col.inner_shape_or_zero());
                entries.push(TensorEntry {
                    name: col.plan.name.clone(),
                    dtype,
                    shape,
                });
                by_name.insert(col.plan.name.clone(), (c, false));
                let name = ragged_offsets_name(&col.plan.name);
                entries.push(TensorEntry {
                    name: name.clone(),
                    dtype: Dtype::I64,
                    shape: vec![offsets.len() as u64],
                });
                by_name.insert(name, (c, true));
                offset_bytes[c] = offsets.iter().flat_map(|v| v.to_le_bytes()).collect();
                continue;
            }
            let (Some(dtype), Some(sample)) = (col.dtype, col.shape.as_ref()) else {
                return Err(WriteError::Batch(format!(
                    "column '{}' has no dtype or shape yet",
                    col.plan.name
                )));
            };
            let mut shape = Vec::with_capacity(sample.len() + 1);
            shape.push(rows + padded);
            shape.extend_from_slice(sample);
            entries.push(TensorEntry {
                name: col.plan.name.clone(),
                dtype,
                shape,
            });
            by_name.insert(col.plan.name.clone(), (c, false));
        }
        let meta = shard_metadata(&self.plan, rows, padded);
        let (shard, file, path) = self.next_shard_path();
        let mut writer = FileWriter::create(&path, Some(&meta), entries)?;
        let order: Vec<(usize, bool)> = writer
            .tensors()
            .iter()
            .filter_map(|t| by_name.get(&t.name).copied())
            .collect();
        for (c, is_offsets) in order {
            let buf = if is_offsets {
                offset_bytes.get(c)
            } else {
                b.buffers.get(c)
            };
            if let Some(buf) = buf {
                writer.write(buf)?;
            }
        }
        let (written, pending) = writer.close()?;
        for buf in &mut b.buffers {
            buf.clear();
        }
        for off in b.offsets.iter_mut().flatten() {
            off.clear();
            off.push(0);
        }
        b.rows = 0;
        let report = ShardReport {
            file,
            local_path: path.to_string_lossy().into_owned(),
            partition: self.partition,
            shard,
            samples: rows,
            padded_samples: padded,
            bytes: written.bytes,
            crc32c: Some(crc32c_hex(written.crc32c)),
            tensors: SealedTensor::for_tensors(&written.tensors, written.data_start, |_| {
                (None, None)
            }),
            num_tensors: None,
        };
        self.shards.push(report.clone());
        self.seal_in_background(pending, report)
    }

    fn column_reports(&self) -> BTreeMap<String, ColumnReport> {
        let mut out = BTreeMap::new();
        let kv = matches!(self.mode, Mode::Kv(_));
        for (c, col) in self.columns.iter().enumerate() {
            let Some(dtype) = col.dtype else { continue };
            if let Some(inner) = &col.inner {
                out.insert(
                    col.plan.name.clone(),
                    ColumnReport {
                        dtype,
                        sample_shape: None,
                        inner_shape: Some(inner.clone()),
                    },
                );
                continue;
            }
            let sample_shape = if kv {
                let Mode::Kv(k) = &self.mode else { continue };
                let Some(shape) = k.column_shape(c as u32) else {
                    continue;
                };
                shape
            } else {
                match &col.shape {
                    Some(s) => Some(s.clone()),
                    None => continue,
                }
            };
            out.insert(
                col.plan.name.clone(),
                ColumnReport {
                    dtype,
                    sample_shape,
                    inner_shape: None,
                },
            );
        }
        out
    }
}

/// The shard `__metadata__`: user metadata plus the reserved keys of spec/dataset.md §4.
pub(crate) fn shard_metadata(
    plan: &WritePlan,
    samples: u64,
    padded: u64,
) -> BTreeMap<String, String> {
    let mut meta = plan.metadata.clone();
    let (mode, separator) = match &plan.mode {
        WriteMode::Batch { .. } => ("batch", None),
        WriteMode::Kv { kv_separator, .. } => ("kv", Some(kv_separator.clone())),
    };
    meta.insert(names::FORMAT_VERSION_METADATA_KEY.into(), "1".into());
    meta.insert(names::LAYOUT_METADATA_KEY.into(), mode.into());
    meta.insert(names::WRITE_ID_METADATA_KEY.into(), plan.write_id.clone());
    meta.insert(names::SAMPLES_METADATA_KEY.into(), samples.to_string());
    meta.insert(
        names::PADDED_SAMPLES_METADATA_KEY.into(),
        padded.to_string(),
    );
    if let Some(sep) = separator {
        meta.insert(names::KV_SEPARATOR_METADATA_KEY.into(), sep);
    }
    let ragged: Vec<&str> = plan
        .columns
        .iter()
        .filter(|c| c.ragged.is_some())
        .map(|c| c.name.as_str())
        .collect();
    if !ragged.is_empty() {
        meta.insert(
            RAGGED_METADATA_KEY.into(),
            serde_json::to_string(&ragged).unwrap_or_default(),
        );
    }
    meta
}

/// Imports a batch the JVM exported through the Arrow C Data Interface. Takes ownership of the
/// structs' contents (they are left released/empty); the producer's release callback fires when
/// the imported data is dropped. The data is fully validated (offsets, lengths, UTF-8) before it
/// is returned.
///
/// # Safety
/// `array` and `schema` must be null or point to valid, initialised C Data Interface structs that
/// describe the same array.
pub unsafe fn import_batch(
    array: *mut FFI_ArrowArray,
    schema: *mut FFI_ArrowSchema,
) -> Result<StructArray, WriteError> {
    if array.is_null() || schema.is_null() {
        return Err(WriteError::Batch(
            "null ArrowArray or ArrowSchema pointer".into(),
        ));
    }
    // SAFETY: both pointers are non-null and valid per the caller's contract; `from_raw` moves
    // the contents out and leaves released (empty) structs behind.
    let (array, schema) = unsafe {
        (
            FFI_ArrowArray::from_raw(array),
            FFI_ArrowSchema::from_raw(schema),
        )
    };
    // SAFETY: the caller guarantees the structs follow the C Data Interface.
    let data = unsafe { arrow_array::ffi::from_ffi(array, &schema) }
        .map_err(|e| WriteError::Batch(format!("cannot import the Arrow batch: {e}")))?;
    if !matches!(data.data_type(), DataType::Struct(_)) {
        return Err(WriteError::Batch(format!(
            "expected a Struct array, found {:?}",
            data.data_type()
        )));
    }
    data.validate_full()
        .map_err(|e| WriteError::Batch(format!("invalid Arrow batch: {e}")))?;
    Ok(StructArray::from(data))
}

#[cfg(test)]
mod tests;
