//! Streaming SHA-256 of a whole file and of byte ranges of it (the tensors), in one pass with a
//! fixed buffer: memory does not grow with the file, only with the ranges open at one position.

use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::Read;
use std::path::Path;

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

/// Reads `path` once, hashing the whole file and each absolute byte range `[begin, end)` of
/// `ranges` (ranges may overlap, share bytes or be empty). `file_len` is the length the ranges
/// were judged against; a file whose length changed while it was read is an error.
pub fn hash_file(path: &Path, ranges: &[[u64; 2]], file_len: u64) -> std::io::Result<FileHashes> {
    let mut file = File::open(path)?;
    let usable = |[b, e]: [u64; 2]| b <= e && e <= file_len;
    let mut order: Vec<usize> = (0..ranges.len())
        .filter(|&i| ranges.get(i).is_some_and(|r| usable(*r) && r[0] < r[1]))
        .collect();
    order.sort_by_key(|&i| ranges.get(i).map(|r| r[0]));
    let mut results: Vec<Option<String>> = ranges
        .iter()
        .map(|r| (usable(*r) && r[0] == r[1]).then(|| hex(&Sha256::digest(b""))))
        .collect();

    let mut whole = Sha256::new();
    let mut buf = vec![0u8; BUFFER];
    let mut next = 0usize;
    let mut open: Vec<(usize, u64, u64, Sha256)> = Vec::new();
    let mut pos = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let chunk = buf.get(..n).unwrap_or_default();
        let chunk_end = pos + n as u64;
        whole.update(chunk);
        while let Some(&i) = order.get(next) {
            let Some(&[b, e]) = ranges.get(i) else { break };
            if b >= chunk_end {
                break;
            }
            open.push((i, b, e, Sha256::new()));
            next += 1;
        }
        for (_, b, e, h) in open.iter_mut() {
            let lo = (*b).max(pos) - pos;
            let hi = (*e).min(chunk_end) - pos;
            if let Some(part) = chunk.get(lo as usize..hi as usize) {
                h.update(part);
            }
        }
        let mut k = 0;
        while k < open.len() {
            if open.get(k).is_some_and(|o| o.2 <= chunk_end) {
                let (i, _, _, h) = open.swap_remove(k);
                if let Some(slot) = results.get_mut(i) {
                    *slot = Some(hex(&h.finalize()));
                }
            } else {
                k += 1;
            }
        }
        pos = chunk_end;
    }
    if pos != file_len {
        return Err(std::io::Error::other(format!(
            "the file changed while it was read: {file_len} bytes expected, {pos} read"
        )));
    }
    Ok(FileHashes {
        file: hex(&whole.finalize()),
        ranges: results,
        bytes: pos,
    })
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
        let data: Vec<u8> = (0..(3 * BUFFER + 123))
            .map(|i| (i * 7 % 251) as u8)
            .collect();
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
        ];
        let h = hash_file(&path, &ranges, len).unwrap();
        assert_eq!(h.file, sha(&data));
        assert_eq!(h.bytes, len);
        for (r, got) in ranges.iter().zip(&h.ranges).take(5) {
            assert_eq!(
                got.as_deref(),
                Some(sha(&data[r[0] as usize..r[1] as usize]).as_str())
            );
        }
        assert_eq!(h.ranges[5], None);
        assert_eq!(h.ranges[6], None);
        let err = hash_file(&path, &[], len + 1).unwrap_err();
        assert!(
            err.to_string().contains("changed while it was read"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
