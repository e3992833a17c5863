//! KV mode: one tensor per row and column, named `<key><separator><column>`, shards rolled over
//! at the target size.
//!
//! ## What a task keeps, and where
//! What a task has written lives in hidden scratch files of its work directory, deleted when
//! the task ends (finished or aborted):
//! * `spill`: the open shard's tensor bytes, in arrival order;
//! * `rows`: a 24-byte record per row the task has written (key position, hash chain, row
//!   number), in arrival order, across shards;
//! * `keys`: every row's key bytes, in arrival order;
//! * `tensors`: a 24-byte record per tensor of the open shard (spill range, shape, dtype);
//! * `reports`: the sealed shards' tensors as the task report needs them (key, column, shape,
//!   dtype, offsets in the shard), read back one at a time when the report is written.
//!
//! In memory, per row, there is one 8-byte slot of a hash map: 32-bit key hash → the latest
//! row with that hash. Rows with equal hashes are chained through their records on disk, and a
//! hash hit is confirmed by reading the earlier key back, so duplicate detection is exact.
//! Everything else held while writing is fixed-size (file buffers, the open shard's counters),
//! except the set of tensor names kept when two column names could make two keys' names
//! coincide (one column name is a proper suffix of another).
//!
//! Sealing sorts the open shard's tensors into the reference layout (dtype descending, then
//! name): for that it loads the shard's keys and a 32-byte entry per tensor, released once the
//! shard is written. The header is streamed into the shard (two passes over the sorted
//! entries), then the bytes are copied from the spill file.

use super::rows::{self, RowTensor};
use super::{shard_metadata, TaskWriter, WriteError, KV_CHUNK_ROWS};
use crate::write::{DuplicatesStrategy, ShardReport, TensorReport, WritePlan};
use arrow_array::cast::AsArray;
use arrow_array::{Array, StructArray};
use safetensors_spark_dataset::index::IndexRow;
use safetensors_spark_format::dtype::DTYPES;
use safetensors_spark_format::file::{copy_tensors, crc32c_hex, FileWriter};
use safetensors_spark_format::header::{self, HeaderEntry, MAX_HEADER_SIZE, METADATA_KEY};
use safetensors_spark_format::Dtype;
use std::cmp::Ordering;
use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

#[cfg(test)]
thread_local! {
    /// Tests: every key gets the same 32-bit hash, so each lookup walks one chain of all rows.
    pub(super) static ALL_KEYS_COLLIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// End of a hash chain of rows.
const NO_ROW: u32 = u32::MAX;
/// Buffer of each scratch file but the spill file.
const SCRATCH_BUFFER: usize = 1 << 16;
/// Buffer of the spill file.
const SPILL_BUFFER: usize = 1 << 18;
/// Buffer of the shard file being sealed (its data comes tensor by tensor from the spill's map).
const SEAL_BUFFER: usize = 1 << 18;

/// A hidden file of the task's work directory, appended to through a buffer and read back
/// through a handle of its own; deleted on drop.
struct Scratch {
    path: PathBuf,
    out: BufWriter<File>,
    /// A second open file description: reading moves its cursor, not the writer's.
    read: File,
    len: u64,
}

/// [`Scratch::map`]: the bytes of a scratch file, or none.
struct ScratchMap(Option<memmap2::Mmap>);

impl std::ops::Deref for ScratchMap {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0.as_deref().unwrap_or(&[])
    }
}

