//! Writing safetensors files (temporary sibling + rename) and reading them through positioned
//! reads (never a memory map: spec/format.md §"Reading a file that changes").

use crate::error::FormatError;
use crate::header::{self, FilePlan, Header, TensorEntry, TensorInfo, PREFIX_LEN};
use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// What a finished write produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenFile {
    pub path: PathBuf,
    /// File length in bytes.
    pub bytes: u64,
    /// Tensors in data order with their offsets.
    pub tensors: Vec<TensorInfo>,
    /// Absolute offset of the data section (8 + N).
    pub data_start: u64,
    /// CRC-32C (Castagnoli) of the whole file, computed from the bytes as they were written
    /// (no second read; spec/dataset.md §5 `shards[].crc32c`).
    pub crc32c: u32,
}

/// A [`Write`] that keeps the CRC-32C (Castagnoli, hardware accelerated where the CPU has it)
/// of every byte written through it. [`FileWriter`] puts it under its buffer, so the checksum is
/// updated once per flushed buffer, not per small write.
#[derive(Debug)]
pub struct Crc32cWriter<W> {
    inner: W,
    crc: u32,
}

impl<W> Crc32cWriter<W> {
    pub fn new(inner: W) -> Self {
        Crc32cWriter { inner, crc: 0 }
    }

    /// The CRC-32C of the bytes written so far.
    pub fn crc32c(&self) -> u32 {
        self.crc
    }

    pub fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: Write> Write for Crc32cWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The way a CRC-32C is written in a manifest: 8 lowercase hex digits.
pub fn crc32c_hex(crc: u32) -> String {
    format!("{crc:08x}")
}

/// `crc` (the CRC-32C of the bytes before) extended by `bytes`: a checksum computed from a
/// stream of pieces (a remote object read in chunks).
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, bytes)
}

/// The CRC-32C of everything `r` yields, read in 1 MiB chunks.
pub fn crc32c_of(mut r: impl Read) -> std::io::Result<u32> {
    let mut buf = vec![0u8; 1 << 20];
    let mut crc = 0u32;
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => return Ok(crc),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        crc = crc32c::crc32c_append(crc, &buf[..n]);
    }
}

/// Streams one safetensors file: the header is fixed up front from the tensors' names, dtypes
/// and shapes; the data is then written in [`FileWriter::tensors`] order. The file appears at its
/// destination only on [`FileWriter::finish`]; until then it is a hidden temporary sibling, which
/// [`FileWriter::abort`] (or dropping the writer) deletes.
pub struct FileWriter {
    dest: PathBuf,
    tmp: PathBuf,
    out: Option<BufWriter<Crc32cWriter<File>>>,
    plan: FilePlan,
    /// Length of the prefix and header (written first; its bytes are not kept).
    header_len: u64,
    written: u64,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A hidden sibling of `dest` that is unique within this process and across processes.
pub fn temp_sibling(dest: &Path) -> PathBuf {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    dest.with_file_name(format!(".{name}.{}-{n}.tmp", std::process::id()))
}

impl FileWriter {
    /// Plans the file, creates the temporary file and writes the header.
    pub fn create(
        dest: impl AsRef<Path>,
        metadata: Option<&BTreeMap<String, String>>,
        entries: Vec<TensorEntry>,
    ) -> Result<Self, FormatError> {
        Self::create_planned(dest, header::plan_file(metadata, entries)?)
    }

    /// Creates the temporary file and writes the header of a file planned by the caller
    /// (e.g. with [`header::serialize_entries`]; `plan.tensors` may then be empty: they are
    /// used only to name a tensor in errors and in [`WrittenFile::tensors`]). The header bytes
    /// are released once written.
    pub fn create_planned(dest: impl AsRef<Path>, plan: FilePlan) -> Result<Self, FormatError> {
        let dest = dest.as_ref().to_path_buf();
        let tmp = temp_sibling(&dest);
        let file = File::create(&tmp).map_err(|e| FormatError::io(&tmp, e))?;
        let mut writer = FileWriter {
            dest,
            out: Some(BufWriter::with_capacity(1 << 20, Crc32cWriter::new(file))),
            tmp,
            header_len: plan.header_bytes.len() as u64,
            plan,
            written: 0,
        };
        let header = std::mem::take(&mut writer.plan.header_bytes);
        writer.write_raw(&header)?;
        Ok(writer)
    }

