//! Sealing the open shard (its tensors sorted into the reference layout, the header streamed,
//! the bytes copied from the spill file), finishing the task, and the index rows of its shards.

use super::*;

/// A sealed shard: its first row, and its tensors' records in the `reports` file.
pub(super) struct SealedShard {
    pub(super) shard: u32,
    /// Row id of its first row (the rows of a shard are consecutive ids).
    pub(super) first_row: u32,
    /// Byte range of its [`ReportRec`]s, in data order.
    pub(super) reports: (u64, u64),
    pub(super) tensors: u64,
    /// Its tensors are stored in strictly ascending name order (UTF-8 bytes), as when they all
    /// have one dtype (the reference layout orders by dtype, then name). Dropping tensors
    /// (`lastWin` rewrites) keeps it true.
    pub(super) names_ascending: bool,
}

/// One tensor of the shard being sealed, as sorted into the layout.
pub(super) struct SortEntry {
    pub(super) start: u64,
    pub(super) len: u64,
    /// Row within the shard (index of its key range).
    pub(super) row: u32,
    pub(super) column: u32,
    pub(super) shape: u32,
    pub(super) dtype: Dtype,
}

/// Compares the concatenations `a[0] + a[1] + a[2]` and `b[0] + b[1] + b[2]` bytewise, where the
/// middle parts (the separator) are equal.
pub(super) fn cmp_names(a: [&[u8]; 3], b: [&[u8]; 3]) -> Ordering {
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

/// Header bytes of one tensor entry without the offsets' digits; `name_json` is the name's
/// [`header::json_string_len`].
pub(super) fn entry_json_len(name_json: u64, dtype: Dtype, shape: &[u64]) -> u64 {
    name_json + header::entry_len_without_name_and_offsets(dtype, shape)
}

impl KvState {
    /// Seals the open shard (if it has rows): sorts its tensors into the reference layout,
    /// streams the header into the shard, copies the bytes from the spill file, records the
    /// tensors for the task report, empties the spill and tensor files and hands the shard to
    /// the task's sealer (fsync and rename in the background).
    pub(super) fn seal(&mut self, w: &mut TaskWriter) -> Result<(), WriteError> {
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
    pub(in crate::write::task) fn finish(
        &mut self,
        w: &mut TaskWriter,
    ) -> Result<Vec<ShardReport>, WriteError> {
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
    pub(in crate::write::task) fn index_row_iter<'a>(
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
    pub(in crate::write::task) fn names_in_data_order(&self, shard: u32) -> bool {
        self.sealed
            .iter()
            .find(|s| s.shard == shard)
            .is_some_and(|s| s.names_ascending)
    }

    /// The index rows of sealed shard `shard` (file `file`), all in memory; in data order.
    pub(in crate::write::task) fn index_rows(
        &self,
        shard: u32,
        file: &str,
    ) -> Result<Vec<IndexRow>, WriteError> {
        self.index_row_iter(shard, file)?.collect()
    }
}