impl Scratch {
    fn create(path: PathBuf, buffer: usize) -> Result<Self, WriteError> {
        let file = File::options()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| WriteError::io(&path, e))?;
        let read = File::open(&path).map_err(|e| WriteError::io(&path, e))?;
        Ok(Scratch {
            out: BufWriter::with_capacity(buffer, file),
            read,
            path,
            len: 0,
        })
    }

    /// Appends `bytes`; returns where they start.
    fn append(&mut self, bytes: &[u8]) -> Result<u64, WriteError> {
        self.out
            .write_all(bytes)
            .map_err(|e| WriteError::io(&self.path, e))?;
        let at = self.len;
        self.len += bytes.len() as u64;
        Ok(at)
    }

    fn flush(&mut self) -> Result<(), WriteError> {
        self.out.flush().map_err(|e| WriteError::io(&self.path, e))
    }

    /// Fills `buf` from offset `at` (flushing what is buffered first), with one positioned
    /// read: the read handle's cursor does not move.
    fn read_at(&mut self, at: u64, buf: &mut [u8]) -> Result<(), WriteError> {
        self.flush()?;
        #[cfg(unix)]
        let read = std::os::unix::fs::FileExt::read_exact_at(&self.read, buf, at);
        #[cfg(not(unix))]
        let read = (&self.read)
            .seek(SeekFrom::Start(at))
            .and_then(|_| (&self.read).read_exact(buf));
        read.map_err(|e| WriteError::io(&self.path, e))
    }

    /// A read-only map of what was written (flushed first); empty when nothing was. Drop it
    /// before `clear`: the file is truncated there.
    fn map(&mut self) -> Result<ScratchMap, WriteError> {
        self.flush()?;
        if self.len == 0 {
            return Ok(ScratchMap(None));
        }
        // SAFETY: a read-only map of a hidden file of this task's own work directory, which
        // nothing else writes or truncates while the map lives (it is dropped before `clear`).
        let map =
            unsafe { memmap2::Mmap::map(&self.read) }.map_err(|e| WriteError::io(&self.path, e))?;
        Ok(ScratchMap(Some(map)))
    }

    /// A buffered reader of bytes `start..end`, of what was flushed.
    fn range(&self, start: u64, end: u64) -> Result<impl Read + '_, WriteError> {
        let mut f = &self.read;
        f.seek(SeekFrom::Start(start))
            .map_err(|e| WriteError::io(&self.path, e))?;
        Ok(BufReader::with_capacity(
            SCRATCH_BUFFER,
            f.take(end.saturating_sub(start)),
        ))
    }

    /// Empties the file for reuse.
    fn clear(&mut self) -> Result<(), WriteError> {
        let path = &self.path;
        self.out
            .flush()
            .and_then(|_| self.out.get_ref().set_len(0))
            .and_then(|_| self.out.seek(SeekFrom::Start(0)).map(|_| ()))
            .map_err(|e| WriteError::io(path, e))?;
        self.len = 0;
        Ok(())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// The task's scratch files (module docs), created with its first row.
struct Files {
    spill: Scratch,
    rows: Scratch,
    keys: Scratch,
    tensors: Scratch,
    reports: Scratch,
}

impl Files {
    fn create(w: &TaskWriter) -> Result<Self, WriteError> {
        let file = |what: &str, buffer| {
            let name = format!(".kv-{:05}-{}.{what}.tmp", w.partition, w.plan.write_id);
            Scratch::create(w.work_dir.join(name), buffer)
        };
        Ok(Files {
            spill: file("spill", SPILL_BUFFER)?,
            rows: file("rows", SCRATCH_BUFFER)?,
            keys: file("keys", SCRATCH_BUFFER)?,
            tensors: file("tensors", SCRATCH_BUFFER)?,
            reports: file("reports", SCRATCH_BUFFER)?,
        })
    }

    fn row(&mut self, id: u32) -> Result<RowRec, WriteError> {
        let mut b = [0u8; RowRec::LEN];
        self.rows
            .read_at(u64::from(id) * RowRec::LEN as u64, &mut b)?;
        Ok(RowRec::decode(&b))
    }

    /// The open shard's tensor record number `i`.
    fn tensor(&mut self, i: u64) -> Result<TensorRec, WriteError> {
        let mut b = [0u8; TensorRec::LEN];
        self.tensors.read_at(i * TensorRec::LEN as u64, &mut b)?;
        TensorRec::decode(&b).ok_or_else(|| WriteError::io(&self.tensors.path, corrupt()))
    }
}

fn corrupt() -> std::io::Error {
    std::io::Error::other("scratch record out of range")
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

fn dtype_of(code: u8) -> Option<Dtype> {
    DTYPES.get(usize::from(code)).map(|d| d.dtype)
}

/// A row the task has written (`rows` file).
struct RowRec {
    /// The key's bytes are `key_off..key_off + key_len` of the `keys` file.
    key_off: u64,
    key_len: u32,
    /// The previous row whose key has the same 32-bit hash ([`NO_ROW`]: none).
    next: u32,
    /// Partition row number.
    row: u64,
}

impl RowRec {
    const LEN: usize = 24;

    fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&self.key_off.to_le_bytes());
        b[8..12].copy_from_slice(&self.key_len.to_le_bytes());
        b[12..16].copy_from_slice(&self.next.to_le_bytes());
        b[16..24].copy_from_slice(&self.row.to_le_bytes());
        b
    }

    fn decode(b: &[u8; Self::LEN]) -> Self {
        RowRec {
            key_off: le_u64(b, 0),
            key_len: le_u32(b, 8),
            next: le_u32(b, 12),
            row: le_u64(b, 16),
        }
    }
}

/// A tensor of the open shard (`tensors` file): bytes `start..start + len` of the spill file.
#[derive(Clone, Copy)]
struct TensorRec {
    start: u64,
    len: u64,
    shape: u32,
    dtype: Dtype,
}

impl TensorRec {
    const LEN: usize = 24;

    fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&self.start.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..20].copy_from_slice(&self.shape.to_le_bytes());
        b[20] = self.dtype as u8;
        b
    }

    fn decode(b: &[u8; Self::LEN]) -> Option<Self> {
        Some(TensorRec {
            start: le_u64(b, 0),
            len: le_u64(b, 8),
            shape: le_u32(b, 16),
            dtype: dtype_of(b[20])?,
        })
    }
}

/// A sealed tensor as the task report needs it (`reports` file): fixed fields, then the key.
struct ReportRec {
    /// The task's row id (position in the `rows` file).
    row: u32,
    column: u32,
    shape: u32,
    dtype: Dtype,
    /// Absolute byte range in the shard file.
    start: u64,
    end: u64,
    key: String,
}

impl ReportRec {
    const FIXED: usize = 33;

