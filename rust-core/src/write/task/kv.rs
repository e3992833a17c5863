//! KV mode: one tensor per row and column, named `<key><separator><column>`, shards rolled over
//! at the target size, tensor bytes spilled to a hidden file until the shard is sealed.

use super::rows::{self, RowTensor};
use super::{shard_metadata, TaskWriter, WriteError, COPY_BUFFER, KV_CHUNK_ROWS};
use crate::file::{copy_tensors, FileWriter};
use crate::header::{TensorEntry, MAX_HEADER_SIZE, METADATA_KEY};
use crate::write::{DuplicatesStrategy, ShardReport, TensorReport, WritePlan};
use crate::Dtype;
use arrow_array::cast::AsArray;
use arrow_array::{Array, StructArray};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File};
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

/// Where the stored occurrence of a key is.
struct KeyLoc {
    /// Partition row number of the stored occurrence.
    row: u64,
    /// `None`: in the open shard, its tensors at `open_start..open_start + columns`.
    shard: Option<u32>,
    open_start: usize,
}

/// A tensor of the open shard whose bytes are in the spill file.
struct SpillTensor {
    name: String,
    key: String,
    column: usize,
    dtype: Dtype,
    shape: Vec<u64>,
    offset: u64,
    len: u64,
    /// Bytes of its header entry, without the offsets' digits and the separating comma.
    json: u64,
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
    /// Tensors in arrival order; `None` once replaced by a later row (`lastWin`).
    tensors: Vec<Option<SpillTensor>>,
    samples: u64,
    live_tensors: u64,
    /// Σ `json` of the live tensors.
    json: u64,
    /// Σ `len` of the live tensors.
    data_len: u64,
}

pub(super) struct KvState {
    name_col: String,
    separator: String,
    target: u64,
    duplicates: DuplicatesStrategy,
    keys: HashMap<String, KeyLoc>,
    /// Tensor names written so far; tracked only when two column names could make two keys'
    /// names coincide (one column name is a proper suffix of another).
    names: Option<HashSet<String>>,
    open: OpenShard,
    /// `lastWin`: keys to remove from already sealed shards at finish.
    removed: BTreeMap<u32, HashSet<String>>,
    /// Header bytes of `__metadata__` with `samples` = 0 (one digit).
    meta_len: u64,
    spill_counter: u32,
}

