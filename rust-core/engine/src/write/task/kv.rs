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

use super::encode::{self, RowTensor};
use super::{shard_metadata, TaskWriter, WriteError, KV_CHUNK_ROWS};
use crate::write::{DuplicatesStrategy, SealedTensor, ShardReport, WritePlan};
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

mod records;
mod seal;

use records::*;
use seal::*;

#[cfg(test)]
thread_local! {
    /// Tests: every key gets the same 32-bit hash, so each lookup walks one chain of all rows.
    pub(super) static ALL_KEYS_COLLIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
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
    fn tensor_report(&self, t: &ReportRec) -> SealedTensor {
        let column = self.column_name(t.column);
        SealedTensor {
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
                let t = encode::extract(col, batch.column(c + 1), start..end, w.rows_seen, buf)?;
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
