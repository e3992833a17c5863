//! Executor side of a Spark read: runs one [`PartitionSpec`], unit by unit, batch by batch.
//!
//! The JVM drives it (through the jni crate's `reader_api`, `NativeReader` on the Java side):
//!
//! ```text
//! task = ReadTask::new(spec)
//! for i in 0..task.unit_count():
//!     local file  → task.open_local(i, path)         (header validated vs the length)
//!     otherwise   → task.open_remote(i, prefix_and_header_bytes)
//!     loop:
//!         for r in task.needed_ranges():  task.supply(r.start, bytes of r)   (remote only)
//!         match task.next_batch(): Some(batch) → hand to Spark, None → unit done
//! ```
//!
//! * Every header rule is checked when a unit is opened, before any data byte is touched; the
//!   header must also agree with what the plan assumed (the tensors and row counts the unit
//!   names exist, with the planned dtypes/shapes), else an error naming the file says it
//!   changed since planning.
//! * `needed_ranges` returns the absolute, coalesced file byte ranges the *next* batch needs
//!   and that were not supplied yet (empty for a local file), gaps of at most [`REMOTE_GAP`]
//!   between them read through (within a budget, [`read_through_gaps`]); `supply` takes bytes
//!   starting at an absolute offset. Supplied bytes are dropped once their batch is built, so memory stays
//!   around one batch.
//! * Batches respect `batch_rows`, `batch_bytes` and Arrow's 32-bit offsets; a single tensor
//!   whose `data`/`decoded` value cannot fit one batch is an error naming it.
//! * Every batch has exactly the partition's output columns, in order, with the planned types
//!   (per-sample values widened to the column's element type; a tensor missing from a file →
//!   null rows; `_file` / `_metadata` / `file` / `metadata` as requested), and as many rows as
//!   the unit yields even with no columns (`count()`).
//! * A local file is never memory-mapped: `next_batch` reads the batch's coalesced ranges with
//!   positioned reads, each checked against the length the header was validated with, so a file
//!   truncated while it is read is an error naming it, not a SIGBUS that kills the JVM
//!   (spec/format.md §"Reading a file that changes").
//! * [`ReadTask::bytes_read`] counts header bytes plus data bytes actually read (the batch's
//!   ranges read, bytes supplied: on a remote file every byte fetched, gaps read through included) —
//!   the metric tests use to show pruning.

use super::arrow_types::MAX_OFFSET;
use super::error::{ReadError, ReadErrorKind};
use super::forensic_columns;
use super::rows::{
    batch_samples, file_columns, metadata_column, ragged_column, ragged_columns, ragged_offsets,
    ragged_offsets_ranges, ragged_values_range, row_byte_range, sample_column_as, tensor_columns,
    FileColumn, SampleTarget, TensorColumn, TensorField,
};
use super::scan::{
    ColumnSource, Excluded, PartitionSpec, RowLayout, ShardChecksum, TensorAssumption, Unit,
    UnitPart,
};
use super::TensorSource;
use arrow_array::{ArrayRef, Int64Array, RecordBatch, RecordBatchOptions, StringArray};
use arrow_schema::{Schema, SchemaRef};
use safetensors_spark_dataset::manifest::ragged_offsets_name;
use safetensors_spark_format::file::{crc32c_append, crc32c_hex, SafetensorsFile};
use safetensors_spark_format::forensics::hash;
use safetensors_spark_format::header::{self, Header, TensorInfo, PREFIX_LEN};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashSet};
use std::io::Read;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

mod open;
mod ranges;
mod verify;

pub use ranges::*;
use verify::*;

pub struct ReadTask {
    spec: PartitionSpec,
    schema: SchemaRef,
    open: Option<Open>,
    bytes_read: u64,
    skipped: Vec<Excluded>,
    /// The whole-file CRC-32C being computed (`verify_checksums`).
    verifying: Option<Verifying>,
    /// Files this task has verified (a shard split into several units is read whole once).
    verified: HashSet<String>,
}

/// The unit being read.
struct Open {
    unit: usize,
    /// `None`: the file was corrupt and `ignore_corrupt` is set; the unit yields nothing.
    source: Option<Source>,
    /// Next row (per sample), next tensor index (per tensor) or 0/1 (per file).
    cursor: u64,
    end: u64,
    /// The next batch, once `needed_ranges` computed it.
    pending: Option<Step>,
}