    /// Creates the temporary file (written through a `buffer`-byte buffer) and lets
    /// `write_header` stream the prefix and header into it (e.g. with
    /// [`header::write_entries`]), returning their length; `data_len` data bytes must follow. Nothing of the header is kept: errors name no tensor, and
    /// [`WrittenFile::tensors`] is empty.
    pub fn create_with_header(
        dest: impl AsRef<Path>,
        data_len: u64,
        buffer: usize,
        write_header: impl FnOnce(&mut BufWriter<Crc32cWriter<File>>, &Path) -> Result<u64, FormatError>,
    ) -> Result<Self, FormatError> {
        let dest = dest.as_ref().to_path_buf();
        let tmp = temp_sibling(&dest);
        let file = File::create(&tmp).map_err(|e| FormatError::io(&tmp, e))?;
        let mut writer = FileWriter {
            dest,
            out: Some(BufWriter::with_capacity(buffer, Crc32cWriter::new(file))),
            tmp,
            header_len: 0,
            plan: FilePlan {
                tensors: Vec::new(),
                header_bytes: Vec::new(),
                data_len,
            },
            written: 0,
        };
        // Dropping `writer` on an error deletes the temporary file.
        let out = writer.out.as_mut().ok_or_else(|| {
            FormatError::io(
                &writer.tmp,
                std::io::Error::other("writer already finished"),
            )
        })?;
        writer.header_len = write_header(out, &writer.tmp)?;
        Ok(writer)
    }

    /// The tensors in the order their data must be written, with their offsets.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.plan.tensors
    }

