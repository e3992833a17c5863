//! KV mode: one tensor per row and column, named `<key><separator><column>`, shards rolled over
//! at the target size, tensor bytes spilled to a hidden file until the shard is sealed.
//!
//! ## Memory per row
//! Everything the task keeps per row is compact and holds no heap allocation of its own:
//! * every key the task has written lives once in one string arena ([`KeyTable`]), with a
//!   32-byte record (row, shard, position in the open shard) and a hash-index entry, for
//!   duplicate detection and `lastWin`;
//! * each tensor of the open shard and of every sealed shard is a 40-byte [`TensorRec`]
//!   (key id, column, interned shape id, dtype, byte range); names are `key + separator +
//!   column`, rebuilt when needed.
//!
//! The tensors' [`TensorReport`]s (the driver's cross-task checks need one per tensor) are
//! built from these records one at a time while the task report file is written at `finish`
//! ([`ShardTensors`]); a sealed shard is handed out without them.

use super::rows::{self, RowTensor};
use super::{shard_metadata, TaskWriter, WriteError, COPY_BUFFER, KV_CHUNK_ROWS};
use crate::file::{copy_tensors, FileWriter};
use crate::header::{self, HeaderEntry, Layout, TensorInfo, MAX_HEADER_SIZE, METADATA_KEY};
use crate::write::{DuplicatesStrategy, ShardReport, TensorReport, WritePlan};
use crate::Dtype;
use arrow_array::cast::AsArray;
use arrow_array::{Array, StructArray};
use std::cmp::Ordering;
use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File};
use std::hash::BuildHasher;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

/// `KeyRec::shard` of a key whose stored occurrence is in the open shard.
const OPEN: u32 = u32::MAX;
/// End of a [`KeyTable`] hash chain.
const NO_KEY: u32 = u32::MAX;

/// A key the task has written, and where its stored occurrence is.
struct KeyRec {
    /// The key's bytes are `arena[start..start + len]`.
    start: usize,
    len: u32,
    /// The previous key with the same hash ([`NO_KEY`]: none).
    next: u32,
    /// Partition row number of the stored occurrence.
    row: u64,
    /// Sealed shard holding it, or [`OPEN`]: its tensors are the open shard's
    /// `open_start..open_start + columns`.
    shard: u32,
    open_start: u32,
}

/// Every key written by the task, each stored once: the bytes in one arena, a fixed-size record
/// per key, and a hash index (hash → latest key id with that hash, older ones chained).
struct KeyTable {
    arena: String,
    recs: Vec<KeyRec>,
    index: HashMap<u64, u32>,
    hasher: RandomState,
}

impl KeyTable {
    fn new() -> Self {
        KeyTable {
            arena: String::new(),
            recs: Vec::new(),
            index: HashMap::new(),
            hasher: RandomState::new(),
        }
    }

    fn key(&self, id: u32) -> &str {
        self.recs
            .get(id as usize)
            .and_then(|r| self.arena.get(r.start..r.start + r.len as usize))
            .unwrap_or("")
    }

    fn rec(&self, id: u32) -> Option<&KeyRec> {
        self.recs.get(id as usize)
    }

    fn rec_mut(&mut self, id: u32) -> Option<&mut KeyRec> {
        self.recs.get_mut(id as usize)
    }

    /// The key's hash and, if the task has written it, its id.
    fn find(&self, key: &str) -> (u64, Option<u32>) {
        let hash = self.hasher.hash_one(key);
        let mut id = self.index.get(&hash).copied().unwrap_or(NO_KEY);
        while id != NO_KEY {
            if self.key(id) == key {
                return (hash, Some(id));
            }
            id = self.rec(id).map_or(NO_KEY, |r| r.next);
        }
        (hash, None)
    }