    fn append(&self, out: &mut Scratch) -> Result<(), WriteError> {
        let mut b = [0u8; Self::FIXED];
        b[0..4].copy_from_slice(&self.row.to_le_bytes());
        b[4..8].copy_from_slice(&self.column.to_le_bytes());
        b[8..12].copy_from_slice(&self.shape.to_le_bytes());
        b[12..16].copy_from_slice(&(self.key.len() as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.start.to_le_bytes());
        b[24..32].copy_from_slice(&self.end.to_le_bytes());
        b[32] = self.dtype as u8;
        out.append(&b)?;
        out.append(self.key.as_bytes())?;
        Ok(())
    }

    /// The next record of `r` (reusing `self`'s key buffer), or `false` at the end.
    fn read_next(&mut self, r: &mut impl Read) -> std::io::Result<bool> {
        let mut b = [0u8; Self::FIXED];
        match r.read_exact(&mut b) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(false),
            Err(e) => return Err(e),
        }
        self.row = le_u32(&b, 0);
        self.column = le_u32(&b, 4);
        self.shape = le_u32(&b, 8);
        let key_len = le_u32(&b, 12) as usize;
        self.start = le_u64(&b, 16);
        self.end = le_u64(&b, 24);
        self.dtype = dtype_of(b[32]).ok_or_else(corrupt)?;
        let mut key = std::mem::take(&mut self.key).into_bytes();
        key.resize(key_len, 0);
        r.read_exact(&mut key)?;
        self.key = String::from_utf8(key).map_err(|_| corrupt())?;
        Ok(true)
    }

    fn empty() -> Self {
        ReportRec {
            row: 0,
            column: 0,
            shape: 0,
            dtype: Dtype::U8,
            start: 0,
            end: 0,
            key: String::new(),
        }
    }
}

/// Spreads an already random 32-bit hash over the 64 bits the hash map uses.
#[derive(Default)]
struct Spread(u64);