    /// Appends data bytes (the tensors' bytes back to back, in [`FileWriter::tensors`] order).
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), FormatError> {
        let remaining = self.plan.data_len - self.written;
        if bytes.len() as u64 > remaining {
            let name = self
                .plan
                .tensors
                .last()
                .map(|t| t.name.clone())
                .unwrap_or_default();
            return Err(FormatError::DataLengthMismatch {
                name,
                expected: remaining,
                actual: bytes.len() as u64,
            });
        }
        self.write_raw(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn write_raw(&mut self, bytes: &[u8]) -> Result<(), FormatError> {
        match self.out.as_mut() {
            Some(out) => out
                .write_all(bytes)
                .map_err(|e| FormatError::io(&self.tmp, e)),
            None => Err(FormatError::io(
                &self.tmp,
                std::io::Error::other("writer already finished"),
            )),
        }
    }

    /// Checks that every data byte was written, syncs and renames the file into place.
    pub fn finish(self) -> Result<WrittenFile, FormatError> {
        let (written, pending) = self.close()?;
        pending.commit()?;
        Ok(written)
    }

    /// Checks that every data byte was written and flushes it to the temporary file, without
    /// syncing: the file is complete but not in place. [`PendingFile::commit`] (on this thread
    /// or another) syncs and renames it; dropping the [`PendingFile`] deletes it. The returned
    /// [`WrittenFile`] describes the file as it will be at its destination.
    pub fn close(mut self) -> Result<(WrittenFile, PendingFile), FormatError> {
        if self.written != self.plan.data_len {
            let incomplete = self
                .plan
                .tensors
                .iter()
                .find(|t| t.data_offsets[1] > self.written)
                .map(|t| t.name.clone())
                .unwrap_or_default();
            let missing = self.plan.data_len - self.written;
            return Err(FormatError::DataLengthMismatch {
                name: incomplete,
                expected: missing,
                actual: 0,
            });
        }
        let out = self.out.take().ok_or_else(|| {
            FormatError::io(&self.tmp, std::io::Error::other("writer already finished"))
        })?;
        let tmp = std::mem::take(&mut self.tmp);
        let (file, crc) = match out.into_inner() {
            Ok(w) => {
                let crc = w.crc32c();
                (w.into_inner(), crc)
            }
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                return Err(FormatError::io(&tmp, e.into_error()));
            }
        };
        let pending = PendingFile {
            file: Some(file),
            tmp,
            dest: self.dest.clone(),
        };
        let written = WrittenFile {
            path: self.dest.clone(),
            bytes: self.header_len + self.plan.data_len,
            tensors: std::mem::take(&mut self.plan.tensors),
            data_start: self.header_len,
            crc32c: crc,
        };
        Ok((written, pending))
    }

    /// Deletes the temporary file. Nothing appears at the destination.
    pub fn abort(mut self) {
        self.discard();
    }

    fn discard(&mut self) {
        if self.out.take().is_some() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

impl Drop for FileWriter {
    fn drop(&mut self) {
        self.discard();
    }
}

/// A complete file, written to its temporary sibling but neither synced nor in place yet (see
/// [`FileWriter::close`]). [`PendingFile::commit`] syncs it and renames it onto its destination;
/// dropping it uncommitted deletes the temporary file. It owns no thread and may be sent to
/// another thread to be committed there.
#[derive(Debug)]
pub struct PendingFile {
    /// `None` once committed.
    file: Option<File>,
    tmp: PathBuf,
    dest: PathBuf,
}

impl PendingFile {
    /// Where the file appears once committed.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Syncs the file (data and metadata) and renames it onto its destination. On failure the
    /// temporary file is deleted and nothing appears at the destination; the error names the
    /// temporary file (sync) or the destination (rename).
    pub fn commit(mut self) -> Result<(), FormatError> {
        let file = self.file.take().ok_or_else(|| {
            FormatError::io(&self.dest, std::io::Error::other("file already committed"))
        })?;
        if let Err(e) = file.sync_all() {
            drop(file);
            let _ = fs::remove_file(&self.tmp);
            return Err(FormatError::io(&self.tmp, e));
        }
        drop(file);
        if let Err(e) = fs::rename(&self.tmp, &self.dest) {
            let _ = fs::remove_file(&self.tmp);
            return Err(FormatError::io(&self.dest, e));
        }
        Ok(())
    }
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// Orders in-memory tensors as the plan requires, checking each one's byte length.
fn ordered_data<'a>(
    planned: &[TensorInfo],
    tensors: &[(TensorEntry, &'a [u8])],
) -> Result<Vec<&'a [u8]>, FormatError> {
    let by_name: HashMap<&str, &[u8]> = tensors
        .iter()
        .map(|(e, data)| (e.name.as_str(), *data))
        .collect();
    planned
        .iter()
        .map(|t| {
            let data = by_name.get(t.name.as_str()).copied().ok_or_else(|| {
                FormatError::TensorNotFound {
                    name: t.name.clone(),
                }
            })?;
            if data.len() as u64 != t.byte_len() {
                return Err(FormatError::DataLengthMismatch {
                    name: t.name.clone(),
                    expected: t.byte_len(),
                    actual: data.len() as u64,
                });
            }
            Ok(data)
        })
        .collect()
}

/// Writes a whole file from in-memory tensors (temporary sibling + rename).
pub fn write_file(
    dest: impl AsRef<Path>,
    metadata: Option<&BTreeMap<String, String>>,
    tensors: &[(TensorEntry, &[u8])],
) -> Result<WrittenFile, FormatError> {
    let entries = tensors.iter().map(|(e, _)| e.clone()).collect();
    let mut writer = FileWriter::create(dest, metadata, entries)?;
    for data in ordered_data(writer.tensors(), tensors)? {
        writer.write(data)?;
    }
    writer.finish()
}

/// Copies the tensors of `input` that `keep` accepts into a new file at `output`, with
/// `metadata` as its `__metadata__`. `output` may be `input` itself: the source stays open
/// until the new file is renamed over it. Tensors are streamed in chunks of [`COPY_CHUNK`].
pub fn copy_tensors(
    input: &Path,
    output: &Path,
    metadata: Option<&BTreeMap<String, String>>,
    keep: impl Fn(&TensorInfo) -> bool,
) -> Result<WrittenFile, FormatError> {
    let src = SafetensorsFile::open(input)?;
    let entries = src
        .header()
        .tensors
        .iter()
        .filter(|t| keep(t))
        .map(|t| TensorEntry {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
        })
        .collect();
    let mut writer = FileWriter::create(output, metadata, entries)?;
    let order: Vec<String> = writer.tensors().iter().map(|t| t.name.clone()).collect();
    let mut buf = Vec::new();
    for name in &order {
        let info = src
            .header()
            .tensor(name)
            .ok_or_else(|| FormatError::TensorNotFound { name: name.clone() })?;
        let mut pos = src.header().data_start() + info.data_offsets[0];
        let end = src.header().data_start() + info.data_offsets[1];
        while pos < end {
            let n = (end - pos).min(COPY_CHUNK);
            buf.resize(n as usize, 0);
            src.read_at(pos, &mut buf)?;
            writer.write(&buf)?;
            pos += n;
        }
    }
    writer.finish()
}

/// Serialises tensors to bytes in memory, identical to what [`write_file`] writes.
pub fn serialize(
    metadata: Option<&BTreeMap<String, String>>,
    tensors: &[(TensorEntry, &[u8])],
) -> Result<Vec<u8>, FormatError> {
    let entries = tensors.iter().map(|(e, _)| e.clone()).collect();
    let plan = header::plan_file(metadata, entries)?;
    let mut out = Vec::with_capacity(plan.file_len() as usize);
    out.extend_from_slice(&plan.header_bytes);
    for data in ordered_data(&plan.tensors, tensors)? {
        out.extend_from_slice(data);
    }
    Ok(out)
}

/// What a file that is not a regular file is, for messages: `FIFO`, `socket`, `directory`, ….
fn file_kind(t: fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "FIFO";
        }
        if t.is_socket() {
            return "socket";
        }
        if t.is_char_device() {
            return "character device";
        }
        if t.is_block_device() {
            return "block device";
        }
    }
    if t.is_dir() {
        "directory"
    } else if t.is_symlink() {
        "symbolic link"
    } else {
        "unknown type"
    }
}

/// The error for a path that is not a regular file: `not a regular file (FIFO)`.
fn not_regular(t: fs::FileType) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("not a regular file ({})", file_kind(t)),
    )
}