enum Source {
    Local(Local),
    Remote(Remote),
}

/// A local file, read with positioned reads: the current batch's ranges, read by `next_batch`.
struct Local {
    file: SafetensorsFile,
    segments: BTreeMap<u64, Vec<u8>>,
}

/// A file read through ranged reads: its header and the byte segments supplied so far.
struct Remote {
    header: Header,
    length: u64,
    segments: BTreeMap<u64, Vec<u8>>,
    /// The whole-file digest (`sha256` of the per-file layout), fed as bytes are supplied in
    /// order from offset 0; supplied bytes no other column needs are hashed and dropped.
    whole: Option<StreamedDigest>,
}

/// One batch's extent (`from..to` in the unit's cursor space) and the file bytes it reads.
struct Step {
    from: u64,
    to: u64,
    /// Bytes the batch's columns read (kept in memory until the batch is built).
    ranges: Vec<Range<u64>>,
    /// The batch needs the digest of the whole file (per-file `sha256`).
    whole_file_digest: bool,
    /// Per sample with ragged columns: `ranges` are the offsets the rows `from..to` need (`to`
    /// provisional); once they are read, [`ReadTask::resolve`] fixes `to` (the batch limits
    /// count each row's values) and adds the other columns' and the values' ranges.
    offsets_only: bool,
}

impl Source {
    fn header(&self) -> &Header {
        match self {
            Source::Local(l) => l.file.header(),
            Source::Remote(r) => &r.header,
        }
    }
}

/// Bytes `abs` (absolute offsets) out of the segments read or supplied for the current batch.
fn read_segments(
    segments: &BTreeMap<u64, Vec<u8>>,
    abs: Range<u64>,
) -> Result<Cow<'_, [u8]>, ReadErrorKind> {
    if abs.start >= abs.end {
        return Ok(Cow::Borrowed(&[]));
    }
    let missing = |start| ReadErrorKind::NotSupplied {
        start,
        end: abs.end,
    };
    if let Some((&s, b)) = segments.range(..=abs.start).next_back() {
        if s + b.len() as u64 >= abs.end {
            let (from, to) = ((abs.start - s) as usize, (abs.end - s) as usize);
            return b.get(from..to).map(Cow::Borrowed).ok_or(missing(abs.start));
        }
    }
    // Spread over several segments: assemble.
    let mut out = Vec::with_capacity((abs.end - abs.start) as usize);
    let mut pos = abs.start;
    for (&s, b) in segments.range(..abs.end) {
        let e = s + b.len() as u64;
        if e <= pos {
            continue;
        }
        if s > pos {
            break;
        }
        let to = e.min(abs.end);
        out.extend_from_slice(b.get((pos - s) as usize..(to - s) as usize).unwrap_or(&[]));
        pos = to;
        if pos >= abs.end {
            break;
        }
    }
    if pos < abs.end {
        return Err(missing(pos));
    }
    Ok(Cow::Owned(out))
}

impl Remote {
    fn read(&self, abs: Range<u64>) -> Result<Cow<'_, [u8]>, ReadErrorKind> {
        read_segments(&self.segments, abs)
    }

    /// The parts of `r` no supplied segment covers.
    fn uncovered(&self, r: &Range<u64>) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        let mut pos = r.start;
        for (&s, b) in self.segments.range(..r.end) {
            let e = s + b.len() as u64;
            if e <= pos {
                continue;
            }
            if s > pos {
                out.push(pos..s);
            }
            pos = e;
            if pos >= r.end {
                break;
            }
        }
        if pos < r.end {
            out.push(pos..r.end);
        }
        out
    }
}

/// The unit's file as a [`TensorSource`] named by its URI, recording every data range read.
struct View<'a> {
    name: &'a str,
    source: &'a Source,
    reads: RefCell<Vec<Range<u64>>>,
}

impl TensorSource for View<'_> {
    fn name(&self) -> Cow<'_, str> {
        Cow::Borrowed(self.name)
    }

    fn header(&self) -> &Header {
        self.source.header()
    }

    fn read(&self, info: &TensorInfo, range: Range<u64>) -> Result<Cow<'_, [u8]>, ReadError> {
        let abs = absolute(self.header(), info, &range);
        self.reads.borrow_mut().push(abs.clone());
        match self.source {
            Source::Local(l) => {
                read_segments(&l.segments, abs).map_err(|e| e.at(self.name, &info.name))
            }
            Source::Remote(r) => r.read(abs).map_err(|e| e.at(self.name, &info.name)),
        }
    }
}