impl Hasher for Spread {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, x: u32) {
        self.0 = u64::from(x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Distinct per-sample shapes, each stored once and referred to by id.
#[derive(Default)]
struct Shapes {
    list: Vec<Vec<u64>>,
    index: HashMap<Vec<u64>, u32>,
}

impl Shapes {
    fn intern(&mut self, shape: &[u64]) -> Result<u32, WriteError> {
        // A task usually sees one shape per column: a scan of a few short lists beats hashing.
        if self.list.len() <= 8 {
            if let Some(id) = self.list.iter().position(|s| s.as_slice() == shape) {
                return Ok(id as u32);
            }
        } else if let Some(&id) = self.index.get(shape) {
            return Ok(id);
        }
        let id = u32::try_from(self.list.len())
            .map_err(|_| WriteError::Batch("too many distinct shapes in one task".into()))?;
        self.list.push(shape.to_vec());
        self.index.insert(shape.to_vec(), id);
        Ok(id)
    }

    fn get(&self, id: u32) -> &[u64] {
        self.list.get(id as usize).map_or(&[], Vec::as_slice)
    }
}

/// The name of a sealed tensor: `key + separator + column`.
fn tensor_name(columns: &[String], separator: &str, t: &ReportRec) -> String {
    let column = columns.get(t.column as usize).map_or("", String::as_str);
    format!("{}{separator}{column}", t.key)
}

/// A sealed shard: its first row, and its tensors' records in the `reports` file.
struct SealedShard {
    shard: u32,
    /// Row id of its first row (the rows of a shard are consecutive ids).
    first_row: u32,
    /// Byte range of its [`ReportRec`]s, in data order.
    reports: (u64, u64),
    tensors: u64,
    /// Its tensors are stored in strictly ascending name order (UTF-8 bytes), as when they all
    /// have one dtype (the reference layout orders by dtype, then name). Dropping tensors
    /// (`lastWin` rewrites) keeps it true.
    names_ascending: bool,
}

/// What the task knows of the open shard in memory; its records are in the scratch files.
#[derive(Default)]
struct OpenShard {
    /// Row id of its first row.
    first_row: u32,
    /// Where its first row's key starts in the `keys` file.
    keys_start: u64,
    /// `lastWin`: its rows replaced by a later row with the same key (bit per row, from
    /// `first_row`).
    dead: Vec<u64>,
    samples: u64,
    live_tensors: u64,
    /// Σ header-entry bytes (see [`entry_json_len`]) of the live tensors.
    json: u64,
    /// Σ byte length of the live tensors.
    data_len: u64,
}

impl OpenShard {
    fn is_dead(&self, local: u32) -> bool {
        self.dead
            .get(local as usize / 64)
            .is_some_and(|w| w >> (local % 64) & 1 == 1)
    }

    fn kill(&mut self, local: u32) {
        let word = local as usize / 64;
        if self.dead.len() <= word {
            self.dead.resize(word + 1, 0);
        }
        if let Some(w) = self.dead.get_mut(word) {
            *w |= 1 << (local % 64);
        }
    }
}

/// One tensor of the shard being sealed, as sorted into the layout.
struct SortEntry {
    start: u64,
    len: u64,
    /// Row within the shard (index of its key range).
    row: u32,
    column: u32,
    shape: u32,
    dtype: Dtype,
}

/// Compares the concatenations `a[0] + a[1] + a[2]` and `b[0] + b[1] + b[2]` bytewise, where the
/// middle parts (the separator) are equal.
fn cmp_names(a: [&[u8]; 3], b: [&[u8]; 3]) -> Ordering {
    let n = a[0].len().min(b[0].len());
    match a[0].get(..n).cmp(&b[0].get(..n)) {
        Ordering::Equal => {}
        o => return o,
    }
    if a[0].len() == b[0].len() {
        return a[2].cmp(b[2]);
    }
    a.iter()
        .flat_map(|p| p.iter())
        .cmp(b.iter().flat_map(|p| p.iter()))
}

pub(super) struct KvState {
    name_col: String,
    separator: String,
    /// The plan's column names (the tensor names' suffixes).
    columns: Vec<String>,
    target: u64,
    duplicates: DuplicatesStrategy,
    hasher: RandomState,
    /// 32-bit key hash → the latest row id with that hash (older ones chained on disk).
    index: HashMap<u32, u32, BuildHasherDefault<Spread>>,
    shapes: Shapes,
    /// Tensor names written so far; tracked only when two column names could make two keys'
    /// names coincide (one column name is a proper suffix of another).
    names: Option<HashSet<String>>,
    files: Option<Files>,
    /// Rows written so far (the next row id).
    rows: u32,
    open: OpenShard,
    /// The shards sealed so far, in sealing order.
    sealed: Vec<SealedShard>,
    /// `lastWin`: row ids to remove from already sealed shards at finish.
    removed: BTreeMap<u32, HashSet<u32>>,
    /// Per column, the shape id shared by all its sealed tensors (`Some(None)`: they differ);
    /// computed at finish.
    column_shapes: Vec<Option<Option<u32>>>,
    /// Header bytes of `__metadata__` with `samples` = 0 (one digit).
    meta_len: u64,
    /// Per column, the [`header::json_string_inner_len`] of the tensor names' suffix (separator + column).
    suffix_json: Vec<u64>,
}

/// Header bytes of one tensor entry without the offsets' digits; `name_json` is the name's
/// [`header::json_string_len`].
fn entry_json_len(name_json: u64, dtype: Dtype, shape: &[u64]) -> u64 {
    name_json + header::entry_len_without_name_and_offsets(dtype, shape)
}

impl KvState {
    pub(super) fn new(
        name_col: String,
        separator: String,
        target: u64,
        duplicates: DuplicatesStrategy,
        plan: &WritePlan,
    ) -> Self {
        let meta = shard_metadata(plan, 0, 0);
        let meta_len = header::metadata_entry_len(&meta);
        let columns: Vec<String> = plan.columns.iter().map(|c| c.name.clone()).collect();
        let collisions_possible = columns.iter().any(|a| {
            columns
                .iter()
                .any(|b| a.len() > b.len() && a.ends_with(b.as_str()))
        });
        let suffix_json = columns
            .iter()
            .map(|c| header::json_string_inner_len(&separator) + header::json_string_inner_len(c))
            .collect();
        KvState {
            suffix_json,
            name_col,
            separator,
            column_shapes: vec![None; columns.len()],
            columns,
            target,
            duplicates,
            hasher: RandomState::new(),
            index: HashMap::default(),
            shapes: Shapes::default(),
            names: collisions_possible.then(HashSet::new),
            files: None,
            rows: 0,
            open: OpenShard::default(),
            sealed: Vec::new(),
            removed: BTreeMap::new(),
            meta_len,
        }
    }

    /// `lastWin`: `finish` may rewrite shards sealed earlier.
    pub(super) fn rewrites_sealed_shards(&self) -> bool {
        self.duplicates == DuplicatesStrategy::LastWin
    }

    pub(super) fn name_col(&self) -> &str {
        &self.name_col
    }

    /// Deletes the scratch files, if any.
    pub(super) fn discard(&mut self) {
        self.files = None;
        self.open = OpenShard::default();
    }

    fn column_name(&self, column: u32) -> &str {
        self.columns.get(column as usize).map_or("", String::as_str)
    }

    /// Header bytes of a tensor's entry (see [`entry_json_len`]); `key_json` is the key's
    /// [`header::json_string_inner_len`].
    fn entry_json(&self, key_json: u64, column: u32, dtype: Dtype, shape: &[u64]) -> u64 {
        let suffix = self.suffix_json.get(column as usize).copied().unwrap_or(0);
        entry_json_len(2 + key_json + suffix, dtype, shape)
    }

    /// The report of a sealed tensor.
    fn tensor_report(&self, t: &ReportRec) -> TensorReport {
        let column = self.column_name(t.column);
        TensorReport {
            name: tensor_name(&self.columns, &self.separator, t),
            dtype: t.dtype,
            shape: self.shapes.get(t.shape).to_vec(),
            data_start: t.start,
            data_end: t.end,
            sample_key: Some(t.key.clone()),
            column: Some(column.to_string()),
        }
    }

    /// Upper bounds of the header length (prefix and padding included) and of the file size of
    /// the open shard plus `extra` tensors.
    fn estimate(
        &self,
        extra_tensors: u64,
        extra_json: u64,
        extra_data: u64,
        samples: u64,
    ) -> (u64, u64) {
        let n = self.open.live_tensors + extra_tensors;
        let data = self.open.data_len.saturating_add(extra_data);
        // prefix + braces + metadata and its comma + entries (each with a comma and two offsets
        // of at most header::decimal_len(data) digits) + padding.
        let header = (8 + 2 + self.meta_len + (header::decimal_len(samples) - 1) + 1 + 7)
            .saturating_add(self.open.json)
            .saturating_add(extra_json)
            .saturating_add(n.saturating_mul(1 + 2 * header::decimal_len(data)));
        (header, header.saturating_add(data))
    }

    pub(super) fn write_rows(
        &mut self,
        w: &mut TaskWriter,
        batch: &StructArray,
    ) -> Result<(), WriteError> {
        let keys = batch
            .column(0)
            .as_string_opt::<i32>()
            .ok_or_else(|| WriteError::Malformed {
                column: self.name_col.clone(),
                message: format!(
                    "expected Arrow type Utf8 for the key column, found {:?}",
                    batch.column(0).data_type()
                ),
            })?;
        let n = batch.len();
        let mut start = 0;
        let mut bufs: Vec<Vec<u8>> = vec![Vec::new(); w.columns.len()];
        while start < n {
            let end = n.min(start + KV_CHUNK_ROWS);
            if let Some(i) = (start..end).find(|&i| keys.is_null(i)) {
                return Err(WriteError::Row {
                    column: self.name_col.clone(),
                    row: w.rows_seen + i as u64,
                    message: "null key".into(),
                });
            }
            let mut tensors = Vec::with_capacity(w.columns.len());
            for ((c, col), buf) in w.columns.iter_mut().enumerate().zip(&mut bufs) {
                buf.clear();
                let t = rows::extract(col, batch.column(c + 1), start..end, w.rows_seen, buf)?;
                tensors.push(t);
            }
            let mut row_tensors = Vec::with_capacity(w.columns.len());
            for i in start..end {
                let row = w.rows_seen + i as u64;
                row_tensors.clear();
                for (t, buf) in tensors.iter().zip(&bufs) {
                    let rt: &RowTensor = t
                        .get(i - start)
                        .ok_or_else(|| WriteError::Batch("extracted rows out of sync".into()))?;
                    let bytes = buf
                        .get(rt.bytes.clone())
                        .ok_or_else(|| WriteError::Batch("extracted bytes out of sync".into()))?;
                    row_tensors.push((rt, bytes));
                }
                self.add_row(w, row, keys.value(i), &row_tensors)?;
            }
            start = end;
        }
        Ok(())
    }

    /// The row the task wrote last with key `key`, if any, with the key's 32-bit hash.
    fn find(&mut self, key: &str) -> Result<(u32, Option<(u32, RowRec)>), WriteError> {
        let h = self.hasher.hash_one(key);
        let hash = (h ^ (h >> 32)) as u32;
        #[cfg(test)]
        let hash = if ALL_KEYS_COLLIDE.with(|c| c.get()) {
            7
        } else {
            hash
        };
        let mut id = self.index.get(&hash).copied().unwrap_or(NO_ROW);
        let Some(files) = self.files.as_mut() else {
            return Ok((hash, None));
        };
        let mut stored = Vec::new();
        while id != NO_ROW {
            let rec = files.row(id)?;
            if rec.key_len as usize == key.len() {
                stored.resize(key.len(), 0);
                files.keys.read_at(rec.key_off, &mut stored)?;
                if stored == key.as_bytes() {
                    return Ok((hash, Some((id, rec))));
                }
            }
            id = rec.next;
        }
        Ok((hash, None))
    }

    /// The sealed shard holding row id `id`.
    fn shard_of(&self, id: u32) -> Option<u32> {
        let i = self.sealed.partition_point(|s| s.first_row <= id);
        i.checked_sub(1)
            .and_then(|i| self.sealed.get(i))
            .map(|s| s.shard)
    }

    /// `lastWin`: marks the open shard's row `id` (key `key`) as replaced.
    fn remove_open_row(&mut self, id: u32, key: &str) -> Result<(), WriteError> {
        let local = id - self.open.first_row;
        if self.open.is_dead(local) {
            return Ok(());
        }
        let count = self.columns.len() as u64;
        let key_json = header::json_string_inner_len(key);
        for c in 0..count {
            let files = self
                .files
                .as_mut()
                .ok_or_else(|| WriteError::Batch("scratch files missing".into()))?;
            let t = files.tensor(u64::from(local) * count + c)?;
            let json = self.entry_json(key_json, c as u32, t.dtype, self.shapes.get(t.shape));
            self.open.live_tensors -= 1;
            self.open.json -= json;
            self.open.data_len -= t.len;
        }
        self.open.kill(local);
        self.open.samples -= 1;
        Ok(())
    }

    /// Adds one row; seals the open shard first when the row would make it exceed the target.
    fn add_row(
        &mut self,
        w: &mut TaskWriter,
        row: u64,
        key: &str,
        tensors: &[(&RowTensor, &[u8])],
    ) -> Result<(), WriteError> {
        for name in &self.columns {
            if key.len() + self.separator.len() + name.len() == METADATA_KEY.len()
                && format!("{key}{}{name}", self.separator) == METADATA_KEY
            {
                return Err(WriteError::TensorName {
                    column: name.clone(),
                    row,
                    message: format!("tensor name '{METADATA_KEY}' (key '{key}') is reserved"),
                });
            }
        }
        // Names are built only when name collisions between keys are possible.
        let names: Option<Vec<String>> = self.names.as_ref().map(|_| {
            self.columns
                .iter()
                .map(|c| format!("{key}{}{c}", self.separator))
                .collect()
        });
        let (hash, existing) = self.find(key)?;
        if let Some((id, rec)) = existing {
            match self.duplicates {
                DuplicatesStrategy::Fail => {
                    return Err(WriteError::DuplicateKey {
                        column: self.name_col.clone(),
                        key: key.to_string(),
                        row,
                        first_row: rec.row,
                    })
                }
                DuplicatesStrategy::LastWin => {
                    if id >= self.open.first_row {
                        self.remove_open_row(id, key)?;
                    } else if let Some(shard) = self.shard_of(id) {
                        self.removed.entry(shard).or_default().insert(id);
                    }
                    if let (Some(set), Some(names)) = (&mut self.names, &names) {
                        for name in names {
                            set.remove(name);
                        }
                    }
                }
            }
        }
        if let (Some(set), Some(names)) = (&self.names, &names) {
            for (name, col) in names.iter().zip(&self.columns) {
                if set.contains(name) {
                    return Err(WriteError::TensorName {
                        column: col.clone(),
                        row,
                        message: format!(
                            "tensor name '{name}' (key '{key}') is also the name of a tensor of an earlier row with another key"
                        ),
                    });
                }
            }
        }
        let key_json = header::json_string_inner_len(key);
        let mut row_json = 0u64;
        let mut row_data = 0u64;
        for (c, (t, bytes)) in tensors.iter().enumerate() {
            row_json += self.entry_json(key_json, c as u32, t.dtype, &t.shape);
            row_data += bytes.len() as u64;
        }
        let count = tensors.len() as u64;
        let (header, file) = self.estimate(count, row_json, row_data, self.open.samples + 1);
        // The header limit of the format applies whatever the target size.
        if self.open.samples > 0 && (file > self.target || header > 8 + MAX_HEADER_SIZE) {
            self.seal(w)?;
        }
        if self.files.is_none() {
            self.files = Some(Files::create(w)?);
        }
        let files = self
            .files
            .as_mut()
            .ok_or_else(|| WriteError::Batch("scratch files missing".into()))?;
        let id = Some(self.rows)
            .filter(|&id| id != NO_ROW)
            .ok_or_else(|| WriteError::Batch("too many rows in one task".into()))?;
        let key_len = u32::try_from(key.len())
            .map_err(|_| WriteError::Batch("key longer than 4 GiB".into()))?;
        let key_off = files.keys.append(key.as_bytes())?;
        let next = self.index.insert(hash, id).unwrap_or(NO_ROW);
        files.rows.append(
            &RowRec {
                key_off,
                key_len,
                next,
                row,
            }
            .encode(),
        )?;
        for (t, bytes) in tensors {
            let start = files.spill.append(bytes)?;
            let rec = TensorRec {
                start,
                len: bytes.len() as u64,
                shape: self.shapes.intern(&t.shape)?,
                dtype: t.dtype,
            };
            files.tensors.append(&rec.encode())?;
        }
        self.rows += 1;
        self.open.live_tensors += count;
        self.open.data_len += row_data;
        self.open.json += row_json;
        if let (Some(set), Some(names)) = (&mut self.names, names) {
            set.extend(names);
        }
        self.open.samples += 1;
        Ok(())
    }

    /// Seals the open shard (if it has rows): sorts its tensors into the reference layout,
    /// streams the header into the shard, copies the bytes from the spill file, records the
    /// tensors for the task report, empties the spill and tensor files and hands the shard to
    /// the task's sealer (fsync and rename in the background).
    fn seal(&mut self, w: &mut TaskWriter) -> Result<(), WriteError> {
        let open = std::mem::take(&mut self.open);
        self.open = OpenShard {
            first_row: self.rows,
            keys_start: self.files.as_ref().map_or(0, |f| f.keys.len),
            ..OpenShard::default()
        };
        if open.samples == 0 {
            // No live row (none was added since the last seal): the open shard's files, indexed
            // from its first row, start over with the next one.
            if let Some(files) = self.files.as_mut() {
                files.spill.clear()?;
                files.tensors.clear()?;
            }
            return Ok(());
        }
        let files = self
            .files
            .as_mut()
            .ok_or_else(|| WriteError::Batch("scratch files missing".into()))?;
        files.rows.flush()?;
        files.tensors.flush()?;
        // The shard's keys, and each row's range in them.
        let mut keys = vec![
            0u8;
            usize::try_from(files.keys.len - open.keys_start).map_err(|_| {
                WriteError::Batch("shard keys do not fit in memory".into())
            })?
        ];
        files.keys.read_at(open.keys_start, &mut keys)?;
        let row_count = self.rows - open.first_row;
        let mut row_keys: Vec<(u32, u32)> = Vec::with_capacity(row_count as usize);
        {
            let mut r = files.rows.range(
                u64::from(open.first_row) * RowRec::LEN as u64,
                u64::from(self.rows) * RowRec::LEN as u64,
            )?;
            let mut b = [0u8; RowRec::LEN];
            for _ in 0..row_count {
                r.read_exact(&mut b)
                    .map_err(|e| WriteError::io(&files.rows.path, e))?;
                let rec = RowRec::decode(&b);
                let off = u32::try_from(rec.key_off - open.keys_start)
                    .map_err(|_| WriteError::Batch("shard keys exceed 4 GiB".into()))?;
                row_keys.push((off, rec.key_len));
            }
        }
        let columns = self.columns.len() as u32;
        let mut order: Vec<SortEntry> = Vec::with_capacity(open.live_tensors as usize);
        {
            let mut r = files.tensors.range(0, files.tensors.len)?;
            let mut b = [0u8; TensorRec::LEN];
            for row in 0..row_count {
                for column in 0..columns {
                    r.read_exact(&mut b)
                        .map_err(|e| WriteError::io(&files.tensors.path, e))?;
                    if open.is_dead(row) {
                        continue;
                    }
                    let t = TensorRec::decode(&b)
                        .ok_or_else(|| WriteError::io(&files.tensors.path, corrupt()))?;
                    order.push(SortEntry {
                        start: t.start,
                        len: t.len,
                        row,
                        column,
                        shape: t.shape,
                        dtype: t.dtype,
                    });
                }
            }
        }
        let key_of = |row: u32| -> &[u8] {
            row_keys
                .get(row as usize)
                .and_then(|&(off, len)| keys.get(off as usize..(off + len) as usize))
                .unwrap_or(&[])
        };
        let sep = self.separator.as_bytes();
        let column_names = &self.columns;
        let column_of = |c: u32| column_names.get(c as usize).map_or("", String::as_str);
        // The reference order (header::plan_file's): dtype descending, then name.
        order.sort_unstable_by(|a, b| {
            b.dtype.cmp(&a.dtype).then_with(|| {
                cmp_names(
                    [key_of(a.row), sep, column_of(a.column).as_bytes()],
                    [key_of(b.row), sep, column_of(b.column).as_bytes()],
                )
            })
        });
        let names_ascending = order.windows(2).all(|p| {
            cmp_names(
                [key_of(p[0].row), sep, column_of(p[0].column).as_bytes()],
                [key_of(p[1].row), sep, column_of(p[1].column).as_bytes()],
            ) == Ordering::Less
        });
        let meta = shard_metadata(&w.plan, open.samples, 0);
        let data_len: u64 = order.iter().map(|e| e.len).sum();
        let shapes = &self.shapes;
        let separator = self.separator.as_str();
        let entries = || {
            let mut cursor = 0u64;
            order.iter().map(move |e| {
                let begin = cursor;
                cursor += e.len;
                HeaderEntry {
                    name: [
                        std::str::from_utf8(key_of(e.row)).unwrap_or(""),
                        separator,
                        column_of(e.column),
                    ],
                    dtype: e.dtype,
                    shape: shapes.get(e.shape),
                    data_offsets: [begin, cursor],
                }
            })
        };
        let (shard, file, path) = w.next_shard_path();
        let mut writer = FileWriter::create_with_header(&path, data_len, SEAL_BUFFER, |out, p| {
            header::write_entries(out, p, Some(&meta), entries)
        })?;
        files.spill.flush()?;
        // The tensors are copied from a read-only map of the spill file in layout order: rows
        // arrive in any key order, so the layout visits the spill at scattered offsets (one
        // positioned read per tensor cost a system call per tensor, 3 per row of the epoch
        // benchmark; jvm-connector/bench/HISTORY.md §10.8). A map costs a page fault per few pages instead.
        let spill = files.spill.map()?;
        for e in &order {
            let bytes = usize::try_from(e.start)
                .ok()
                .zip(usize::try_from(e.start + e.len).ok())
                .and_then(|(a, b)| spill.get(a..b))
                .ok_or_else(|| {
                    WriteError::Batch(format!(
                        "spill file {} is {} bytes, a tensor is recorded at {}..{}",
                        files.spill.path.display(),
                        spill.len(),
                        e.start,
                        e.start + e.len
                    ))
                })?;
            writer.write(bytes)?;
        }
        drop(spill);
        let (written, pending) = writer.close()?;
        // The tensors for the task report, with their absolute offsets in the shard.
        let reports_start = files.reports.len;
        let mut at = written.data_start;
        let mut rec = ReportRec::empty();
        for e in &order {
            rec.row = open.first_row + e.row;
            rec.column = e.column;
            rec.shape = e.shape;
            rec.dtype = e.dtype;
            rec.start = at;
            rec.end = at + e.len;
            rec.key.clear();
            rec.key
                .push_str(std::str::from_utf8(key_of(e.row)).unwrap_or(""));
            rec.append(&mut files.reports)?;
            at += e.len;
        }
        let tensors = order.len() as u64;
        drop(order);
        drop(row_keys);
        drop(keys);
        files.spill.clear()?;
        files.tensors.clear()?;
        self.sealed.push(SealedShard {
            shard,
            first_row: open.first_row,
            reports: (reports_start, files.reports.len),
            tensors,
            names_ascending,
        });
        // Without its tensors: its index part lists them ([`KvState::index_rows`]).
        let report = ShardReport {
            file,
            local_path: path.to_string_lossy().into_owned(),
            partition: w.partition,
            shard,
            samples: open.samples,
            padded_samples: 0,
            bytes: written.bytes,
            crc32c: Some(crc32c_hex(written.crc32c)),
            tensors: Vec::new(),
            num_tensors: None,
        };
        w.shards.push(report.clone());
        w.seal_in_background(pending, report)
    }

    /// Seals the last shard, rewrites sealed shards that lost keys to `lastWin` and prepares
    /// the task report (column shapes; records readable). Returns the reports of the rewritten
    /// shards.
    pub(super) fn finish(&mut self, w: &mut TaskWriter) -> Result<Vec<ShardReport>, WriteError> {
        let mut sealed = Vec::new();
        self.seal(w)?;
        if !self.removed.is_empty() {
            // The rewrites read sealed shards under their final names.
            w.sealer.wait()?;
        }
        for (shard, rows) in std::mem::take(&mut self.removed) {
            if let Some(report) = self.rewrite_without(w, shard, &rows)? {
                sealed.push(report);
            }
        }
        let Some(files) = self.files.as_mut() else {
            return Ok(sealed);
        };
        files.reports.flush()?;
        let mut shapes = vec![None; self.columns.len()];
        let mut rec = ReportRec::empty();
        for s in &self.sealed {
            let mut r = files.reports.range(s.reports.0, s.reports.1)?;
            while rec
                .read_next(&mut r)
                .map_err(|e| WriteError::io(&files.reports.path, e))?
            {
                if let Some(slot) = shapes.get_mut(rec.column as usize) {
                    *slot = match *slot {
                        None => Some(Some(rec.shape)),
                        Some(Some(s)) if s == rec.shape => Some(Some(s)),
                        _ => Some(None),
                    };
                }
            }
        }
        self.column_shapes = shapes;
        Ok(sealed)
    }

    /// The index rows of sealed shard `shard` (file `file`), read back one at a time from its
    /// records (after [`KvState::finish`]); in data order.
    pub(super) fn index_row_iter<'a>(
        &'a self,
        shard: u32,
        file: &'a str,
    ) -> Result<impl Iterator<Item = Result<IndexRow, WriteError>> + 'a, WriteError> {
        let found = match (
            self.sealed.iter().find(|s| s.shard == shard),
            self.files.as_ref(),
        ) {
            (Some(s), Some(files)) => Some((files.reports.range(s.reports.0, s.reports.1)?, files)),
            _ => None,
        };
        let mut rec = ReportRec::empty();
        let mut found = found;
        Ok(std::iter::from_fn(move || {
            let (r, files) = found.as_mut()?;
            match rec.read_next(r) {
                Err(e) => {
                    let err = WriteError::io(&files.reports.path, e);
                    found = None;
                    Some(Err(err))
                }
                Ok(false) => {
                    found = None;
                    None
                }
                Ok(true) => Some(Ok(self.tensor_report(&rec).into_index_row(file))),
            }
        }))
    }