/// Opens a file for reading only if it is a regular file (symbolic links followed). Every reader
/// of files named by a user (header reads, the forensic report, hashing, index files) opens
/// through this one function, so a FIFO, socket or device is reported as such and never read:
/// reading a FIFO blocks forever, reading a device has no end.
///
/// The path is checked first, so a special file is never opened. A regular file replaced by a
/// FIFO between that check and the open cannot block the open either: it is opened with
/// `O_NONBLOCK` (a FIFO opened so for reading returns at once), and the type of the *opened*
/// handle is checked again. On a regular file `O_NONBLOCK` changes nothing.
pub fn open_regular(path: &Path) -> std::io::Result<File> {
    let before = fs::metadata(path)?;
    if !before.is_file() {
        return Err(not_regular(before.file_type()));
    }
    let mut options = fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path)?;
    let after = file.metadata()?;
    if !after.is_file() {
        return Err(not_regular(after.file_type()));
    }
    Ok(file)
}

/// Reads and validates the header of a file without mapping its data.
pub fn read_header(path: impl AsRef<Path>) -> Result<Header, FormatError> {
    let path = path.as_ref();
    let mut file = open_regular(path).map_err(|e| FormatError::io(path, e))?;
    read_header_from(path, &mut file)
}

fn read_header_from(path: &Path, file: &mut File) -> Result<Header, FormatError> {
    let file_len = file.metadata().map_err(|e| FormatError::io(path, e))?.len();
    let mut prefix = [0u8; 8];
    let available = file_len.min(PREFIX_LEN) as usize;
    file.read_exact(&mut prefix[..available])
        .map_err(|e| FormatError::io(path, e))?;
    let header_len = header::check_prefix(&prefix[..available], file_len)?;
    // header_len ≤ 100 MB and ≤ file_len - 8: the allocation is bounded by both.
    let mut json = vec![0u8; header_len as usize];
    file.read_exact(&mut json)
        .map_err(|e| FormatError::io(path, e))?;
    header::parse_header(&json, file_len)
}

/// A validated file whose tensor bytes are read on demand with positioned reads.
///
/// The header is read and validated against the file length when the file is opened; every
/// later read is checked against that length. The file is never memory-mapped: a mapped file
/// truncated by another process kills the reading process with SIGBUS (in the JVM, the whole
/// executor or local-mode driver), while a positioned read of bytes that are gone returns short,
/// which is reported as [`FormatError::Shrank`] naming the file (spec/format.md §"Reading a file
/// that changes").
pub struct SafetensorsFile {
    path: PathBuf,
    header: Header,
    file: File,
}

/// Bytes copied per read by [`copy_tensors`]: a tensor is streamed, never held whole.
const COPY_CHUNK: u64 = 8 << 20;