/// Absolute file bytes of `range` (relative to the tensor's first byte) of tensor `info`.
fn absolute(h: &Header, info: &TensorInfo, range: &Range<u64>) -> Range<u64> {
    let base = h.data_start() + info.data_offsets[0];
    base + range.start..base + range.end
}

fn invalid(msg: String) -> ReadError {
    ReadErrorKind::Invalid(msg).in_scan()
}

fn metadata_size(h: &Header) -> u64 {
    h.metadata.as_ref().map_or(0, |m| {
        let bytes: u64 = m.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum();
        bytes.max(m.len() as u64)
    })
}

impl ReadTask {
    pub fn new(spec: PartitionSpec) -> Self {
        let fields: Vec<_> = spec.columns.iter().map(|c| c.arrow_field()).collect();
        ReadTask {
            schema: Arc::new(Schema::new(fields)),
            spec,
            open: None,
            bytes_read: 0,
            skipped: Vec::new(),
            verifying: None,
            verified: HashSet::new(),
        }
    }

    pub fn spec(&self) -> &PartitionSpec {
        &self.spec
    }

    /// The schema of every batch: the partition's columns, in order.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    pub fn unit_count(&self) -> usize {
        self.spec.units.len()
    }

    /// Units left out because their file was corrupt when opened (only with
    /// `ignore_corrupt`; without it that is the open's error).
    pub fn skipped(&self) -> &[Excluded] {
        &self.skipped
    }

    fn unit(&self, i: usize) -> Result<&Unit, ReadError> {
        self.spec.units.get(i).ok_or_else(|| {
            invalid(format!(
                "unit {i} does not exist (the partition has {})",
                self.spec.units.len()
            ))
        })
    }

    /// The next batch of the current unit, `None` when the unit is done.
    pub fn next_batch(&mut self) -> Result<Option<RecordBatch>, ReadError> {
        let step = match self.open.as_mut().and_then(|o| o.pending.take()) {
            Some(s) => Some(s),
            None => self.next_step()?,
        };
        let Some(step) = step else {
            return Ok(None);
        };
        let mut step = step;
        let mut local_read = 0u64;
        let read_local = |open: &mut Option<Open>, ranges: &[Range<u64>], units: &[Unit]| {
            if let Some(Open {
                unit,
                source: Some(Source::Local(l)),
                ..
            }) = open
            {
                let uri = units.get(*unit).map_or("", |u| u.file.as_str());
                for r in ranges {
                    let bytes = l
                        .file
                        .read_range(r.clone())
                        .map_err(|e| ReadErrorKind::Format(e).in_file(uri))?;
                    l.segments.insert(r.start, bytes);
                }
                return Ok::<u64, ReadError>(total(ranges));
            }
            Ok(0)
        };
        if let Some(Open {
            source: Some(Source::Local(l)),
            ..
        }) = &mut self.open
        {
            l.segments.clear();
        }
        local_read += read_local(&mut self.open, &step.ranges, &self.spec.units)?;
        if step.offsets_only {
            let added = self.resolve(&mut step)?;
            local_read += read_local(&mut self.open, &added, &self.spec.units)?;
        }
        let (batch, taken) = {
            let Some(Open {
                unit,
                source: Some(source),
                ..
            }) = &self.open
            else {
                return Ok(None);
            };
            let unit = self.unit(*unit)?;
            let digest = if step.whole_file_digest {
                Some(whole_file_digest(unit, source)?)
            } else {
                None
            };
            let view = View {
                name: &unit.file,
                source,
                reads: RefCell::new(Vec::new()),
            };
            let batch = self.build(unit, &view, &step, digest.as_deref())?;
            let taken = match source {
                // the digest of a local file read it all
                Source::Local(_) if digest.is_some() => unit.length,
                Source::Local(_) => local_read,
                Source::Remote(_) => 0, // counted when supplied
            };
            (batch, taken)
        };
        self.bytes_read += taken;
        if let Some(open) = &mut self.open {
            open.cursor = step.to;
            match &mut open.source {
                Some(Source::Remote(r)) => r.segments.clear(),
                Some(Source::Local(l)) => l.segments.clear(),
                None => {}
            }
        }
        Ok(Some(batch))
    }

    fn build(
        &self,
        unit: &Unit,
        view: &View<'_>,
        step: &Step,
        file_digest: Option<&str>,
    ) -> Result<RecordBatch, ReadError> {
        let uri = unit.file.as_str();
        let h = view.header();
        let not_for = |name: &str| {
            invalid(format!(
                "column `{name}` cannot be built in the {:?} layout",
                self.spec.layout
            ))
        };
        let (rows, arrays): (u64, Vec<ArrayRef>) = match (&unit.part, self.spec.layout) {
            (UnitPart::Sample { .. }, RowLayout::Sample) => {
                let n = step.to - step.from;
                let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.spec.columns.len());
                for c in &self.spec.columns {
                    arrays.push(match &c.source {
                        ColumnSource::Sample { .. } => {
                            let (tensor, target, rank) =
                                c.source.sample_target().ok_or_else(|| not_for(&c.name))?;
                            if c.source.is_ragged() {
                                ragged_column(view, tensor, step.from..step.to, rank, &target)?
                            } else {
                                sample_column_as(view, tensor, step.from..step.to, rank, &target)?
                            }
                        }
                        ColumnSource::File => Arc::new(StringArray::from_iter_values(
                            std::iter::repeat_n(uri, n as usize),
                        )),
                        ColumnSource::Metadata => {
                            metadata_column(std::iter::repeat_n(h.metadata.as_ref(), n as usize))
                                .map_err(|e| e.in_file(uri))?
                        }
                        ColumnSource::RowIndex => Arc::new(Int64Array::from_iter_values(
                            (step.from..step.to).map(|r| r as i64),
                        )),
                        ColumnSource::AddedVersion => {
                            let v = self.spec.added_versions.get(uri).map(|v| *v as i64);
                            Arc::new(Int64Array::from(vec![v; n as usize]))
                        }
                        _ => return Err(not_for(&c.name)),
                    });
                }
                (n, arrays)
            }
            (UnitPart::Tensors { tensors }, RowLayout::Tensor) => {
                let mut rows: Vec<(&dyn TensorSource, &TensorInfo)> = Vec::new();
                for t in tensors
                    .get(step.from as usize..step.to as usize)
                    .unwrap_or_default()
                {
                    let info = h
                        .tensor(&t.name)
                        .ok_or_else(|| ReadErrorKind::MissingTensor.at(uri, &t.name))?;
                    rows.push((view, info));
                }
                let cols = self
                    .spec
                    .columns
                    .iter()
                    .map(|c| c.source.tensor_column().ok_or_else(|| not_for(&c.name)))
                    .collect::<Result<Vec<_>, _>>()?;
                (rows.len() as u64, tensor_columns(&rows, &cols)?)
            }
            (UnitPart::File { .. }, RowLayout::File) => {
                let digests: Vec<String> = file_digest.map(str::to_owned).into_iter().collect();
                let cols = self
                    .spec
                    .columns
                    .iter()
                    .map(|c| match &c.source {
                        ColumnSource::File => Ok(FileColumn::File),
                        ColumnSource::Metadata => Ok(FileColumn::Metadata),
                        ColumnSource::Flags { fields } => Ok(FileColumn::Flags(fields)),
                        ColumnSource::ModelInfo { fields } => Ok(FileColumn::ModelInfo(fields)),
                        ColumnSource::Sha256 => Ok(FileColumn::Sha256(&digests)),
                        ColumnSource::Tensor { key, fields } => Ok(FileColumn::Tensor {
                            key,
                            fields: fields.as_slice(),
                        }),
                        _ => Err(not_for(&c.name)),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                (1, file_columns(&[view], &cols)?)
            }
            _ => return Err(invalid(format!("unit of {uri} does not match the layout"))),
        };
        let options = RecordBatchOptions::new().with_row_count(Some(rows as usize));
        RecordBatch::try_new_with_options(self.schema.clone(), arrays, &options)
            .map_err(|e| ReadErrorKind::from(e).in_file(uri))
    }

    /// Header and data bytes read so far by this task.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }
}

#[cfg(test)]
mod tests;
