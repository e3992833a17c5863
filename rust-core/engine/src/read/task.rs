//! Executor side of a Spark read: runs one [`PartitionSpec`], unit by unit, batch by batch.
//!
//! The JVM drives it (JNI in `crate::jni::reader_api`):
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
    ColumnSource, Excluded, Layout, PartitionSpec, ShardChecksum, TensorAssumption, Unit, UnitPart,
};
use super::TensorSource;
use arrow_array::{ArrayRef, RecordBatch, RecordBatchOptions, StringArray};
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

/// A file's CRC-32C computed from its bytes in order: unit, CRC so far, bytes so far.
struct Verifying {
    unit: usize,
    crc: u32,
    bytes: u64,
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

/// SHA-256 of a file's bytes supplied in order.
struct StreamedDigest {
    hasher: Sha256,
    pos: u64,
    digest: Option<String>,
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

/// The whole file's SHA-256 (hex): a local file is read once more in fixed buffers (the
/// report's [`hash::hash_file`]); a remote one's was streamed through `supply`.
fn whole_file_digest(unit: &Unit, source: &Source) -> Result<String, ReadError> {
    match source {
        Source::Local(l) => hash::hash_file(l.file.path(), &[], unit.length)
            .map(|h| h.file)
            .map_err(|e| {
                ReadErrorKind::Invalid(format!("hashing the file: {e}")).in_file(&unit.file)
            }),
        Source::Remote(r) => r
            .whole
            .as_ref()
            .and_then(|d| d.digest.clone())
            .ok_or_else(|| {
                ReadErrorKind::NotSupplied {
                    start: r.whole.as_ref().map_or(0, |d| d.pos),
                    end: r.length,
                }
                .in_file(&unit.file)
            }),
    }
}

/// Absolute file bytes of `range` (relative to the tensor's first byte) of tensor `info`.
fn absolute(h: &Header, info: &TensorInfo, range: &Range<u64>) -> Range<u64> {
    let base = h.data_start() + info.data_offsets[0];
    base + range.start..base + range.end
}

/// Sorted, merged (overlapping or adjacent), non-empty ranges.
fn coalesce(mut ranges: Vec<Range<u64>>) -> Vec<Range<u64>> {
    ranges.retain(|r| r.start < r.end);
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// Largest gap between two needed ranges of a remote file that is read through rather than
/// skipped: one request of up to 1 MiB more costs less than a second request on an object store
/// (a GET's latency is that of transferring about 1 MiB on one connection), the distance other
/// engines merge at too (e.g. Trino's ORC/Parquet readers).
pub const REMOTE_GAP: u64 = 1 << 20;

/// Sorted, disjoint `ranges` with the gaps of at most `gap` bytes between neighbours read
/// through, smallest gaps first, as long as the bytes read through stay at most the bytes the
/// ranges hold: a batch never fetches more than twice what it needs (memory stays about one
/// batch), and a wide layout of small tensors is not read whole.
fn read_through_gaps(ranges: Vec<Range<u64>>, gap: u64) -> Vec<Range<u64>> {
    let mut budget = total(&ranges);
    let mut gaps: Vec<(u64, usize)> = ranges
        .windows(2)
        .enumerate()
        .map(|(i, w)| (w[1].start.saturating_sub(w[0].end), i))
        .filter(|&(g, _)| g <= gap)
        .collect();
    gaps.sort_unstable();
    let mut join = vec![false; ranges.len()];
    for (g, i) in gaps {
        if g > budget {
            break;
        }
        budget -= g;
        join[i] = true;
    }
    let mut out: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for (i, r) in ranges.into_iter().enumerate() {
        match out.last_mut() {
            Some(last) if i > 0 && join[i - 1] => last.end = r.end,
            _ => out.push(r),
        }
    }
    out
}

fn total(ranges: &[Range<u64>]) -> u64 {
    ranges.iter().map(|r| r.end - r.start).sum()
}

fn invalid(msg: String) -> ReadError {
    ReadErrorKind::Invalid(msg).in_scan()
}

/// Per-row (or per-item) cost against the 32-bit offset limit: lowers `*max` to the items
/// that fit; an error when one item alone does not fit.
fn fit(
    max: &mut u64,
    per_item: u64,
    what: &'static str,
    err: impl Fn(ReadErrorKind) -> ReadError,
) -> Result<(), ReadError> {
    if per_item > MAX_OFFSET {
        return Err(err(ReadErrorKind::TooLarge {
            what,
            count: per_item,
            limit: MAX_OFFSET,
        }));
    }
    if let Some(n) = MAX_OFFSET.checked_div(per_item) {
        *max = (*max).min(n);
    }
    Ok(())
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

    /// Whether unit `i`'s file must be checked whole against its manifest's CRC-32C before it
    /// is read (read option `verify_checksums`, a manifest entry with `crc32c`, not yet checked
    /// by this task). A local file is checked by [`ReadTask::open_local`]; a remote one is
    /// streamed whole through [`ReadTask::verify_update`], then [`ReadTask::verify_finish`].
    pub fn verify_needed(&self, i: usize) -> Result<bool, ReadError> {
        let file = &self.unit(i)?.file;
        Ok(self.spec.checksums.contains_key(file) && !self.verified.contains(file))
    }

    fn recorded(&self, i: usize) -> Result<(String, Option<&ShardChecksum>), ReadError> {
        let file = self.unit(i)?.file.clone();
        let want = self.spec.checksums.get(&file);
        Ok((file, want))
    }

    /// The next bytes of unit `i`'s whole file, in order from offset 0 (counted as read).
    pub fn verify_update(&mut self, i: usize, bytes: &[u8]) -> Result<(), ReadError> {
        let (file, want) = self.recorded(i)?;
        let Some(want) = want.cloned() else {
            return Err(invalid(format!("{file}: no CRC-32C to verify")));
        };
        let v = match self.verifying.take() {
            Some(v) if v.unit == i => v,
            _ => Verifying {
                unit: i,
                crc: 0,
                bytes: 0,
            },
        };
        let v = Verifying {
            unit: i,
            crc: crc32c_append(v.crc, bytes),
            bytes: v.bytes.saturating_add(bytes.len() as u64),
        };
        self.bytes_read = self.bytes_read.saturating_add(bytes.len() as u64);
        if v.bytes > want.bytes {
            return Err(ReadErrorKind::Checksum(format!(
                "the object has more than the {} bytes its manifest entry records",
                want.bytes
            ))
            .in_file(&file));
        }
        self.verifying = Some(v);
        Ok(())
    }

    /// Unit `i`'s whole file was given to [`ReadTask::verify_update`]: its size and CRC-32C
    /// must be the manifest's, else an error naming the file, both values and the option.
    pub fn verify_finish(&mut self, i: usize) -> Result<(), ReadError> {
        let (file, want) = self.recorded(i)?;
        let Some(want) = want.cloned() else {
            return Ok(());
        };
        let (crc, bytes) = match self.verifying.take() {
            Some(v) if v.unit == i => (v.crc, v.bytes),
            _ => (0, 0),
        };
        if bytes != want.bytes {
            return Err(ReadErrorKind::Checksum(format!(
                "the object has {bytes} bytes, its manifest entry records {}",
                want.bytes
            ))
            .in_file(&file));
        }
        let got = crc32c_hex(crc);
        if !got.eq_ignore_ascii_case(&want.crc32c) {
            return Err(ReadErrorKind::Checksum(format!(
                "CRC-32C {got}, its manifest entry records {}",
                want.crc32c
            ))
            .in_file(&file));
        }
        self.verified.insert(file);
        Ok(())
    }

    /// Checks a local file whole (see [`ReadTask::verify_needed`]).
    fn verify_local(&mut self, i: usize, path: &Path) -> Result<(), ReadError> {
        let file = self.unit(i)?.file.clone();
        let io = |e: std::io::Error| {
            ReadErrorKind::Checksum(format!("cannot read it to check its CRC-32C: {e}"))
                .in_file(&file)
        };
        let mut f = std::fs::File::open(path).map_err(io)?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io(e)),
            };
            self.verify_update(i, &buf[..n])?;
        }
        self.verify_finish(i)
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