impl SafetensorsFile {
    /// Opens and validates a file (header against the file's length).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, FormatError> {
        let path = path.as_ref().to_path_buf();
        let mut file = open_regular(&path).map_err(|e| FormatError::io(&path, e))?;
        let header = read_header_from(&path, &mut file)?;
        Ok(SafetensorsFile { path, header, file })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Fills `buf` with the file's bytes from absolute offset `start`. A range beyond the length
    /// the header was validated against is refused without reading; a file that has become
    /// shorter since it was opened is [`FormatError::Shrank`].
    pub fn read_at(&self, start: u64, buf: &mut [u8]) -> Result<(), FormatError> {
        let expected = self.header.file_len();
        let end = start.checked_add(buf.len() as u64);
        if end.is_none_or(|e| e > expected) {
            return Err(FormatError::io(
                &self.path,
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "bytes [{start}, {start}+{}) lie beyond the file's {expected} bytes",
                        buf.len()
                    ),
                ),
            ));
        }
        read_checked(&self.file, &self.path, expected, start, buf)
    }

    /// The file's bytes `range` (absolute offsets), read into a new buffer.
    pub fn read_range(&self, range: std::ops::Range<u64>) -> Result<Vec<u8>, FormatError> {
        let mut buf = vec![0u8; range.end.saturating_sub(range.start) as usize];
        self.read_at(range.start, &mut buf)?;
        Ok(buf)
    }

    /// The bytes of one tensor (little-endian, C order), read into a new buffer.
    pub fn data(&self, tensor: &TensorInfo) -> Result<Vec<u8>, FormatError> {
        let start = self.header.data_start() + tensor.data_offsets[0];
        let end = self.header.data_start() + tensor.data_offsets[1];
        self.read_range(start..end)
    }

    /// Looks a tensor up by name and returns its entry and bytes.
    pub fn tensor(&self, name: &str) -> Result<(&TensorInfo, Vec<u8>), FormatError> {
        let info = self
            .header
            .tensor(name)
            .ok_or_else(|| FormatError::TensorNotFound { name: name.into() })?;
        Ok((info, self.data(info)?))
    }
}

/// Fills `buf` from offset `start` of `file` (named `path`), whose validated length is
/// `expected`: a file now shorter is [`FormatError::Shrank`].
fn read_checked(
    file: &File,
    path: &Path,
    expected: u64,
    start: u64,
    buf: &mut [u8],
) -> Result<(), FormatError> {
    match read_exact_at(file, buf, start) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(FormatError::Shrank {
            path: path.to_path_buf(),
            expected,
            actual: file.metadata().map_or(0, |m| m.len()),
            start,
            end: start + buf.len() as u64,
        }),
        Err(e) => Err(FormatError::io(path, e)),
    }
}