    /// Whether sealed shard `shard`'s tensors are stored in strictly ascending name order (UTF-8
    /// bytes): true when every column has one dtype, as the reference layout orders tensors by
    /// dtype, then name. Decided when the shard was sealed.
    pub(super) fn names_in_data_order(&self, shard: u32) -> bool {
        self.sealed
            .iter()
            .find(|s| s.shard == shard)
            .is_some_and(|s| s.names_ascending)
    }

    /// The index rows of sealed shard `shard` (file `file`), all in memory; in data order.
    pub(super) fn index_rows(&self, shard: u32, file: &str) -> Result<Vec<IndexRow>, WriteError> {
        self.index_row_iter(shard, file)?.collect()
    }

    /// The per-sample shape shared by every sealed tensor of column `column`: `None` when the
    /// task stored none, `Some(None)` when rows differ (after [`KvState::finish`]).
    pub(super) fn column_shape(&self, column: u32) -> Option<Option<Vec<u64>>> {
        let shape = (*self.column_shapes.get(column as usize)?)?;
        Some(shape.map(|s| self.shapes.get(s).to_vec()))
    }

    /// Rewrites sealed shard `shard` without the tensors of the row ids `rows`. A shard left
    /// without tensors is deleted and disappears from the task's shards.
    fn rewrite_without(
        &mut self,
        w: &mut TaskWriter,
        shard: u32,
        rows: &HashSet<u32>,
    ) -> Result<Option<ShardReport>, WriteError> {
        let (Some(idx), Some(si), Some(files)) = (
            w.shards.iter().position(|s| s.shard == shard),
            self.sealed.iter().position(|s| s.shard == shard),
            self.files.as_mut(),
        ) else {
            return Ok(None);
        };
        let range = self.sealed[si].reports;
        files.reports.flush()?;
        // `lastWin` only: the shard's records are held while it is rewritten.
        let mut keep = Vec::new();
        let mut removed_names = HashSet::new();
        let mut removed_rows = HashSet::new();
        {
            let mut r = files.reports.range(range.0, range.1)?;
            loop {
                let mut rec = ReportRec::empty();
                if !rec
                    .read_next(&mut r)
                    .map_err(|e| WriteError::io(&files.reports.path, e))?
                {
                    break;
                }
                if rows.contains(&rec.row) {
                    removed_names.insert(tensor_name(&self.columns, &self.separator, &rec));
                    removed_rows.insert(rec.row);
                } else {
                    keep.push(rec);
                }
            }
        }
        let old = w.shards[idx].clone();
        let path = PathBuf::from(&old.local_path);
        if keep.is_empty() {
            fs::remove_file(&path).map_err(|e| WriteError::io(&path, e))?;
            w.shards.remove(idx);
            self.sealed.remove(si);
            return Ok(None);
        }
        let samples = old.samples.saturating_sub(removed_rows.len() as u64);
        let meta = shard_metadata(&w.plan, samples, 0);
        let written = copy_tensors(&path, &path, Some(&meta), |t| {
            !removed_names.contains(&t.name)
        })?;
        // The kept tensors keep their relative (layout) order.
        if keep.len() != written.tensors.len() {
            return Err(WriteError::Batch(
                "shard layout does not match its tensors".into(),
            ));
        }
        let start = files.reports.len;
        for (rec, info) in keep.iter_mut().zip(&written.tensors) {
            if info.name != tensor_name(&self.columns, &self.separator, rec)
                || info.byte_len() != rec.end - rec.start
            {
                return Err(WriteError::Batch(format!(
                    "shard layout does not match its tensors at '{}'",
                    info.name
                )));
            }
            rec.start = written.data_start + info.data_offsets[0];
            rec.end = written.data_start + info.data_offsets[1];
            rec.append(&mut files.reports)?;
        }
        if let Some(s) = self.sealed.get_mut(si) {
            s.reports = (start, files.reports.len);
            s.tensors = keep.len() as u64;
        }
        let report = ShardReport {
            samples,
            bytes: written.bytes,
            crc32c: Some(crc32c_hex(written.crc32c)),
            tensors: Vec::new(),
            ..old
        };
        w.shards[idx] = report.clone();
        Ok(Some(report))
    }
}