    /// Opens unit `i` on a local file (read with positioned reads, batch by batch).
    pub fn open_local(&mut self, i: usize, path: &Path) -> Result<(), ReadError> {
        self.open = None;
        if self.verify_needed(i)? {
            self.verify_local(i, path)?;
        }
        let uri = self.unit(i)?.file.clone();
        let opened =
            SafetensorsFile::open(path).map_err(|e| ReadErrorKind::Format(e).in_file(&uri));
        self.finish_open(
            i,
            opened.map(|file| {
                Source::Local(Local {
                    file,
                    segments: BTreeMap::new(),
                })
            }),
        )
    }

    /// Opens unit `i` from its file's first `8 + N` bytes (prefix and header JSON).
    pub fn open_remote(&mut self, i: usize, prefix_and_header: &[u8]) -> Result<(), ReadError> {
        self.open = None;
        let unit = self.unit(i)?;
        let (uri, length) = (unit.file.clone(), unit.length);
        let fmt = |e| ReadErrorKind::Format(e).in_file(&uri);
        let parsed = header::check_prefix(prefix_and_header, length)
            .map_err(fmt)
            .and_then(|n| {
                let json = prefix_and_header
                    .get(PREFIX_LEN as usize..(PREFIX_LEN + n) as usize)
                    .ok_or_else(|| {
                        ReadErrorKind::Invalid(format!(
                            "{} bytes given, but the prefix and header are {} bytes",
                            prefix_and_header.len(),
                            PREFIX_LEN + n
                        ))
                        .in_file(&uri)
                    })?;
                header::parse_header(json, length).map_err(fmt)
            });
        self.finish_open(
            i,
            parsed.map(|header| {
                Source::Remote(Remote {
                    header,
                    length,
                    segments: BTreeMap::new(),
                    whole: None,
                })
            }),
        )
    }

