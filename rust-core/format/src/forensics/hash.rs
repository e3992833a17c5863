//! Streaming SHA-256 of a whole file and of byte ranges of it (the tensors), in one pass with a
//! fixed buffer: memory does not grow with the file, only with the ranges open at one position.

use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

/// Bytes read per `read` call.
pub const BUFFER: usize = 1 << 20;

/// SHA-256 digests of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHashes {
    /// Of every byte of the file, lower-case hex (what `sha256sum` prints).
    pub file: String,
    /// Per requested range, in the order given: `None` when the range does not lie within the
    /// file (or ends before it begins).
    pub ranges: Vec<Option<String>>,
    /// Bytes hashed (the file's length when it was read).
    pub bytes: u64,
}

/// Lower-case hex of a digest.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// Files at least this long get their whole-file digest on a second thread.
pub const PARALLEL_FROM: u64 = 8 << 20;

/// Buffers queued between the reading thread and the whole-file digest thread.
const IN_FLIGHT: usize = 4;

/// Buffers allocated at most: those queued, one being hashed, one being read.
const MAX_BUFFERS: usize = IN_FLIGHT + 2;

/// Reads `path` once, hashing the whole file and each absolute byte range `[begin, end)` of
/// `ranges` (ranges may overlap, share bytes or be empty). `file_len` is the length the ranges
/// were judged against; a file whose length changed while it was read is an error.
///
/// From [`PARALLEL_FROM`] bytes on (and when there are ranges to hash), the whole-file digest
/// runs on a second thread fed the same buffers, so the two digests of every byte overlap.
/// Memory: at most [`MAX_BUFFERS`] buffers of [`BUFFER`] bytes, whatever the file's size.
pub fn hash_file(path: &Path, ranges: &[[u64; 2]], file_len: u64) -> std::io::Result<FileHashes> {
    let mut file = crate::file::open_regular(path)?;
    let mut tensors = RangeHashes::new(ranges, file_len);
    let (file_digest, pos) = if file_len >= PARALLEL_FROM && !tensors.order.is_empty() {
        std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<(Arc<Vec<u8>>, usize)>(IN_FLIGHT);
            let (back_tx, back_rx) = std::sync::mpsc::channel::<Arc<Vec<u8>>>();
            let whole = s.spawn(move || {
                let mut h = Sha256::new();
                for (buf, n) in rx {
                    h.update(buf.get(..n).unwrap_or_default());
                    // The reader may have gone: then the buffer is simply dropped.
                    let _ = back_tx.send(buf);
                }
                h.finalize()
            });
            let mut spare: Vec<Arc<Vec<u8>>> = Vec::new();
            let mut allocated = 0usize;
            let mut pos = 0u64;
            let read = loop {
                spare.extend(back_rx.try_iter());
                let mut buf = match spare.pop() {
                    Some(b) => b,
                    None if allocated < MAX_BUFFERS => {
                        allocated += 1;
                        Arc::new(vec![0u8; BUFFER])
                    }
                    // Every buffer is queued or being hashed: wait for one to come back.
                    None => match back_rx.recv() {
                        Ok(b) => b,
                        Err(_) => break Err(std::io::Error::other("the digest thread stopped")),
                    },
                };
                let Some(bytes) = Arc::get_mut(&mut buf) else {
                    break Err(std::io::Error::other("hash buffer still shared"));
                };
                let n = match read_some(&mut file, bytes) {
                    Ok(0) => break Ok(()),
                    Ok(n) => n,
                    Err(e) => break Err(e),
                };
                tensors.update(pos, buf.get(..n).unwrap_or_default());
                pos += n as u64;
                if tx.send((buf, n)).is_err() {
                    break Err(std::io::Error::other("the digest thread stopped"));
                }
            };
            drop(tx);
            let digest = whole
                .join()
                .map_err(|_| std::io::Error::other("the digest thread panicked"))?;
            read.map(|()| (digest, pos))
        })?
    } else {
        let mut whole = Sha256::new();
        let mut buf = vec![0u8; BUFFER.min(file_len.max(1) as usize)];
        let mut pos = 0u64;
        loop {
            let n = read_some(&mut file, &mut buf)?;
            if n == 0 {
                break;
            }
            let chunk = buf.get(..n).unwrap_or_default();
            whole.update(chunk);
            tensors.update(pos, chunk);
            pos += n as u64;
        }
        (whole.finalize(), pos)
    };
    if pos != file_len {
        return Err(std::io::Error::other(format!(
            "the file changed while it was read: {file_len} bytes expected, {pos} read"
        )));
    }
    Ok(FileHashes {
        file: hex(&file_digest),
        ranges: tensors.results,
        bytes: pos,
    })
}

