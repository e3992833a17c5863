//! Option `verify_checksums`: every shard the task reads whose manifest records a CRC-32C is
//! streamed whole once and checked against it and its length.

use super::*;

/// A file's CRC-32C computed from its bytes in order: unit, CRC so far, bytes so far.
pub(super) struct Verifying {
    pub(super) unit: usize,
    pub(super) crc: u32,
    pub(super) bytes: u64,
}

/// SHA-256 of a file's bytes supplied in order.
pub(super) struct StreamedDigest {
    pub(super) hasher: Sha256,
    pub(super) pos: u64,
    pub(super) digest: Option<String>,
}

/// The whole file's SHA-256 (hex): a local file is read once more in fixed buffers (the
/// report's [`hash::hash_file`]); a remote one's was streamed through `supply`.
pub(super) fn whole_file_digest(unit: &Unit, source: &Source) -> Result<String, ReadError> {
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

impl ReadTask {
    /// Whether unit `i`'s file must be checked whole against its manifest's CRC-32C before it
    /// is read (read option `verify_checksums`, a manifest entry with `crc32c`, not yet checked
    /// by this task). A local file is checked by [`ReadTask::open_local`]; a remote one is
    /// streamed whole through [`ReadTask::verify_update`], then [`ReadTask::verify_finish`].
    pub fn verify_needed(&self, i: usize) -> Result<bool, ReadError> {
        let file = &self.unit(i)?.file;
        Ok(self.spec.checksums.contains_key(file) && !self.verified.contains(file))
    }

    pub(super) fn recorded(&self, i: usize) -> Result<(String, Option<&ShardChecksum>), ReadError> {
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
    pub(super) fn verify_local(&mut self, i: usize, path: &Path) -> Result<(), ReadError> {
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
}