    /// Adds a key not in the table (`hash` from [`KeyTable::find`]); returns its id.
    fn insert(
        &mut self,
        hash: u64,
        key: &str,
        row: u64,
        open_start: u32,
    ) -> Result<u32, WriteError> {
        let id = u32::try_from(self.recs.len())
            .ok()
            .filter(|&id| id != NO_KEY)
            .ok_or_else(|| WriteError::Batch("too many keys in one task".into()))?;
        let len = u32::try_from(key.len())
            .map_err(|_| WriteError::Batch("key longer than 4 GiB".into()))?;
        let next = self.index.insert(hash, id).unwrap_or(NO_KEY);
        let start = self.arena.len();
        self.arena.push_str(key);
        self.recs.push(KeyRec {
            start,
            len,
            next,
            row,
            shard: OPEN,
            open_start,
        });
        Ok(id)
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
        if let Some(&id) = self.index.get(shape) {
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

/// One tensor of the open shard (bytes `start..end` of the spill file) or of a sealed shard
/// (absolute bytes `start..end` of the shard file).
#[derive(Clone, Copy)]
struct TensorRec {
    key: u32,
    column: u32,
    shape: u32,
    dtype: Dtype,
    /// `false` once replaced by a later row with the same key (`lastWin`, open shard only).
    live: bool,
    start: u64,
    end: u64,
}

impl TensorRec {
    fn len(&self) -> u64 {
        self.end - self.start
    }
}

/// A sealed shard's tensors, serialised as a sequence of [`TensorReport`]s built one at a time.
pub(super) struct ShardTensors<'a> {
    kv: &'a KvState,
    tensors: &'a [TensorRec],
}

impl serde::Serialize for ShardTensors<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.tensors.iter().map(|t| self.kv.tensor_report(t)))
    }
}

/// A sealed shard's tensors, in data order.
struct SealedShard {
    shard: u32,
    tensors: Vec<TensorRec>,
}

/// A hidden file in the work directory holding the open shard's tensor bytes; deleted on drop.
struct Spill {
    path: PathBuf,
    out: Option<BufWriter<File>>,
    len: u64,
}

impl Spill {
    fn create(path: PathBuf) -> Result<Self, WriteError> {
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| WriteError::io(&path, e))?;
        Ok(Spill {
            out: Some(BufWriter::with_capacity(COPY_BUFFER, file)),
            path,
            len: 0,
        })
    }

    fn append(&mut self, bytes: &[u8]) -> Result<u64, WriteError> {
        let out = self
            .out
            .as_mut()
            .ok_or_else(|| WriteError::io(&self.path, std::io::Error::other("spill closed")))?;
        out.write_all(bytes)
            .map_err(|e| WriteError::io(&self.path, e))?;
        let at = self.len;
        self.len += bytes.len() as u64;
        Ok(at)
    }

    /// Flushes and returns the file for reading.
    fn take_reader(&mut self) -> Result<File, WriteError> {
        let out = self
            .out
            .take()
            .ok_or_else(|| WriteError::io(&self.path, std::io::Error::other("spill closed")))?;
        out.into_inner()
            .map_err(|e| WriteError::io(&self.path, e.into_error()))
    }
}

impl Drop for Spill {
    fn drop(&mut self) {
        self.out = None;
        let _ = fs::remove_file(&self.path);
    }
}

#[derive(Default)]
struct OpenShard {
    spill: Option<Spill>,
    /// Tensors in arrival order, `columns` per row.
    tensors: Vec<TensorRec>,
    samples: u64,
    live_tensors: u64,
    /// Σ header-entry bytes (see [`entry_json_len`]) of the live tensors.
    json: u64,
    /// Σ byte length of the live tensors.
    data_len: u64,
}

pub(super) struct KvState {
    name_col: String,
    separator: String,
    /// The plan's column names (the tensor names' suffixes).
    columns: Vec<String>,
    target: u64,
    duplicates: DuplicatesStrategy,
    keys: KeyTable,
    shapes: Shapes,
    /// Tensor names written so far; tracked only when two column names could make two keys'
    /// names coincide (one column name is a proper suffix of another).
    names: Option<HashSet<String>>,
    open: OpenShard,
    /// Tensors of the shards sealed so far, in sealing order.
    sealed: Vec<SealedShard>,
    /// `lastWin`: ids of keys to remove from already sealed shards at finish.
    removed: BTreeMap<u32, HashSet<u32>>,
    /// Header bytes of `__metadata__` with `samples` = 0 (one digit).
    meta_len: u64,
    spill_counter: u32,
}

/// Counts the bytes written to it.
struct Counter(u64);

impl Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Length of `s` as a JSON string (quotes included), as the header writer escapes it.
fn json_len(s: &str) -> u64 {
    let mut n = Counter(0);
    match serde_json::to_writer(&mut n, s) {
        Ok(()) => n.0,
        Err(_) => s.len() as u64 * 6 + 2,
    }
}