fn json_len(s: &str) -> u64 {
    serde_json::to_string(s).map_or(s.len() as u64 * 6 + 2, |j| j.len() as u64)
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
/// without the offsets' digits.
fn entry_json_len(name: &str, dtype: Dtype, shape: &[u64]) -> u64 {
    let shape_len: u64 =
        shape.iter().map(|&d| digits(d)).sum::<u64>() + shape.len().saturating_sub(1) as u64;
    json_len(name)
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
        let cols: Vec<&str> = plan.columns.iter().map(|c| c.name.as_str()).collect();
        let collisions_possible = cols
            .iter()
            .any(|a| cols.iter().any(|b| a.len() > b.len() && a.ends_with(b)));
        KvState {
            name_col,
            separator,
            target,
            duplicates,
            keys: HashMap::new(),
            names: collisions_possible.then(HashSet::new),
            open: OpenShard::default(),
            removed: BTreeMap::new(),
            meta_len,
            spill_counter: 0,
        }
    }

    pub(super) fn name_col(&self) -> &str {
        &self.name_col
    }

    /// Deletes the spill file, if any.
    pub(super) fn discard(&mut self) {
        self.open = OpenShard::default();
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
    ) -> Result<Vec<ShardReport>, WriteError> {
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
        let mut sealed = Vec::new();
        let n = batch.len();
        let mut start = 0;
        while start < n {
            let end = n.min(start + KV_CHUNK_ROWS);
            if let Some(i) = (start..end).find(|&i| keys.is_null(i)) {
                return Err(WriteError::Row {
                    column: self.name_col.clone(),
                    row: w.rows_seen + i as u64,
                    message: "null key".into(),
                });
            }
            let mut bufs = Vec::with_capacity(w.columns.len());
            let mut tensors = Vec::with_capacity(w.columns.len());
            for (c, col) in w.columns.iter_mut().enumerate() {
                let mut buf = Vec::new();
                let t = rows::extract(col, batch.column(c + 1), start..end, w.rows_seen, &mut buf)?;
                bufs.push(buf);
                tensors.push(t);
            }
            for i in start..end {
                let row = w.rows_seen + i as u64;
                let mut row_tensors = Vec::with_capacity(tensors.len());
                for (t, buf) in tensors.iter().zip(&bufs) {
                    let rt: &RowTensor = t
                        .get(i - start)
                        .ok_or_else(|| WriteError::Batch("extracted rows out of sync".into()))?;
                    let bytes = buf
                        .get(rt.bytes.clone())
                        .ok_or_else(|| WriteError::Batch("extracted bytes out of sync".into()))?;
                    row_tensors.push((rt, bytes));
                }
                if let Some(report) = self.add_row(w, row, keys.value(i), &row_tensors)? {
                    sealed.push(report);
                }
            }
            start = end;
        }
        Ok(sealed)
    }

    fn remove_open_row(&mut self, start: usize, count: usize) {
        for slot in self.open.tensors.iter_mut().skip(start).take(count) {
            if let Some(t) = slot.take() {
                self.open.live_tensors -= 1;
                self.open.json -= t.json;
                self.open.data_len -= t.len;
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
    ) -> Result<Option<ShardReport>, WriteError> {
        let names: Vec<String> = w
            .columns
            .iter()
            .map(|c| format!("{key}{}{}", self.separator, c.plan.name))
            .collect();
        for (name, col) in names.iter().zip(&w.columns) {
            if name == METADATA_KEY {
                return Err(WriteError::TensorName {
                    column: col.plan.name.clone(),
                    row,
                    message: format!("tensor name '{name}' (key '{key}') is reserved"),
                });
            }
        }
        if let Some(loc) = self.keys.get(key) {
            match self.duplicates {
                DuplicatesStrategy::Fail => {
                    return Err(WriteError::DuplicateKey {
                        column: self.name_col.clone(),
                        key: key.to_string(),
                        row,
                        first_row: loc.row,
                    })
                }
                DuplicatesStrategy::LastWin => {
                    match loc.shard {
                        None => {
                            let start = loc.open_start;
                            self.remove_open_row(start, names.len());
                        }
                        Some(s) => {
                            self.removed.entry(s).or_default().insert(key.to_string());
                        }
                    }
                    if let Some(set) = &mut self.names {
                        for name in &names {
                            set.remove(name);
                        }
                    }
                }
            }
        }
        if let Some(set) = &self.names {
            for (name, col) in names.iter().zip(&w.columns) {
                if set.contains(name) {
                    return Err(WriteError::TensorName {
                        column: col.plan.name.clone(),
                        row,
                        message: format!(
                            "tensor name '{name}' (key '{key}') is also the name of a tensor of an earlier row with another key"
                        ),
                    });
                }
            }
        }
        let jsons: Vec<u64> = names
            .iter()
            .zip(tensors)
            .map(|(name, (t, _))| entry_json_len(name, t.dtype, &t.shape))
            .collect();
        let row_json: u64 = jsons.iter().sum();
        let row_data: u64 = tensors.iter().map(|(_, b)| b.len() as u64).sum();
        let count = tensors.len() as u64;
        let mut sealed = None;
        let (header, file) = self.estimate(count, row_json, row_data, self.open.samples + 1);
        // The header limit of the format applies whatever the target size.
        if self.open.samples > 0 && (file > self.target || header > 8 + MAX_HEADER_SIZE) {
            sealed = self.seal(w)?;
        }
        if self.open.spill.is_none() {
            let path = w.work_dir.join(format!(
                ".spill-{:05}-{}-{}.tmp",
                w.partition, self.spill_counter, w.plan.write_id
            ));
            self.spill_counter += 1;
            self.open.spill = Some(Spill::create(path)?);
        }
        let open_start = self.open.tensors.len();
        for (c, ((name, (t, bytes)), json)) in names.into_iter().zip(tensors).zip(jsons).enumerate()
        {
            let spill = self
                .open
                .spill
                .as_mut()
                .ok_or_else(|| WriteError::Batch("spill file missing".into()))?;
            let offset = spill.append(bytes)?;
            if let Some(set) = &mut self.names {
                set.insert(name.clone());
            }
            self.open.tensors.push(Some(SpillTensor {
                name,
                key: key.to_string(),
                column: c,
                dtype: t.dtype,
                shape: t.shape.clone(),
                offset,
                len: bytes.len() as u64,
                json,
            }));
            self.open.live_tensors += 1;
            self.open.json += json;
            self.open.data_len += bytes.len() as u64;
        }
        self.open.samples += 1;
        self.keys.insert(
            key.to_string(),
            KeyLoc {
                row,
                shard: None,
                open_start,
            },
        );
        Ok(sealed)
    }

    /// Seals the open shard (if it has rows): plans the layout, copies the live tensors from the
    /// spill file in layout order and deletes the spill file.
    fn seal(&mut self, w: &mut TaskWriter) -> Result<Option<ShardReport>, WriteError> {
        let mut open = std::mem::take(&mut self.open);
        if open.samples == 0 {
            return Ok(None);
        }
        let live: Vec<&SpillTensor> = open.tensors.iter().flatten().collect();
        let entries = live
            .iter()
            .map(|t| TensorEntry {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
            })
            .collect();
        let by_name: HashMap<&str, &SpillTensor> =
            live.iter().map(|t| (t.name.as_str(), *t)).collect();
        let meta = shard_metadata(&w.plan, open.samples, 0);
        let (shard, file, path) = w.next_shard_path();
        let mut writer = FileWriter::create(&path, Some(&meta), entries)?;
        let order: Vec<(u64, u64)> = writer
            .tensors()
            .iter()
            .filter_map(|t| by_name.get(t.name.as_str()).map(|s| (s.offset, s.len)))
            .collect();
        let spill = open
            .spill
            .as_mut()
            .ok_or_else(|| WriteError::Batch("spill file missing".into()))?;
        let spill_path = spill.path.clone();
        let mut reader = spill.take_reader()?;
        let biggest = order.iter().map(|&(_, l)| l).max().unwrap_or(0);
        let mut buf = vec![
            0u8;
            usize::try_from(biggest)
                .unwrap_or(COPY_BUFFER)
                .min(COPY_BUFFER)
        ];
        for (offset, len) in order {
            reader
                .seek(SeekFrom::Start(offset))
                .map_err(|e| WriteError::io(&spill_path, e))?;
            let mut left = len;
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
        let written = writer.finish()?;
        w.created.push(path.clone());
        let tensors = TensorReport::for_tensors(&written.tensors, written.data_start, |name| {
            let src = by_name.get(name);
            (
                src.map(|s| s.key.clone()),
                src.and_then(|s| w.columns.get(s.column))
                    .map(|c| c.plan.name.clone()),
            )
        });
        for t in &live {
            if let Some(loc) = self.keys.get_mut(&t.key) {
                loc.shard = Some(shard);
            }
        }
        let report = ShardReport {
            file,
            local_path: path.to_string_lossy().into_owned(),
            partition: w.partition,
            shard,
            samples: open.samples,
            padded_samples: 0,
            bytes: written.bytes,
            tensors,
        };
        drop(live);
        // Dropping the open shard deletes its spill file.
        drop(open);
        w.shards.push(report.clone());
        Ok(Some(report))
    }

    /// Seals the last shard and rewrites sealed shards that lost keys to `lastWin`.
    pub(super) fn finish(&mut self, w: &mut TaskWriter) -> Result<Vec<ShardReport>, WriteError> {
        let mut sealed = Vec::new();
        if let Some(report) = self.seal(w)? {
            sealed.push(report);
        }
        for (shard, keys) in std::mem::take(&mut self.removed) {
            if let Some(report) = rewrite_without(w, shard, &keys)? {
                sealed.push(report);
            }
        }
        Ok(sealed)
    }
}

/// Rewrites sealed shard `shard` without the tensors of `keys`. A shard left without tensors is
/// deleted and disappears from the task's shards.
fn rewrite_without(
    w: &mut TaskWriter,
    shard: u32,
    keys: &HashSet<String>,
) -> Result<Option<ShardReport>, WriteError> {
    let Some(idx) = w.shards.iter().position(|s| s.shard == shard) else {
        return Ok(None);
    };
    let old = w.shards[idx].clone();
    let gone = |t: &TensorReport| t.sample_key.as_ref().is_some_and(|k| keys.contains(k));
    let removed_keys: HashSet<&String> = old
        .tensors
        .iter()
        .filter(|t| gone(t))
        .filter_map(|t| t.sample_key.as_ref())
        .collect();
    let keep: Vec<&TensorReport> = old.tensors.iter().filter(|t| !gone(t)).collect();
    let path = PathBuf::from(&old.local_path);
    if keep.is_empty() {
        fs::remove_file(&path).map_err(|e| WriteError::io(&path, e))?;
        w.shards.remove(idx);
        return Ok(None);
    }
    let samples = old.samples.saturating_sub(removed_keys.len() as u64);
    let meta = shard_metadata(&w.plan, samples, 0);
    let written = copy_tensors(&path, &path, Some(&meta), |t| {
        keep.iter().any(|k| k.name == t.name)
    })?;
    let by_name: HashMap<&str, &TensorReport> =
        keep.iter().map(|t| (t.name.as_str(), *t)).collect();
    let report = ShardReport {
        samples,
        bytes: written.bytes,
        tensors: TensorReport::for_tensors(&written.tensors, written.data_start, |name| {
            let src = by_name.get(name);
            (
                src.and_then(|s| s.sample_key.clone()),
                src.and_then(|s| s.column.clone()),
            )
        }),
        ..old
    };
    w.shards[idx] = report.clone();
    Ok(Some(report))
}
