//! The task's hidden scratch files and the fixed-size records in them (rows, tensors, report
//! entries), the key-hash map's hasher, and the shapes of the open shard.

use super::*;

/// End of a hash chain of rows.
pub(super) const NO_ROW: u32 = u32::MAX;

/// Buffer of each scratch file but the spill file.
pub(super) const SCRATCH_BUFFER: usize = 1 << 16;

/// Buffer of the spill file.
pub(super) const SPILL_BUFFER: usize = 1 << 18;

/// Buffer of the shard file being sealed (its data comes tensor by tensor from the spill's map).
pub(super) const SEAL_BUFFER: usize = 1 << 18;

/// A hidden file of the task's work directory, appended to through a buffer and read back
/// through a handle of its own; deleted on drop.
pub(super) struct Scratch {
    pub(super) path: PathBuf,
    pub(super) out: BufWriter<File>,
    /// A second open file description: reading moves its cursor, not the writer's.
    pub(super) read: File,
    pub(super) len: u64,
}

/// [`Scratch::map`]: the bytes of a scratch file, or none.
pub(super) struct ScratchMap(Option<memmap2::Mmap>);

impl std::ops::Deref for ScratchMap {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0.as_deref().unwrap_or(&[])
    }
}

impl Scratch {
    pub(super) fn create(path: PathBuf, buffer: usize) -> Result<Self, WriteError> {
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
    pub(super) fn append(&mut self, bytes: &[u8]) -> Result<u64, WriteError> {
        self.out
            .write_all(bytes)
            .map_err(|e| WriteError::io(&self.path, e))?;
        let at = self.len;
        self.len += bytes.len() as u64;
        Ok(at)
    }

    pub(super) fn flush(&mut self) -> Result<(), WriteError> {
        self.out.flush().map_err(|e| WriteError::io(&self.path, e))
    }

    /// Fills `buf` from offset `at` (flushing what is buffered first), with one positioned
    /// read: the read handle's cursor does not move.
    pub(super) fn read_at(&mut self, at: u64, buf: &mut [u8]) -> Result<(), WriteError> {
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
    pub(super) fn map(&mut self) -> Result<ScratchMap, WriteError> {
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
    pub(super) fn range(&self, start: u64, end: u64) -> Result<impl Read + '_, WriteError> {
        let mut f = &self.read;
        f.seek(SeekFrom::Start(start))
            .map_err(|e| WriteError::io(&self.path, e))?;
        Ok(BufReader::with_capacity(
            SCRATCH_BUFFER,
            f.take(end.saturating_sub(start)),
        ))
    }

    /// Empties the file for reuse.
    pub(super) fn clear(&mut self) -> Result<(), WriteError> {
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
pub(super) struct Files {
    pub(super) spill: Scratch,
    pub(super) rows: Scratch,
    pub(super) keys: Scratch,
    pub(super) tensors: Scratch,
    pub(super) reports: Scratch,
}

impl Files {
    pub(super) fn create(w: &TaskWriter) -> Result<Self, WriteError> {
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

    pub(super) fn row(&mut self, id: u32) -> Result<RowRec, WriteError> {
        let mut b = [0u8; RowRec::LEN];
        self.rows
            .read_at(u64::from(id) * RowRec::LEN as u64, &mut b)?;
        Ok(RowRec::decode(&b))
    }

    /// The open shard's tensor record number `i`.
    pub(super) fn tensor(&mut self, i: u64) -> Result<TensorRec, WriteError> {
        let mut b = [0u8; TensorRec::LEN];
        self.tensors.read_at(i * TensorRec::LEN as u64, &mut b)?;
        TensorRec::decode(&b).ok_or_else(|| WriteError::io(&self.tensors.path, corrupt()))
    }
}

pub(super) fn corrupt() -> std::io::Error {
    std::io::Error::other("scratch record out of range")
}

pub(super) fn le_u32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

pub(super) fn le_u64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

pub(super) fn dtype_of(code: u8) -> Option<Dtype> {
    DTYPES.get(usize::from(code)).map(|d| d.dtype)
}

/// A row the task has written (`rows` file).
pub(super) struct RowRec {
    /// The key's bytes are `key_off..key_off + key_len` of the `keys` file.
    pub(super) key_off: u64,
    pub(super) key_len: u32,
    /// The previous row whose key has the same 32-bit hash ([`NO_ROW`]: none).
    pub(super) next: u32,
    /// Partition row number.
    pub(super) row: u64,
}

impl RowRec {
    pub(super) const LEN: usize = 24;

    pub(super) fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&self.key_off.to_le_bytes());
        b[8..12].copy_from_slice(&self.key_len.to_le_bytes());
        b[12..16].copy_from_slice(&self.next.to_le_bytes());
        b[16..24].copy_from_slice(&self.row.to_le_bytes());
        b
    }

    pub(super) fn decode(b: &[u8; Self::LEN]) -> Self {
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
pub(super) struct TensorRec {
    pub(super) start: u64,
    pub(super) len: u64,
    pub(super) shape: u32,
    pub(super) dtype: Dtype,
}

impl TensorRec {
    pub(super) const LEN: usize = 24;

    pub(super) fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&self.start.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..20].copy_from_slice(&self.shape.to_le_bytes());
        b[20] = self.dtype as u8;
        b
    }

    pub(super) fn decode(b: &[u8; Self::LEN]) -> Option<Self> {
        Some(TensorRec {
            start: le_u64(b, 0),
            len: le_u64(b, 8),
            shape: le_u32(b, 16),
            dtype: dtype_of(b[20])?,
        })
    }
}

/// A sealed tensor as the task report needs it (`reports` file): fixed fields, then the key.
pub(super) struct ReportRec {
    /// The task's row id (position in the `rows` file).
    pub(super) row: u32,
    pub(super) column: u32,
    pub(super) shape: u32,
    pub(super) dtype: Dtype,
    /// Absolute byte range in the shard file.
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) key: String,
}

impl ReportRec {
    pub(super) const FIXED: usize = 33;

    pub(super) fn append(&self, out: &mut Scratch) -> Result<(), WriteError> {
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
    pub(super) fn read_next(&mut self, r: &mut impl Read) -> std::io::Result<bool> {
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

    pub(super) fn empty() -> Self {
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
pub(super) struct Spread(u64);

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
pub(super) struct Shapes {
    pub(super) list: Vec<Vec<u64>>,
    pub(super) index: HashMap<Vec<u64>, u32>,
}

impl Shapes {
    pub(super) fn intern(&mut self, shape: &[u64]) -> Result<u32, WriteError> {
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

    pub(super) fn get(&self, id: u32) -> &[u64] {
        self.list.get(id as usize).map_or(&[], Vec::as_slice)
    }
}

/// The name of a sealed tensor: `key + separator + column`.
pub(super) fn tensor_name(columns: &[String], separator: &str, t: &ReportRec) -> String {
    let column = columns.get(t.column as usize).map_or("", String::as_str);
    format!("{}{separator}{column}", t.key)
}