    fn finish_open(
        &mut self,
        i: usize,
        source: Result<Source, ReadError>,
    ) -> Result<(), ReadError> {
        let source = match source {
            Ok(s) => s,
            Err(e) if self.spec.ignore_corrupt && matches!(e.kind, ReadErrorKind::Format(_)) => {
                self.skipped.push(Excluded {
                    file: e.file.clone(),
                    reason: e.to_string(),
                });
                self.open = Some(Open {
                    unit: i,
                    source: None,
                    cursor: 0,
                    end: 0,
                    pending: None,
                });
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let h = source.header();
        self.bytes_read += PREFIX_LEN + h.header_len;
        let (cursor, end) = self.check(self.unit(i)?, h)?;
        self.open = Some(Open {
            unit: i,
            source: Some(source),
            cursor,
            end,
            pending: None,
        });
        Ok(())
    }

    /// Compares the header with the plan's assumptions; returns the unit's cursor range.
    fn check(&self, unit: &Unit, h: &Header) -> Result<(u64, u64), ReadError> {
        let uri = unit.file.as_str();
        let changed = |msg: String| ReadErrorKind::Changed(msg).in_file(uri);
        if h.file_len() != unit.length {
            return Err(changed(format!(
                "it is {} bytes long, the plan listed {}",
                h.file_len(),
                unit.length
            )));
        }
        let ragged = ragged_columns(uri, h)?;
        let same = |t: &TensorAssumption| -> Result<(), ReadError> {
            if t.ragged.is_some() {
                // the values' length is the file's own; its offsets were checked with the rows
                let listed = ragged.contains(&t.name);
                return match h.tensor(&t.name) {
                    Some(a)
                        if listed && a.dtype == t.dtype && a.shape.get(1..) == t.shape.get(1..) =>
                    {
                        Ok(())
                    }
                    None => {
                        Err(ReadErrorKind::Changed("the tensor is missing".into()).at(uri, &t.name))
                    }
                    Some(a) => Err(ReadErrorKind::Changed(format!(
                        "the tensor is {} {:?}{}, the plan assumed a ragged column of {} with \
                         inner shape {:?}",
                        a.dtype,
                        a.shape,
                        if listed { "" } else { " and not ragged" },
                        t.dtype,
                        t.shape.get(1..).unwrap_or_default()
                    ))
                    .at(uri, &t.name)),
                };
            }
            match h.tensor(&t.name) {
                None => {
                    Err(ReadErrorKind::Changed("the tensor is missing".into()).at(uri, &t.name))
                }
                Some(a) if a.dtype != t.dtype || a.shape != t.shape => {
                    Err(ReadErrorKind::Changed(format!(
                        "the tensor is {} {:?}, the plan assumed {} {:?}",
                        a.dtype, a.shape, t.dtype, t.shape
                    ))
                    .at(uri, &t.name))
                }
                Some(_) => Ok(()),
            }
        };
        // Required tensors the plan assumed absent must still be absent.
        let absent = |tensors: &[TensorAssumption], names: &mut dyn Iterator<Item = &str>| {
            for name in names {
                if !tensors.iter().any(|t| t.name == name) && h.tensor(name).is_some() {
                    return Err(ReadErrorKind::Changed(
                        "the tensor exists but the plan found the file without it".into(),
                    )
                    .at(uri, name));
                }
            }
            Ok(())
        };
        let mismatch = || {
            invalid(format!(
                "unit of {uri} does not match the partition's {:?} layout",
                self.spec.layout
            ))
        };
        match (&unit.part, self.spec.layout) {
            (
                UnitPart::Sample {
                    start,
                    end,
                    samples,
                    padded_samples,
                    tensors,
                },
                Layout::Sample,
            ) => {
                let (s, p) = batch_samples(uri, h)?;
                if (s, p) != (*samples, *padded_samples) {
                    return Err(changed(format!(
                        "it has {s} samples and {p} padding rows, the plan assumed {samples} and {padded_samples}"
                    )));
                }
                if start > end || *end > s {
                    return Err(invalid(format!(
                        "unit rows [{start}, {end}) of {uri} are not within its {s} samples"
                    )));
                }
                tensors.iter().try_for_each(same)?;
                absent(
                    tensors,
                    &mut self
                        .spec
                        .columns
                        .iter()
                        .filter_map(|c| c.source.sample_target().map(|(t, _, _)| t)),
                )?;
                Ok((*start, *end))
            }
            (UnitPart::Tensors { tensors }, Layout::Tensor) => {
                tensors.iter().try_for_each(same)?;
                Ok((0, tensors.len() as u64))
            }
            (UnitPart::File { tensors }, Layout::File) => {
                tensors.iter().try_for_each(same)?;
                absent(
                    tensors,
                    &mut self.spec.columns.iter().filter_map(|c| match &c.source {
                        ColumnSource::Tensor { key, .. } => Some(key.as_str()),
                        _ => None,
                    }),
                )?;
                Ok((0, 1))
            }
            _ => Err(mismatch()),
        }
    }

    /// The next batch's extent and byte ranges (`None` when the unit is done).
    fn next_step(&self) -> Result<Option<Step>, ReadError> {
        let Some(open) = &self.open else {
            return Err(invalid("no unit is open".into()));
        };
        let Some(source) = &open.source else {
            return Ok(None);
        };
        if open.cursor >= open.end {
            return Ok(None);
        }
        let unit = self.unit(open.unit)?;
        let uri = unit.file.as_str();
        let h = source.header();
        let from = open.cursor;
        let batch_rows = self.spec.batch_rows.max(1);
        let mut ranges = Vec::new();
        let mut whole_file_digest = false;
        let mut offsets_only = false;
        let to = match self.spec.layout {
            Layout::Sample => {
                let mut max = batch_rows;
                let mut row_bytes = 0u64;
                let mut present = Vec::new();
                let mut ragged = Vec::new();
                for c in &self.spec.columns {
                    match &c.source {
                        ColumnSource::Sample { tensor, .. } => {
                            let Some(info) = h.tensor(tensor) else {
                                continue;
                            };
                            let at = |e: ReadErrorKind| e.at(uri, tensor);
                            if c.source.is_ragged() {
                                let name = ragged_offsets_name(tensor);
                                let offsets = h.tensor(&name).ok_or_else(|| {
                                    at(ReadErrorKind::RaggedOffsets(format!(
                                        "the offsets tensor `{name}` is missing"
                                    )))
                                })?;
                                ragged.push(offsets);
                                continue;
                            }
                            let rows = info.shape.first().copied().unwrap_or(0);
                            let one = row_byte_range(info, 0..rows.min(1)).map_err(at)?;
                            let bytes = one.end - one.start;
                            row_bytes = row_bytes.saturating_add(bytes);
                            let (_, target, _) = c
                                .source
                                .sample_target()
                                .ok_or_else(|| invalid(String::new()))?;
                            let per_row = match target {
                                SampleTarget::Bytes | SampleTarget::Text => bytes,
                                // The largest list level: rows · s1 · … · sj.
                                SampleTarget::Values(_) => {
                                    let mut p = 1u64;
                                    let mut m = 0u64;
                                    for &d in info.shape.iter().skip(1) {
                                        p = p.saturating_mul(d);
                                        m = m.max(p);
                                    }
                                    m
                                }
                            };
                            fit(&mut max, per_row, "list elements or bytes per sample", at)?;
                            present.push(info);
                        }
                        ColumnSource::File => {
                            fit(&mut max, uri.len() as u64, "file name bytes", |e| {
                                e.in_file(uri)
                            })?
                        }
                        ColumnSource::Metadata => {
                            fit(&mut max, metadata_size(h), "metadata bytes", |e| {
                                e.in_file(uri)
                            })?
                        }
                        _ => {}
                    }
                }
                if let Some(n) = self.spec.batch_bytes.checked_div(row_bytes) {
                    max = max.min(n.max(1));
                }
                let to = from.saturating_add(max).min(open.end);
                if ragged.is_empty() {
                    for info in present {
                        let r =
                            row_byte_range(info, from..to).map_err(|e| e.at(uri, &info.name))?;
                        ranges.push(absolute(h, info, &r));
                    }
                } else {
                    offsets_only = true;
                    for info in ragged {
                        for r in ragged_offsets_ranges(info, &(from..to)) {
                            ranges.push(absolute(h, info, &r));
                        }
                    }
                }
                to
            }
            Layout::Tensor => {
                let UnitPart::Tensors { tensors } = &unit.part else {
                    return Err(invalid(format!("unit of {uri} is not a per-tensor unit")));
                };
                let cols: Vec<TensorColumn> = self
                    .spec
                    .columns
                    .iter()
                    .filter_map(|c| c.source.tensor_column())
                    .collect();
                let has = |want: fn(&TensorColumn) -> bool| cols.iter().any(want);
                let (data, decoded) = (
                    has(|c| matches!(c, TensorColumn::Data)),
                    has(|c| matches!(c, TensorColumn::Decoded(_))),
                );
                let (file_col, key_col, dtype_col, meta_col) = (
                    has(|c| matches!(c, TensorColumn::File)),
                    has(|c| matches!(c, TensorColumn::Key)),
                    has(|c| matches!(c, TensorColumn::Dtype)),
                    has(|c| matches!(c, TensorColumn::Metadata)),
                );
                // The file's flags and model information repeat on every row: their text,
                // computed once per batch.
                let forensic_size =
                    if has(|c| matches!(c, TensorColumn::Flags(_) | TensorColumn::ModelInfo(_))) {
                        forensic_columns::text_size(
                            &forensic_columns::flags_of(h),
                            &forensic_columns::model_info_of(h),
                        )
                    } else {
                        0
                    };
                // Totals per 32-bit-offset column: data, decoded, file, key, dtype, shape,
                // metadata, flags and model information.
                let mut totals = [0u64; 8];
                let mut bytes = 0u64;
                let mut to = from;
                while to < open.end && to - from < batch_rows {
                    let name = tensors
                        .get(to as usize)
                        .map(|t| t.name.as_str())
                        .unwrap_or_default();
                    let info = h
                        .tensor(name)
                        .ok_or_else(|| ReadErrorKind::MissingTensor.at(uri, name))?;
                    let reads = cols.iter().any(|c| c.reads_data(info.dtype));
                    let costs = [
                        if data { info.byte_len() } else { 0 },
                        if decoded && super::spark_element(info.dtype).is_some() {
                            info.element_count()
                        } else {
                            0
                        },
                        if file_col { uri.len() as u64 } else { 0 },
                        if key_col { name.len() as u64 } else { 0 },
                        if dtype_col {
                            info.dtype.name().len() as u64
                        } else {
                            0
                        },
                        info.shape.len() as u64,
                        if meta_col { metadata_size(h) } else { 0 },
                        forensic_size,
                    ];
                    let mut one = u64::MAX;
                    for c in costs {
                        fit(&mut one, c, "bytes or elements", |e| e.at(uri, name))?;
                    }
                    let b = if reads { info.byte_len() } else { 0 };
                    let over_offsets = totals.iter().zip(costs).any(|(t, c)| t + c > MAX_OFFSET);
                    if to > from
                        && (over_offsets || bytes.saturating_add(b) > self.spec.batch_bytes)
                    {
                        break;
                    }
                    for (t, c) in totals.iter_mut().zip(costs) {
                        *t += c;
                    }
                    bytes = bytes.saturating_add(b);
                    if reads {
                        ranges.push(absolute(h, info, &(0..info.byte_len())));
                    }
                    to += 1;
                }
                to
            }
            Layout::File => {
                whole_file_digest = self
                    .spec
                    .columns
                    .iter()
                    .any(|c| c.source == ColumnSource::Sha256);
                for c in &self.spec.columns {
                    if let ColumnSource::Tensor { key, fields } = &c.source {
                        if let Some(info) = h.tensor(key) {
                            if fields.contains(&TensorField::Data) {
                                let mut one = u64::MAX;
                                fit(&mut one, info.byte_len(), "data bytes", |e| e.at(uri, key))?;
                                ranges.push(absolute(h, info, &(0..info.byte_len())));
                            }
                        }
                    }
                }
                from + 1
            }
        };
        Ok(Some(Step {
            from,
            to,
            ranges: coalesce(ranges),
            whole_file_digest,
            offsets_only,
        }))
    }

    /// Completes a step whose offsets are read ([`Step::offsets_only`]): validates the offsets
    /// of rows `from..to`, lowers `to` so that the batch keeps `batch_bytes` (at least one row)
    /// and Arrow's 32-bit offsets (a row alone beyond them is an error naming it), and adds the
    /// ranges of the fixed columns' rows and of the values those rows span. Returns the ranges
    /// added.
    fn resolve(&self, step: &mut Step) -> Result<Vec<Range<u64>>, ReadError> {
        let (Some(open), Ok(unit)) = (
            &self.open,
            self.unit(self.open.as_ref().map_or(0, |o| o.unit)),
        ) else {
            return Err(invalid("no unit is open".into()));
        };
        let Some(source) = &open.source else {
            return Ok(Vec::new());
        };
        let uri = unit.file.as_str();
        let h = source.header();
        let view = View {
            name: uri,
            source,
            reads: RefCell::new(Vec::new()),
        };
        let (from, provisional) = (step.from, step.to);
        let mut fixed = Vec::new();
        let mut fixed_row_bytes = 0u64;
        // per ragged column: values tensor, row offsets, per-row cost against the 32-bit offsets
        let mut ragged = Vec::new();
        for c in &self.spec.columns {
            let Some((tensor, target, _)) = c.source.sample_target() else {
                continue;
            };
            let Some(info) = h.tensor(tensor) else {
                continue;
            };
            if !c.source.is_ragged() {
                let one = row_byte_range(info, 0..1).map_err(|e| e.at(uri, tensor))?;
                fixed_row_bytes = fixed_row_bytes.saturating_add(one.end - one.start);
                fixed.push(info);
                continue;
            }
            let off = ragged_offsets(&view, tensor, from..provisional)?;
            let inner: u64 = info.shape.iter().skip(1).product();
            let element_bytes = info.dtype.checked_byte_len(inner).unwrap_or(0);
            let per_element = match target {
                SampleTarget::Values(_) => inner.max(1),
                SampleTarget::Bytes | SampleTarget::Text => element_bytes.max(1),
            };
            ragged.push((tensor, info, off, element_bytes, per_element, 0u64));
        }
        let mut to = from;
        let mut bytes = 0u64;
        while to < provisional {
            let i = (to - from) as usize;
            let mut row = fixed_row_bytes;
            let mut fits = true;
            for (tensor, _, off, element_bytes, per_element, count) in &ragged {
                let elements = off[i + 1] - off[i];
                row = row.saturating_add(elements.saturating_mul(*element_bytes));
                let items = elements.saturating_mul(*per_element);
                if items > MAX_OFFSET {
                    return Err(ReadErrorKind::TooLarge {
                        what: "list elements or bytes in one row",
                        count: items,
                        limit: MAX_OFFSET,
                    }
                    .at(uri, tensor));
                }
                fits &= count + items <= MAX_OFFSET;
            }
            if to > from && (!fits || bytes.saturating_add(row) > self.spec.batch_bytes) {
                break;
            }
            for (_, _, off, _, per_element, count) in &mut ragged {
                *count += (off[i + 1] - off[i]).saturating_mul(*per_element);
            }
            bytes = bytes.saturating_add(row);
            to += 1;
        }
        let mut added = Vec::new();
        for info in fixed {
            let r = row_byte_range(info, from..to).map_err(|e| e.at(uri, &info.name))?;
            added.push(absolute(h, info, &r));
        }
        for (tensor, info, off, ..) in &ragged {
            let r = ragged_values_range(info, &off[..=(to - from) as usize]).ok_or_else(|| {
                ReadErrorKind::Invalid(format!(
                    "rows of {} {:?} are not a whole number of bytes",
                    info.dtype, info.shape
                ))
                .at(uri, tensor)
            })?;
            added.push(absolute(h, info, &r));
        }
        let added = coalesce(added);
        step.to = to;
        step.offsets_only = false;
        step.ranges = coalesce(step.ranges.iter().cloned().chain(added.clone()).collect());
        Ok(added)
    }

    /// Absolute byte ranges of the current file the next batch needs (empty when none).
    ///
    /// With ragged columns a batch takes two rounds: first the offsets its rows need, then (once
    /// they are supplied) the values they span and the other columns' bytes; callers ask until
    /// the answer is empty.
    pub fn needed_ranges(&mut self) -> Result<Vec<Range<u64>>, ReadError> {
        let mut step = self.next_step_cached()?;
        let pending_offsets = self
            .open
            .as_ref()
            .and_then(|o| o.pending.as_ref())
            .is_some_and(|s| s.offsets_only);
        if let (
            true,
            Some(Open {
                source: Some(Source::Remote(r)),
                ..
            }),
        ) = (pending_offsets, &self.open)
        {
            let missing: Vec<Range<u64>> =
                step.iter().flatten().flat_map(|x| r.uncovered(x)).collect();
            if !missing.is_empty() {
                return Ok(read_through_gaps(missing, REMOTE_GAP));
            }
            let mut pending = self.open.as_mut().and_then(|o| o.pending.take());
            let resolved = match pending.as_mut() {
                Some(p) => self.resolve(p).map(|_| p.ranges.clone()),
                None => Ok(Vec::new()),
            };
            if let Some(open) = self.open.as_mut() {
                open.pending = pending;
            }
            step = Some(resolved?);
        }
        let Some(open) = &self.open else {
            return Ok(Vec::new());
        };
        let whole = open.pending.as_ref().is_some_and(|s| s.whole_file_digest);
        match (&open.source, step) {
            // the file's digest streams every byte once, in order; the batch's other columns
            // keep what they need of them (`supply`)
            (Some(Source::Remote(r)), Some(_)) if whole => Ok(match &r.whole {
                Some(d) if d.digest.is_some() => Vec::new(),
                Some(d) => std::iter::once(d.pos..r.length).collect(),
                None => std::iter::once(0..r.length).collect(),
            }),
            (Some(Source::Remote(r)), Some(ranges)) => Ok(read_through_gaps(
                ranges.iter().flat_map(|x| r.uncovered(x)).collect(),
                REMOTE_GAP,
            )),
            _ => Ok(Vec::new()),
        }
    }

    /// Computes (once) the pending step; returns its ranges.
    fn next_step_cached(&mut self) -> Result<Option<Vec<Range<u64>>>, ReadError> {
        let has_pending = self.open.as_ref().is_some_and(|o| o.pending.is_some());
        if !has_pending {
            let step = self.next_step()?;
            if let Some(open) = &mut self.open {
                open.pending = step;
            }
        }
        Ok(self
            .open
            .as_ref()
            .and_then(|o| o.pending.as_ref())
            .map(|s| s.ranges.clone()))
    }

    /// Bytes of the current file starting at absolute offset `start`.
    pub fn supply(&mut self, start: u64, bytes: Vec<u8>) -> Result<(), ReadError> {
        let uri = self
            .open
            .as_ref()
            .and_then(|o| self.spec.units.get(o.unit))
            .map(|u| u.file.clone())
            .unwrap_or_default();
        let Some(Open {
            source: Some(Source::Remote(r)),
            pending,
            ..
        }) = &mut self.open
        else {
            return Err(invalid("supply needs an open remote unit".into()));
        };
        let end = start.checked_add(bytes.len() as u64);
        if end.is_none_or(|e| e > r.length) {
            return Err(ReadErrorKind::Invalid(format!(
                "{} bytes supplied at offset {start} lie beyond the file's {} bytes",
                bytes.len(),
                r.length
            ))
            .in_file(&uri));
        }
        self.bytes_read += bytes.len() as u64;
        let end = start + bytes.len() as u64;
        let mut needed = true;
        if let Some(step) = pending.as_ref().filter(|s| s.whole_file_digest) {
            let d = r.whole.get_or_insert_with(|| StreamedDigest {
                hasher: Sha256::new(),
                pos: 0,
                digest: None,
            });
            if d.digest.is_none() {
                if start != d.pos {
                    return Err(ReadErrorKind::Invalid(format!(
                        "bytes supplied at offset {start}; the file's digest needs offset {} next",
                        d.pos
                    ))
                    .in_file(&uri));
                }
                d.hasher.update(&bytes);
                d.pos = end;
                if d.pos == r.length {
                    d.digest = Some(hash::hex(&std::mem::take(&mut d.hasher).finalize()));
                }
            }
            needed = step.ranges.iter().any(|x| x.start < end && start < x.end);
        }
        let keep = needed
            && r.segments
                .get(&start)
                .is_none_or(|old| old.len() < bytes.len());
        if keep {
            r.segments.insert(start, bytes);
        }
        Ok(())
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
            (UnitPart::Sample { .. }, Layout::Sample) => {
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
                        _ => return Err(not_for(&c.name)),
                    });
                }
                (n, arrays)
            }
            (UnitPart::Tensors { tensors }, Layout::Tensor) => {
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
            (UnitPart::File { .. }, Layout::File) => {
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