/// Length of the concatenation of `parts` as a JSON string (escaping is per character).
fn json_len_concat(parts: &[&str]) -> u64 {
    parts.iter().map(|p| json_len(p) - 2).sum::<u64>() + 2
}

fn digits(mut x: u64) -> u64 {
    let mut d = 1;
    while x >= 10 {
        x /= 10;
        d += 1;
    }
    d
}

/// Header bytes of one tensor entry `"name":{"dtype":"..","shape":[..],"data_offsets":[,]}`
/// without the offsets' digits; `name_json` is the name's [`json_len`].
fn entry_json_len(name_json: u64, dtype: Dtype, shape: &[u64]) -> u64 {
    let shape_len: u64 =
        shape.iter().map(|&d| digits(d)).sum::<u64>() + shape.len().saturating_sub(1) as u64;
    name_json
        + r#":{"dtype":""#.len() as u64
        + dtype.name().len() as u64
        + r#"","shape":["#.len() as u64
        + shape_len
        + r#"],"data_offsets":[,]}"#.len() as u64
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
        let meta_len = json_len(METADATA_KEY)
            + 3 // :{}
            + meta
                .iter()
                .map(|(k, v)| json_len(k) + 1 + json_len(v))
                .sum::<u64>()
            + meta.len().saturating_sub(1) as u64;
        let columns: Vec<String> = plan.columns.iter().map(|c| c.name.clone()).collect();
        let collisions_possible = columns.iter().any(|a| {
            columns
                .iter()
                .any(|b| a.len() > b.len() && a.ends_with(b.as_str()))
        });
        KvState {
            name_col,
            separator,
            columns,
            target,
            duplicates,
            keys: KeyTable::new(),
            shapes: Shapes::default(),
            names: collisions_possible.then(HashSet::new),
            open: OpenShard::default(),
            sealed: Vec::new(),
            removed: BTreeMap::new(),
            meta_len,
            spill_counter: 0,
        }
    }

    /// `lastWin`: `finish` may rewrite shards sealed earlier.
    pub(super) fn rewrites_sealed_shards(&self) -> bool {
        self.duplicates == DuplicatesStrategy::LastWin
    }

    pub(super) fn name_col(&self) -> &str {
        &self.name_col
    }

    /// Deletes the spill file, if any.
    pub(super) fn discard(&mut self) {
        self.open = OpenShard::default();
    }

    fn column_name(&self, column: u32) -> &str {
        self.columns.get(column as usize).map_or("", String::as_str)
    }

    /// The name of a tensor: `key + separator + column`.
    fn tensor_name(&self, t: &TensorRec) -> String {
        let key = self.keys.key(t.key);
        let column = self.column_name(t.column);
        let mut name = String::with_capacity(key.len() + self.separator.len() + column.len());
        name.push_str(key);
        name.push_str(&self.separator);
        name.push_str(column);
        name
    }

    /// The bytes of a tensor's name, without building it.
    fn name_bytes<'a>(&'a self, t: &TensorRec) -> impl Iterator<Item = u8> + 'a {
        let key = self.keys.key(t.key).bytes();
        let column = self.column_name(t.column).bytes();
        key.chain(self.separator.bytes()).chain(column)
    }

    fn name_is(&self, t: &TensorRec, name: &str) -> bool {
        let key = self.keys.key(t.key);
        let column = self.column_name(t.column);
        name.len() == key.len() + self.separator.len() + column.len()
            && self.name_bytes(t).eq(name.bytes())
    }

    /// Header bytes of a tensor's entry (see [`entry_json_len`]).
    fn entry_json(&self, key: &str, column: u32, dtype: Dtype, shape: &[u64]) -> u64 {
        let name = json_len_concat(&[key, &self.separator, self.column_name(column)]);
        entry_json_len(name, dtype, shape)
    }

    /// The order of the format's layout: dtype descending, then name.
    fn layout_order(&self, a: &TensorRec, b: &TensorRec) -> Ordering {
        b.dtype
            .cmp(&a.dtype)
            .then_with(|| self.name_bytes(a).cmp(self.name_bytes(b)))
    }

    /// The report of a sealed tensor.
    fn tensor_report(&self, t: &TensorRec) -> TensorReport {
        TensorReport {
            name: self.tensor_name(t),
            dtype: t.dtype,
            shape: self.shapes.get(t.shape).to_vec(),
            data_start: t.start,
            data_end: t.end,
            sample_key: Some(self.keys.key(t.key).to_string()),
            column: Some(self.column_name(t.column).to_string()),
        }
    }

    /// Checks that a file's layout (`written`) has exactly `tensors`, in this order.
    fn check_layout(
        &self,
        tensors: &[TensorRec],
        written: &[TensorInfo],
    ) -> Result<(), WriteError> {
        if tensors.len() != written.len() {
            return Err(WriteError::Batch(
                "shard layout does not match its tensors".into(),
            ));
        }
        for (t, info) in tensors.iter().zip(written) {
            if !self.name_is(t, &info.name) || info.byte_len() != t.len() {
                return Err(WriteError::Batch(format!(
                    "shard layout does not match its tensors at '{}'",
                    info.name
                )));
            }
        }
        Ok(())
    }

    /// Gives `tensors` their absolute offsets in the file just written (after
    /// [`KvState::check_layout`]); the file's data section starts at `data_start`.
    fn place(
        &self,
        tensors: &mut [TensorRec],
        written: &[TensorInfo],
        data_start: u64,
    ) -> Result<(), WriteError> {
        self.check_layout(tensors, written)?;
        for (t, info) in tensors.iter_mut().zip(written) {
            t.start = data_start + info.data_offsets[0];
            t.end = data_start + info.data_offsets[1];
        }
        Ok(())
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
        // of at most digits(data) digits) + padding.
        let header = (8 + 2 + self.meta_len + (digits(samples) - 1) + 1 + 7)
            .saturating_add(self.open.json)
            .saturating_add(extra_json)
            .saturating_add(n.saturating_mul(1 + 2 * digits(data)));
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

    /// Marks the open shard's row whose tensors start at `start` as replaced.
    fn remove_open_row(&mut self, start: usize) {
        let count = self.columns.len();
        let end = (start + count).min(self.open.tensors.len());
        for i in start..end {
            let Some(t) = self.open.tensors.get(i).copied() else {
                continue;
            };
            if t.live {
                let json = self.entry_json(
                    self.keys.key(t.key),
                    t.column,
                    t.dtype,
                    self.shapes.get(t.shape),
                );
                self.open.live_tensors -= 1;
                self.open.json -= json;
                self.open.data_len -= t.len();
                if let Some(slot) = self.open.tensors.get_mut(i) {
                    slot.live = false;
                }
            }
        }
        self.open.samples -= 1;
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
        let (hash, existing) = self.keys.find(key);
        if let Some(id) = existing {
            let (first_row, shard, open_start) = self
                .keys
                .rec(id)
                .map(|r| (r.row, r.shard, r.open_start))
                .ok_or_else(|| WriteError::Batch("key table out of sync".into()))?;
            match self.duplicates {
                DuplicatesStrategy::Fail => {
                    return Err(WriteError::DuplicateKey {
                        column: self.name_col.clone(),
                        key: key.to_string(),
                        row,
                        first_row,
                    })
                }
                DuplicatesStrategy::LastWin => {
                    if shard == OPEN {
                        self.remove_open_row(open_start as usize);
                    } else {
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
        let mut row_json = 0u64;
        let mut row_data = 0u64;
        for (c, (t, bytes)) in tensors.iter().enumerate() {
            row_json += self.entry_json(key, c as u32, t.dtype, &t.shape);
            row_data += bytes.len() as u64;
        }
        let count = tensors.len() as u64;
        let (header, file) = self.estimate(count, row_json, row_data, self.open.samples + 1);
        // The header limit of the format applies whatever the target size.
        if self.open.samples > 0 && (file > self.target || header > 8 + MAX_HEADER_SIZE) {
            self.seal(w)?;
        }
        if self.open.spill.is_none() {
            let path = w.work_dir.join(format!(
                ".spill-{:05}-{}-{}.tmp",
                w.partition, self.spill_counter, w.plan.write_id
            ));
            self.spill_counter += 1;
            self.open.spill = Some(Spill::create(path)?);
        }
        let open_start = u32::try_from(self.open.tensors.len())
            .map_err(|_| WriteError::Batch("too many tensors in one shard".into()))?;
        let id = match existing {
            Some(id) => {
                let rec = self
                    .keys
                    .rec_mut(id)
                    .ok_or_else(|| WriteError::Batch("key table out of sync".into()))?;
                rec.row = row;
                rec.shard = OPEN;
                rec.open_start = open_start;
                id
            }
            None => self.keys.insert(hash, key, row, open_start)?,
        };
        for (c, (t, bytes)) in tensors.iter().enumerate() {
            let spill = self
                .open
                .spill
                .as_mut()
                .ok_or_else(|| WriteError::Batch("spill file missing".into()))?;
            let offset = spill.append(bytes)?;
            let shape = self.shapes.intern(&t.shape)?;
            self.open.tensors.push(TensorRec {
                key: id,
                column: c as u32,
                shape,
                dtype: t.dtype,
                live: true,
                start: offset,
                end: offset + bytes.len() as u64,
            });
            self.open.live_tensors += 1;
            self.open.data_len += bytes.len() as u64;
        }
        self.open.json += row_json;
        if let (Some(set), Some(names)) = (&mut self.names, names) {
            set.extend(names);
        }
        self.open.samples += 1;
        Ok(())
    }

    /// Seals the open shard (if it has rows): plans the layout, copies the live tensors from the
    /// spill file in layout order, deletes the spill file and hands the shard with its report to
    /// the task's sealer (fsync and rename in the background); the task keeps only the compact
    /// records of its tensors.
    fn seal(&mut self, w: &mut TaskWriter) -> Result<(), WriteError> {
        let mut open = std::mem::take(&mut self.open);
        if open.samples == 0 {
            return Ok(());
        }
        let mut live: Vec<TensorRec> = open.tensors.iter().filter(|t| t.live).copied().collect();
        open.tensors = Vec::new();
        // The reference layout (header::plan_layout's order), serialised straight from the
        // records: no per-tensor name, shape or entry is built, only the header bytes.
        live.sort_by(|a, b| self.layout_order(a, b));
        let meta = shard_metadata(&w.plan, open.samples, 0);
        let mut cursor = 0u64;
        let header_bytes = header::serialize_entries(
            Some(&meta),
            live.len(),
            live.iter().map(|t| {
                let begin = cursor;
                cursor += t.len();
                HeaderEntry {
                    name: [
                        self.keys.key(t.key),
                        &self.separator,
                        self.column_name(t.column),
                    ],
                    dtype: t.dtype,
                    shape: self.shapes.get(t.shape),
                    data_offsets: [begin, cursor],
                }
            }),
        )?;
        let layout = Layout {
            tensors: Vec::new(),
            header_bytes,
            data_len: cursor,
        };
        let (shard, file, path) = w.next_shard_path();
        let mut writer = FileWriter::create_laid_out(&path, layout)?;
        let spill = open
            .spill
            .as_mut()
            .ok_or_else(|| WriteError::Batch("spill file missing".into()))?;
        let spill_path = spill.path.clone();
        let mut reader = spill.take_reader()?;
        let biggest = live.iter().map(TensorRec::len).max().unwrap_or(0);
        let mut buf = vec![
            0u8;
            usize::try_from(biggest)
                .unwrap_or(COPY_BUFFER)
                .min(COPY_BUFFER)
        ];
        for t in &live {
            reader
                .seek(SeekFrom::Start(t.start))
                .map_err(|e| WriteError::io(&spill_path, e))?;
            let mut left = t.len();
            while left > 0 {
                let n = usize::try_from(left).unwrap_or(buf.len()).min(buf.len());
                let chunk = buf
                    .get_mut(..n)
                    .ok_or_else(|| WriteError::Batch("copy buffer too small".into()))?;
                reader
                    .read_exact(chunk)
                    .map_err(|e| WriteError::io(&spill_path, e))?;
                writer.write(chunk)?;
                left -= n as u64;
            }
        }
        let (written, pending) = writer.close()?;
        // Absolute offsets in the shard: consecutive in layout order after the header.
        let mut at = written.data_start;
        for t in &mut live {
            let len = t.len();
            t.start = at;
            t.end = at + len;
            at += len;
        }
        for t in &live {
            if let Some(rec) = self.keys.rec_mut(t.key) {
                rec.shard = shard;
            }
        }
        let samples = open.samples;
        // Dropping the open shard deletes its spill file.
        drop(open);
        // Without its tensors: the task report file lists them ([`KvState::shard_tensors`]).
        let report = ShardReport {
            file,
            local_path: path.to_string_lossy().into_owned(),
            partition: w.partition,
            shard,
            samples,
            padded_samples: 0,
            bytes: written.bytes,
            tensors: Vec::new(),
        };
        w.shards.push(report.clone());
        self.sealed.push(SealedShard {
            shard,
            tensors: live,
        });
        w.seal_in_background(pending, report)
    }

    /// Seals the last shard and rewrites sealed shards that lost keys to `lastWin`. Returns the
    /// reports of the rewritten shards.
    pub(super) fn finish(&mut self, w: &mut TaskWriter) -> Result<Vec<ShardReport>, WriteError> {
        let mut sealed = Vec::new();
        self.seal(w)?;
        if !self.removed.is_empty() {
            // The rewrites read sealed shards under their final names.
            w.sealer.wait()?;
        }
        for (shard, keys) in std::mem::take(&mut self.removed) {
            if let Some(report) = self.rewrite_without(w, shard, &keys)? {
                sealed.push(report);
            }
        }
        Ok(sealed)
    }

    /// The tensors of sealed shard `shard`, serialisable as its `TensorReport`s.
    pub(super) fn shard_tensors(&self, shard: u32) -> ShardTensors<'_> {
        let tensors = self
            .sealed
            .iter()
            .find(|s| s.shard == shard)
            .map_or(&[][..], |s| s.tensors.as_slice());
        ShardTensors { kv: self, tensors }
    }

    /// The per-sample shape shared by every sealed tensor of column `column`: `None` when the
    /// task stored none, `Some(None)` when rows differ.
    pub(super) fn column_shape(&self, column: u32) -> Option<Option<Vec<u64>>> {
        let mut shapes = self
            .sealed
            .iter()
            .flat_map(|s| &s.tensors)
            .filter(|t| t.column == column)
            .map(|t| t.shape);
        let first = shapes.next()?;
        // Shapes are interned: equal shapes have equal ids.
        Some(
            shapes
                .all(|s| s == first)
                .then(|| self.shapes.get(first).to_vec()),
        )
    }

    /// Rewrites sealed shard `shard` without the tensors of the keys `keys`. A shard left
    /// without tensors is deleted and disappears from the task's shards.
    fn rewrite_without(
        &mut self,
        w: &mut TaskWriter,
        shard: u32,
        keys: &HashSet<u32>,
    ) -> Result<Option<ShardReport>, WriteError> {
        let (Some(idx), Some(si)) = (
            w.shards.iter().position(|s| s.shard == shard),
            self.sealed.iter().position(|s| s.shard == shard),
        ) else {
            return Ok(None);
        };
        let old = w.shards[idx].clone();
        let tensors = std::mem::take(&mut self.sealed[si].tensors);
        let removed_keys: HashSet<u32> = tensors
            .iter()
            .filter(|t| keys.contains(&t.key))
            .map(|t| t.key)
            .collect();
        let removed_names: HashSet<String> = tensors
            .iter()
            .filter(|t| keys.contains(&t.key))
            .map(|t| self.tensor_name(t))
            .collect();
        let mut keep: Vec<TensorRec> = tensors
            .into_iter()
            .filter(|t| !keys.contains(&t.key))
            .collect();
        let path = PathBuf::from(&old.local_path);
        if keep.is_empty() {
            fs::remove_file(&path).map_err(|e| WriteError::io(&path, e))?;
            w.shards.remove(idx);
            self.sealed.remove(si);
            return Ok(None);
        }
        let samples = old.samples.saturating_sub(removed_keys.len() as u64);
        let meta = shard_metadata(&w.plan, samples, 0);
        let written = copy_tensors(&path, &path, Some(&meta), |t| {
            !removed_names.contains(&t.name)
        })?;
        // The kept tensors keep their relative (layout) order.
        self.place(&mut keep, &written.tensors, written.data_start)?;
        let report = ShardReport {
            samples,
            bytes: written.bytes,
            tensors: Vec::new(),
            ..old
        };
        w.shards[idx] = report.clone();
        if let Some(s) = self.sealed.get_mut(si) {
            s.tensors = keep;
        }
        Ok(Some(report))
    }
}