/// `pread` until `buf` is full; `UnexpectedEof` when the file ends first.
#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(windows)]
fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match file.seek_read(buf, offset) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::Dtype;

    fn entry(name: &str, dtype: Dtype, shape: &[u64]) -> TensorEntry {
        TensorEntry {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
        }
    }

    fn tempdir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "st-file-test-{tag}-{}-{}",
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// The writer's CRC-32C is the file's, computed as it wrote (header streamed by
    /// `create_with_header` included); the algorithm is Castagnoli's (check value of RFC 3720).
    #[test]
    fn writer_crc32c_is_the_files() {
        assert_eq!(crc32c_of(&b"123456789"[..]).unwrap(), 0xe306_9283);
        assert_eq!(crc32c_hex(0xe306_9283), "e3069283");
        let dir = tempdir("crc");
        let path = dir.join("a.safetensors");
        let a: Vec<u8> = (0..=255).cycle().take(3 << 20).collect();
        let written =
            write_file(&path, None, &[(entry("a", Dtype::U8, &[3 << 20]), &a[..])]).unwrap();
        let on_disk = crc32c_of(fs::File::open(&path).unwrap()).unwrap();
        assert_eq!(written.crc32c, on_disk);
        let copy = dir.join("b.safetensors");
        let meta = BTreeMap::from([("k".into(), "v".into())]);
        let c = copy_tensors(&path, &copy, Some(&meta), |_| true).unwrap();
        assert_eq!(c.crc32c, crc32c_of(fs::File::open(&copy).unwrap()).unwrap());
        assert_ne!(c.crc32c, written.crc32c);
        let header = fs::read(&path).unwrap()[..written.data_start as usize].to_vec();
        let streamed = dir.join("c.safetensors");
        let mut w = FileWriter::create_with_header(&streamed, 3 << 20, 4096, |out, _| {
            out.write_all(&header).unwrap();
            Ok(header.len() as u64)
        })
        .unwrap();
        w.write(&a).unwrap();
        assert_eq!(w.finish().unwrap().crc32c, on_disk);
    }

    #[test]
    fn write_then_read_back() {
        let dir = tempdir("rw");
        let path = dir.join("a.safetensors");
        let a: Vec<u8> = (0..24).collect();
        let meta = BTreeMap::from([("k".into(), "v".into())]);
        let written = write_file(
            &path,
            Some(&meta),
            &[
                (entry("small", Dtype::U8, &[3]), &[1, 2, 3][..]),
                (entry("attn.0", Dtype::F32, &[1, 2, 3]), &a[..]),
                (entry("empty", Dtype::F64, &[0, 4]), &[][..]),
            ],
        )
        .unwrap();
        assert_eq!(written.bytes, fs::metadata(&path).unwrap().len());
        let file = SafetensorsFile::open(&path).unwrap();
        assert_eq!(file.header().metadata, Some(meta));
        assert_eq!(file.tensor("attn.0").unwrap().1, &a[..]);
        assert_eq!(file.tensor("small").unwrap().1, &[1, 2, 3]);
        assert_eq!(file.tensor("empty").unwrap().1, &[] as &[u8]);
        assert!(matches!(
            file.tensor("nope"),
            Err(FormatError::TensorNotFound { .. })
        ));
        assert_eq!(
            fs::read(&path).unwrap(),
            serialize(
                file.header().metadata.as_ref(),
                &[
                    (entry("small", Dtype::U8, &[3]), &[1, 2, 3][..]),
                    (entry("attn.0", Dtype::F32, &[1, 2, 3]), &a[..]),
                    (entry("empty", Dtype::F64, &[0, 4]), &[][..]),
                ]
            )
            .unwrap()
        );
        // Only the final file is left: no temporary siblings.
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        fs::remove_dir_all(dir).unwrap();
    }

    /// A file truncated after it was opened (header validated) is an error naming it when its
    /// data is read, never a SIGBUS (which the old memory map raised here, killing the test).
    #[test]
    fn a_file_that_shrinks_after_open_is_an_error_naming_it() {
        let dir = tempdir("shrink");
        let path = dir.join("s.safetensors");
        let big: Vec<u8> = (0..64 * 1024).map(|i| i as u8).collect();
        write_file(
            &path,
            None,
            &[(entry("big", Dtype::U8, &[big.len() as u64]), &big[..])],
        )
        .unwrap();
        let file = SafetensorsFile::open(&path).unwrap();
        let cut = file.header().data_start() + 1024;
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(cut)
            .unwrap();
        // Bytes still there read as before.
        let start = file.header().data_start();
        assert_eq!(file.read_range(start..start + 16).unwrap(), &big[..16]);
        let e = file.tensor("big").unwrap_err();
        assert!(
            matches!(e, FormatError::Shrank { ref path, actual, .. }
                if path == &dir.join("s.safetensors") && actual == cut),
            "{e}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains("s.safetensors") && msg.contains("changed while being read"),
            "{msg}"
        );
        // A copy of the shrunk file fails the same way and leaves nothing behind.
        let out = dir.join("copy.safetensors");
        assert!(matches!(
            copy_tensors(&path, &out, None, |_| true),
            Err(FormatError::FileLengthMismatch { .. })
        ));
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn abort_and_drop_leave_nothing_and_short_data_is_an_error() {
        let dir = tempdir("abort");
        let path = dir.join("x.safetensors");
        let mut w = FileWriter::create(&path, None, vec![entry("t", Dtype::I32, &[2])]).unwrap();
        w.write(&[0; 4]).unwrap();
        w.abort();
        {
            let mut w =
                FileWriter::create(&path, None, vec![entry("t", Dtype::I32, &[2])]).unwrap();
            w.write(&[0; 4]).unwrap();
        }
        let mut w = FileWriter::create(&path, None, vec![entry("t", Dtype::I32, &[2])]).unwrap();
        assert!(matches!(
            w.write(&[0; 9]),
            Err(FormatError::DataLengthMismatch { .. })
        ));
        w.write(&[0; 4]).unwrap();
        let e = w.finish().unwrap_err();
        assert!(
            matches!(e, FormatError::DataLengthMismatch { ref name, expected: 4, .. } if name == "t"),
            "{e}"
        );
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
        assert!(matches!(
            write_file(&path, None, &[(entry("t", Dtype::I32, &[2]), &[0; 7][..])]),
            Err(FormatError::DataLengthMismatch {
                expected: 8,
                actual: 7,
                ..
            })
        ));
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn closed_file_is_hidden_until_committed_and_deleted_if_dropped() {
        let dir = tempdir("pending");
        let path = dir.join("p.safetensors");
        let mut w = FileWriter::create(&path, None, vec![entry("t", Dtype::U8, &[3])]).unwrap();
        w.write(&[7, 8, 9]).unwrap();
        let (written, pending) = w.close().unwrap();
        assert_eq!(written.path, path);
        assert_eq!(pending.dest(), path);
        // Complete but only under its hidden temporary name.
        assert!(!path.exists());
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 1);
        assert!(names[0].starts_with(".p.safetensors."), "{names:?}");
        // Committed from another thread.
        std::thread::spawn(move || pending.commit())
            .join()
            .unwrap()
            .unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), written.bytes);
        assert_eq!(
            SafetensorsFile::open(&path).unwrap().tensor("t").unwrap().1,
            &[7, 8, 9]
        );
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        // Dropped uncommitted: nothing is left; the earlier file stays untouched.
        let mut w = FileWriter::create(&path, None, vec![entry("t", Dtype::U8, &[1])]).unwrap();
        w.write(&[1]).unwrap();
        drop(w.close().unwrap());
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        assert_eq!(fs::metadata(&path).unwrap().len(), written.bytes);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn failed_commit_names_the_destination_and_leaves_nothing() {
        let dir = tempdir("pending-fail");
        let path = dir.join("d.safetensors");
        fs::create_dir(&path).unwrap(); // the rename onto a directory fails
        let mut w = FileWriter::create(&path, None, vec![entry("t", Dtype::U8, &[1])]).unwrap();
        w.write(&[1]).unwrap();
        let (_, pending) = w.close().unwrap();
        let e = pending.commit().unwrap_err();
        assert!(
            matches!(e, FormatError::Io { ref path, .. } if path == &dir.join("d.safetensors")),
            "{e}"
        );
        assert!(e.to_string().contains("d.safetensors"), "{e}");
        let names: Vec<_> = fs::read_dir(&dir).unwrap().collect();
        assert_eq!(names.len(), 1); // the directory only, no temporary file
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn reader_rejects_before_mapping() {
        let dir = tempdir("bad");
        let path = dir.join("bad.safetensors");
        let mut bytes = 1000u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        fs::write(&path, &bytes).unwrap();
        assert!(matches!(
            SafetensorsFile::open(&path),
            Err(FormatError::HeaderBeyondFile { .. })
        ));
        fs::write(&path, b"abc").unwrap();
        assert!(matches!(
            read_header(&path),
            Err(FormatError::HeaderTooSmall { file_len: 3 })
        ));
        assert!(matches!(
            read_header(dir.join("missing")),
            Err(FormatError::Io { .. })
        ));
        fs::remove_dir_all(dir).unwrap();
    }

    /// A FIFO with no writer: every reader refuses it at once instead of waiting for a writer,
    /// and an open with `O_NONBLOCK` (the guard against a file swapped for a FIFO after the
    /// check of its path) returns at once on this platform.
    #[cfg(unix)]
    #[test]
    fn special_files_are_refused_without_blocking() {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = tempdir("fifo");
        let fifo = dir.join("f.safetensors");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let guarded = open_regular(&path).map(drop).map_err(|e| e.to_string());
            let header = read_header(&path).map(drop).map_err(|e| e.to_string());
            let mapped = SafetensorsFile::open(&path)
                .map(drop)
                .map_err(|e| e.to_string());
            let nonblocking = fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&path)
                .and_then(|f| f.metadata())
                .map(|m| m.file_type());
            tx.send((guarded, header, mapped, nonblocking)).unwrap();
        });
        let timeout = std::time::Duration::from_secs(20);
        let (guarded, header, mapped, nonblocking) = rx.recv_timeout(timeout).unwrap();
        assert_eq!(guarded.unwrap_err(), "not a regular file (FIFO)");
        assert!(header.unwrap_err().ends_with("not a regular file (FIFO)"));
        assert!(mapped.unwrap_err().ends_with("not a regular file (FIFO)"));
        assert_eq!(
            not_regular(nonblocking.unwrap()).to_string(),
            "not a regular file (FIFO)"
        );
        assert_eq!(
            open_regular(&dir).unwrap_err().to_string(),
            "not a regular file (directory)"
        );
        fs::remove_dir_all(dir).unwrap();
    }
}