/// `read` that retries on `Interrupted`.
fn read_some(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match file.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// The digests of byte ranges, fed the file chunk by chunk in order.
struct RangeHashes<'a> {
    ranges: &'a [[u64; 2]],
    /// Non-empty ranges within the file, by begin.
    order: Vec<usize>,
    next: usize,
    /// Ranges begun and not yet ended: (index, end, digest so far).
    open: Vec<(usize, u64, Sha256)>,
    results: Vec<Option<String>>,
}

impl<'a> RangeHashes<'a> {
    fn new(ranges: &'a [[u64; 2]], file_len: u64) -> Self {
        let usable = |[b, e]: [u64; 2]| b <= e && e <= file_len;
        let mut order: Vec<usize> = (0..ranges.len())
            .filter(|&i| ranges.get(i).is_some_and(|r| usable(*r) && r[0] < r[1]))
            .collect();
        order.sort_by_key(|&i| ranges.get(i).map(|r| r[0]));
        let results = ranges
            .iter()
            .map(|r| (usable(*r) && r[0] == r[1]).then(|| hex(&Sha256::digest(b""))))
            .collect();
        RangeHashes {
            ranges,
            order,
            next: 0,
            open: Vec::new(),
            results,
        }
    }

    /// Feeds the file bytes `[pos, pos + chunk.len())`.
    fn update(&mut self, pos: u64, chunk: &[u8]) {
        let chunk_end = pos + chunk.len() as u64;
        while let Some(&i) = self.order.get(self.next) {
            let Some(&[b, e]) = self.ranges.get(i) else {
                break;
            };
            if b >= chunk_end {
                break;
            }
            self.open.push((i, e, Sha256::new()));
            self.next += 1;
        }
        let ranges = self.ranges;
        for (i, e, h) in self.open.iter_mut() {
            let b = ranges.get(*i).map_or(0, |r| r[0]);
            let lo = b.max(pos) - pos;
            let hi = (*e).min(chunk_end) - pos;
            if let Some(part) = chunk.get(lo as usize..hi as usize) {
                h.update(part);
            }
        }
        let mut k = 0;
        while k < self.open.len() {
            if self.open.get(k).is_some_and(|o| o.1 <= chunk_end) {
                let (i, _, h) = self.open.swap_remove(k);
                if let Some(slot) = self.results.get_mut(i) {
                    *slot = Some(hex(&h.finalize()));
                }
            } else {
                k += 1;
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sha(bytes: &[u8]) -> String {
        hex(&Sha256::digest(bytes))
    }

    #[test]
    fn known_vector_and_ranges_across_buffer_boundaries() {
        assert_eq!(
            sha(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let dir = std::env::temp_dir().join(format!("st-hash-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.bin");
        // One file hashed on one thread, one large enough for the second digest thread.
        for size in [3 * BUFFER + 123, PARALLEL_FROM as usize + BUFFER / 2 + 7] {
            let data: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
            std::fs::write(&path, &data).unwrap();
            let len = data.len() as u64;
            let b = BUFFER as u64;
            let ranges = [
                [0, 10],
                [b - 5, 2 * b + 9],
                [5, 5],
                [b - 5, b + 1],
                [len - 3, len],
                [len - 3, len + 1],
                [9, 4],
                [0, len],
            ];
            let h = hash_file(&path, &ranges, len).unwrap();
            assert_eq!(h.file, sha(&data));
            assert_eq!(h.bytes, len);
            for (r, got) in ranges.iter().zip(&h.ranges) {
                let want =
                    (r[0] <= r[1] && r[1] <= len).then(|| sha(&data[r[0] as usize..r[1] as usize]));
                assert_eq!(got, &want, "{r:?} of {len}");
            }
            let err = hash_file(&path, &ranges, len + 1).unwrap_err();
            assert!(
                err.to_string().contains("changed while it was read"),
                "{err}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
