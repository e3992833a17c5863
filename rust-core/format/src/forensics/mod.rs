//! Model-lake forensics: a report per safetensors file (sizes, SHA-256 of the file and of every
//! tensor, counts, alignment, model information, flags with levels) and per sharded checkpoint.
//!
//! The format's rules are the strict parser's ([`crate::header`]): the report runs them
//! through [`header::parse_header_items`], [`header::check_placement`],
//! [`header::check_size`] and [`header::check_coverage`] without stopping at the first broken
//! one, so a file gets one flag per problem. Every error-level flag is a rule the strict parser
//! enforces, and the file's `strict_error` is what that parser says. Warnings and infos are
//! heuristics of valid files. `spec/forensics.md` is the contract.
//!
//! * [`flags`] — flag codes, levels, the mapping of format errors onto codes.
//! * [`metadata`] — model information from `__metadata__`, metadata flags.
//! * [`hash`] — the streaming SHA-256 pass.
//! * [`sharded`] — checkpoints split over shards by a `*.safetensors.index.json`.

pub mod flags;
pub mod hash;
pub mod metadata;
pub mod sharded;

pub use flags::{Flag, FlagCode, Level};
pub use metadata::ModelInfo;

use crate::dtype::Dtype;
use crate::error::FormatError;
use crate::header::{self, HeaderItem, TensorInfo, PREFIX_LEN};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// A tensor larger than this many bytes is flagged `huge_tensor` (2 GiB).
pub const HUGE_TENSOR_BYTES: u64 = 1 << 31;

/// Alignments are reported up to this power of two (a page).
pub const MAX_REPORTED_ALIGNMENT: u64 = 4096;

/// What to compute.
#[derive(Debug, Clone, Copy)]
pub struct ReportOptions {
    /// Read every byte to hash the file and its tensors; `false` reads the header only.
    pub hash: bool,
}

/// The outcome of a report: the worst level among its flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// No flag above info.
    Clean,
    /// Warnings, no error.
    Warnings,
    /// At least one error: the strict reader rejects the file (or it cannot be read).
    Invalid,
}

impl Verdict {
    /// The verdict of a list of flags.
    pub fn of(flags: &[Flag]) -> Self {
        match flags.iter().map(|f| f.level).max() {
            Some(Level::Error) => Verdict::Invalid,
            Some(Level::Warning) => Verdict::Warnings,
            _ => Verdict::Clean,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Verdict::Clean => "clean",
            Verdict::Warnings => "warnings",
            Verdict::Invalid => "invalid",
        }
    }
}

/// One tensor of a report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TensorReport {
    pub name: String,
    /// As written in the header (an unknown dtype keeps its text); `None` when unreadable.
    pub dtype: Option<String>,
    pub shape: Option<Vec<u64>>,
    /// Relative to the data section.
    pub data_offsets: [u64; 2],
    /// `end − begin` (0 when reversed).
    pub byte_size: u64,
    /// Element count, when shape is known.
    pub parameters: Option<u64>,
    /// Absolute file offset of the first byte (`8 + N + begin`).
    pub data_start: u64,
    /// The largest power of two (up to 4096) that divides `data_start`.
    pub aligned_to: u64,
    /// SHA-256 of the tensor's bytes; `None` without hashing or when they are not in the file.
    pub sha256: Option<String>,
}

/// The report on one file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FileReport {
    /// Always `"file"` (model reports say `"model"`).
    pub kind: &'static str,
    pub path: String,
    pub verdict: Verdict,
    pub file_size: u64,
    /// N, the header length after the 8-byte prefix, when the prefix could be read.
    pub header_size: Option<u64>,
    /// `8 + N`, the first byte of the data section.
    pub data_start: Option<u64>,
    /// SHA-256 of the whole file (`None` with `--no-hash` or when unreadable).
    pub sha256: Option<String>,
    pub tensor_count: u64,
    /// Elements over every tensor whose shape is known (saturating).
    pub parameter_count: u64,
    /// Bytes spanned by tensors, per dtype name.
    pub bytes_per_dtype: BTreeMap<String, u64>,
    /// What the strict reader says when it rejects the file.
    pub strict_error: Option<String>,
    pub flags: Vec<Flag>,
    pub model_info: ModelInfo,
    /// `__metadata__` keys outside the allowlist.
    pub unlisted_metadata_keys: Vec<String>,
    /// The whole `__metadata__` map, as written.
    pub metadata: Option<BTreeMap<String, String>>,
    /// Tensors in data order (by offsets).
    pub tensors: Vec<TensorReport>,
}

impl FileReport {
    fn empty(path: &str, file_size: u64) -> Self {
        FileReport {
            kind: "file",
            path: path.to_owned(),
            verdict: Verdict::Clean,
            file_size,
            header_size: None,
            data_start: None,
            sha256: None,
            tensor_count: 0,
            parameter_count: 0,
            bytes_per_dtype: BTreeMap::new(),
            strict_error: None,
            flags: Vec::new(),
            model_info: ModelInfo::default(),
            unlisted_metadata_keys: Vec::new(),
            metadata: None,
            tensors: Vec::new(),
        }
    }

    /// The worst level among the flags, if any.
    pub fn worst(&self) -> Option<Level> {
        self.flags.iter().map(|f| f.level).max()
    }
}

/// Reports on one file: reads its prefix and header (and, with `opts.hash`, every byte once).
/// Never fails: an unreadable file gets an `unreadable` flag naming the OS error.
pub fn report_file(path: &Path, opts: ReportOptions) -> FileReport {
    let label = path.display().to_string();
    let unreadable = |e: std::io::Error, size: u64| {
        let mut r = FileReport::empty(&label, size);
        r.flags.push(Flag::from_format_error(&FormatError::Io {
            path: path.to_path_buf(),
            source: e,
        }));
        r.verdict = Verdict::Invalid;
        r
    };
    let mut file = match crate::file::open_regular(path) {
        Ok(f) => f,
        Err(e) => return unreadable(e, 0),
    };
    let file_len = match file.metadata() {
        Ok(m) => m.len(),
        Err(e) => return unreadable(e, 0),
    };
    let mut prefix = [0u8; 8];
    let available = file_len.min(PREFIX_LEN) as usize;
    if let Err(e) = file.read_exact(prefix.get_mut(..available).unwrap_or_default()) {
        return unreadable(e, file_len);
    }
    let prefix = prefix.get(..available).unwrap_or_default();
    let mut report = analyze(&label, file_len, prefix, |n| {
        // `analyze` calls this only after check_prefix: n ≤ 100 MB and 8 + n ≤ file_len.
        let mut json = vec![0u8; n as usize];
        file.read_exact(&mut json)
            .map(|()| json)
            .map_err(|e| FormatError::io(path, e))
    });
    if opts.hash && !report.flags.iter().any(|f| f.code == FlagCode::Unreadable) {
        let ranges: Vec<[u64; 2]> = report
            .tensors
            .iter()
            .map(|t| {
                let end = t
                    .data_start
                    .checked_add(t.data_offsets[1].saturating_sub(t.data_offsets[0]));
                end.map_or([1, 0], |end| [t.data_start, end])
            })
            .collect();
        match hash::hash_file(path, &ranges, file_len) {
            Ok(h) => {
                report.sha256 = Some(h.file);
                for (t, digest) in report.tensors.iter_mut().zip(h.ranges) {
                    t.sha256 = digest;
                }
            }
            Err(e) => {
                report.flags.push(Flag::from_format_error(&FormatError::Io {
                    path: path.to_path_buf(),
                    source: e,
                }));
                report.verdict = Verdict::Invalid;
            }
        }
    }
    report
}

/// Reports on a file held in memory (no hashes).
pub fn report_bytes(label: &str, bytes: &[u8]) -> FileReport {
    let prefix = bytes.get(..8).unwrap_or(bytes);
    analyze(label, bytes.len() as u64, prefix, |n| {
        Ok(bytes.get(8..8 + n as usize).unwrap_or_default().to_vec())
    })
}

/// A tensor whose offsets could be read, with whatever else could.
struct Placed {
    name: String,
    dtype: Option<Dtype>,
    dtype_text: Option<String>,
    shape: Option<Vec<u64>>,
    offsets: [u64; 2],
}

/// The header analysis: the format's rules without stopping at the first broken one, then the
/// heuristics. `read_json(n)` returns the N header bytes after the prefix.
fn analyze(
    label: &str,
    file_len: u64,
    prefix: &[u8],
    read_json: impl FnOnce(u64) -> Result<Vec<u8>, FormatError>,
) -> FileReport {
    let mut r = FileReport::empty(label, file_len);
    let finish = |mut r: FileReport, e: FormatError| {
        r.strict_error = Some(e.to_string());
        r.flags.push(Flag::from_format_error(&e));
        r.verdict = Verdict::of(&r.flags);
        r
    };
    let header_len = match header::check_prefix(prefix, file_len) {
        Ok(n) => n,
        Err(e) => return finish(r, e),
    };
    r.header_size = Some(header_len);
    let data_start = PREFIX_LEN + header_len;
    r.data_start = Some(data_start);
    let json = match read_json(header_len) {
        Ok(j) => j,
        Err(e) => return finish(r, e),
    };
    let items = match header::parse_header_items(&json) {
        Ok(items) => items,
        Err(e) => return finish(r, e),
    };

    // Rules 6–8, each entry on its own.
    let mut placed: Vec<Placed> = Vec::with_capacity(items.len());
    let mut all_placed = true;
    let mut complete: Vec<TensorInfo> = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Err(e) => r.flags.push(Flag::from_format_error(&e)),
            Ok(HeaderItem::Metadata(Ok(m))) => r.metadata = m,
            Ok(HeaderItem::Metadata(Err(e))) => r.flags.push(Flag::from_format_error(&e)),
            Ok(HeaderItem::Tensor(parts)) => {
                let parts = *parts;
                r.tensor_count += 1;
                let not_object =
                    matches!(parts.entry_error, Some(FormatError::TensorNotObject { .. }));
                if let Some(e) = &parts.entry_error {
                    r.flags.push(Flag::from_format_error(e));
                }
                let dtype_text = match &parts.dtype {
                    Ok(d) => Some(d.name().to_owned()),
                    Err(FormatError::UnknownDtype { dtype, .. }) => Some(dtype.clone()),
                    Err(_) => None,
                };
                if !not_object {
                    for e in [parts.dtype.as_ref().err(), parts.shape.as_ref().err()]
                        .into_iter()
                        .flatten()
                        .chain(parts.data_offsets.as_ref().err())
                    {
                        r.flags.push(Flag::from_format_error(e));
                    }
                }
                match parts.data_offsets {
                    Ok(offsets) => {
                        let (dtype, shape) = (parts.dtype.ok(), parts.shape.ok());
                        if let (Some(d), Some(s)) = (dtype, &shape) {
                            complete.push(TensorInfo {
                                name: parts.name.clone(),
                                dtype: d,
                                shape: s.clone(),
                                data_offsets: offsets,
                            });
                        }
                        placed.push(Placed {
                            name: parts.name,
                            dtype,
                            dtype_text,
                            shape,
                            offsets,
                        });
                    }
                    Err(_) => all_placed = false,
                }
            }
        }
    }

    // Rules 9–13 in data order, carrying on after each broken one.
    placed.sort_by_key(|p| p.offsets);
    let mut cursor = 0u64;
    let mut last: Option<(String, [u64; 2])> = None;
    for p in &placed {
        let [begin, end] = p.offsets;
        if let Err(e) = header::check_placement(&p.name, p.offsets, cursor) {
            let mut flag = Flag::from_format_error(&e);
            match (&e, &last) {
                (FormatError::OffsetOverlap { .. }, Some((prev, [pb, pe]))) => {
                    flag.message = format!(
                        "{} (tensor `{}` at [{pb}, {pe}])",
                        flag.message,
                        metadata::escape(prev)
                    );
                }
                // A hole is judged only when every tensor's place is known.
                (FormatError::OffsetHole { .. }, _) if !all_placed => continue,
                _ => {}
            }
            r.flags.push(flag);
            if end < begin {
                continue;
            }
        }
        if let (Some(dtype), Some(shape)) = (p.dtype, &p.shape) {
            let t = TensorInfo {
                name: p.name.clone(),
                dtype,
                shape: shape.clone(),
                data_offsets: p.offsets,
            };
            if let Err(e) = header::check_size(&t) {
                r.flags.push(Flag::from_format_error(&e));
            }
        }
        if end >= cursor {
            cursor = end;
            last = Some((p.name.clone(), p.offsets));
        }
    }

    // Rule 14.
    match header::check_coverage(header_len, cursor, file_len) {
        Ok(()) => {}
        Err(FormatError::FileLengthMismatch { expected, .. }) if expected < file_len => {
            if all_placed {
                r.flags.push(Flag::new(
                    FlagCode::BytesOutsideTensors,
                    None,
                    format!(
                        "{} bytes after the last tensor's data (file bytes [{expected}, {file_len}) belong to no tensor)",
                        file_len - expected
                    ),
                ));
            }
        }
        Err(_) => {
            let past: Vec<&Placed> = placed
                .iter()
                .filter(|p| {
                    data_start
                        .checked_add(p.offsets[1])
                        .is_none_or(|e| e > file_len)
                })
                .collect();
            for p in past {
                r.flags.push(Flag::new(
                    FlagCode::DataPastEnd,
                    Some(&p.name),
                    format!(
                        "tensor `{}`: data_offsets [{}, {}] end at file byte {}, past the end of the {file_len}-byte file",
                        metadata::escape(&p.name),
                        p.offsets[0],
                        p.offsets[1],
                        u128::from(data_start) + u128::from(p.offsets[1])
                    ),
                ));
            }
        }
    }

    // The strict reader's verdict; any rule it enforces that the walk above did not flag (none
    // should exist) still becomes a flag.
    if let Err(e) = header::parse_header(&json, file_len) {
        if !r.flags.iter().any(|f| f.level == Level::Error) {
            r.flags.push(Flag::from_format_error(&e));
        }
        r.strict_error = Some(e.to_string());
    }

    // Tensors, counts and the heuristics.
    for p in &placed {
        let [begin, end] = p.offsets;
        let start = data_start.saturating_add(begin);
        let parameters = p
            .shape
            .as_ref()
            .and_then(|s| s.iter().try_fold(1u64, |a, &d| a.checked_mul(d)));
        let byte_size = end.saturating_sub(begin);
        r.parameter_count = r.parameter_count.saturating_add(parameters.unwrap_or(0));
        if let Some(d) = &p.dtype_text {
            let b = r.bytes_per_dtype.entry(d.clone()).or_default();
            *b = b.saturating_add(byte_size);
        }
        r.tensors.push(TensorReport {
            name: p.name.clone(),
            dtype: p.dtype_text.clone(),
            shape: p.shape.clone(),
            data_offsets: p.offsets,
            byte_size,
            parameters,
            data_start: start,
            aligned_to: alignment(start),
            sha256: None,
        });
    }
    // Data order, as the strict reader sorts (stable over JSON order): a valid file's warnings
    // come out in the order of `Header::tensors`, so `header_flags` gives the same list.
    complete.sort_by_key(|t| t.data_offsets);
    r.flags
        .extend(content_flags(&complete, data_start, r.metadata.as_ref()));
    if let Some(meta) = &r.metadata {
        r.unlisted_metadata_keys = metadata::check_metadata(meta).1;
        r.model_info = metadata::model_info(meta);
    }
    r.verdict = Verdict::of(&r.flags);
    r
}

/// The warnings and infos of a header the strict reader accepted (a valid file has no error
/// flag): the same flags, in the same order, as [`report_file`] gives that file. For callers
/// that hold a validated [`Header`](crate::header::Header) already, e.g. a read path.
pub fn header_flags(header: &crate::header::Header) -> Vec<Flag> {
    content_flags(
        &header.tensors,
        header.data_start(),
        header.metadata.as_ref(),
    )
}

/// Tensor heuristics (tensors in data order), then the metadata flags.
fn content_flags(
    tensors: &[TensorInfo],
    data_start: u64,
    metadata: Option<&BTreeMap<String, String>>,
) -> Vec<Flag> {
    let mut flags = Vec::new();
    tensor_heuristics(tensors, data_start, &mut flags);
    if let Some(meta) = metadata {
        flags.extend(metadata::check_metadata(meta).0);
    }
    flags
}

/// The largest power of two dividing `offset`, at most [`MAX_REPORTED_ALIGNMENT`].
pub fn alignment(offset: u64) -> u64 {
    if offset == 0 {
        MAX_REPORTED_ALIGNMENT
    } else {
        (1u64 << offset.trailing_zeros()).min(MAX_REPORTED_ALIGNMENT)
    }
}

/// Warnings and infos about well-formed tensors (taken in data order).
fn tensor_heuristics(tensors: &[TensorInfo], data_start: u64, flags: &mut Vec<Flag>) {
    let mut misaligned: Vec<(&TensorInfo, u64, usize)> = Vec::new();
    for t in tensors {
        let name = metadata::escape(&t.name);
        let bytes = t.data_offsets[1].saturating_sub(t.data_offsets[0]);
        if bytes > HUGE_TENSOR_BYTES {
            flags.push(Flag::new(
                FlagCode::HugeTensor,
                Some(&t.name),
                format!(
                    "tensor `{name}` holds {bytes} bytes ({} {:?}), more than 2 GiB ({HUGE_TENSOR_BYTES})",
                    t.dtype, t.shape
                ),
            ));
        }
        if t.shape.contains(&0) {
            flags.push(Flag::new(
                FlagCode::GhostTensor,
                Some(&t.name),
                format!(
                    "tensor `{name}` is declared with shape {:?} ({}) but has no elements and no data bytes (data_offsets [{}, {}])",
                    t.shape, t.dtype, t.data_offsets[0], t.data_offsets[1]
                ),
            ));
        }
        if is_integer(t.dtype) && names_float_weights(&t.name) {
            flags.push(Flag::new(
                FlagCode::IntegerFloatWeights,
                Some(&t.name),
                format!(
                    "tensor `{name}` is named like float weights but has integer dtype {} (shape {:?}, {bytes} bytes)",
                    t.dtype, t.shape
                ),
            ));
        }
        if let Some(imitated) =
            metadata::imitated_key(&t.name).filter(|k| k == header::METADATA_KEY)
        {
            flags.push(Flag::new(
                FlagCode::MetadataSpoofed,
                Some(&t.name),
                format!("tensor `{name}` imitates the `{imitated}` key: readers take it as a tensor, not as metadata"),
            ));
        } else if let Some(problem) = unusual_name(&t.name) {
            flags.push(Flag::new(
                FlagCode::UnusualTensorName,
                Some(&t.name),
                format!("tensor name `{name}` is not an identifier of the usual kinds (letters, digits, `_` and `-`, in parts joined by `.`, `/` or `:`): {problem}"),
            ));
        }
        if let Some(size) = t.dtype.byte_size().filter(|s| *s > 1) {
            let start = data_start.saturating_add(t.data_offsets[0]);
            if bytes > 0 && !start.is_multiple_of(size as u64) {
                misaligned.push((t, start, size));
            }
        }
    }
    if let Some((first, start, size)) = misaligned.first() {
        flags.push(Flag::new(
            FlagCode::MisalignedTensor,
            Some(&first.name),
            format!(
                "{} tensors start at a file offset that is not a multiple of their element size, the first `{}` at byte {start} ({}, {size} bytes per element)",
                misaligned.len(),
                metadata::escape(&first.name),
                first.dtype
            ),
        ));
    }
}

fn is_integer(d: Dtype) -> bool {
    matches!(
        d,
        Dtype::U8
            | Dtype::I8
            | Dtype::U16
            | Dtype::I16
            | Dtype::U32
            | Dtype::I32
            | Dtype::U64
            | Dtype::I64
    )
}

/// Whether the last part of a name says it holds trained float parameters.
fn names_float_weights(name: &str) -> bool {
    let last = name.rsplit(['.', '/', ':']).next().unwrap_or(name);
    matches!(
        last.to_ascii_lowercase().as_str(),
        "weight" | "bias" | "kernel"
    )
}

/// Why `name` is not an identifier of the usual kinds, if it is not.
pub fn unusual_name(name: &str) -> Option<String> {
    const MAX: usize = 1024;
    if name.is_empty() {
        return Some("it is empty".into());
    }
    if name.len() > MAX {
        return Some(format!("it is {} bytes long (more than {MAX})", name.len()));
    }
    let mut part_len = 0usize;
    for (at, c) in name.char_indices() {
        if matches!(c, '.' | '/' | ':') {
            if part_len == 0 {
                return Some(format!("empty part before `{c}` at byte {at}"));
            }
            part_len = 0;
        } else if c.is_alphanumeric() || c == '_' || c == '-' {
            part_len += 1;
        } else {
            return Some(format!("character U+{:04X} at byte {at}", c as u32));
        }
    }
    (part_len == 0).then(|| "it ends with a separator".into())
}

/// Reports on many files, `jobs` at a time (at least 1), in the order given; `progress` is told
/// the files and their sizes, and each file as its report is made.
pub fn report_files(
    paths: &[PathBuf],
    opts: ReportOptions,
    jobs: usize,
    progress: &dyn crate::progress::Progress,
) -> Vec<FileReport> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    // progress: files and their sizes on disk (the bytes a report with hashes reads)
    let sizes: Vec<u64> = paths
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .collect();
    progress.start(paths.len() as u64, sizes.iter().sum());
    let _finish = crate::progress::FinishOnDrop(progress);
    let next = AtomicUsize::new(0);
    let slots: Mutex<Vec<Option<FileReport>>> = Mutex::new(vec![None; paths.len()]);
    std::thread::scope(|s| {
        for _ in 0..jobs.clamp(1, paths.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(path) = paths.get(i) else { break };
                let report = report_file(path, opts);
                progress.advance(1, sizes.get(i).copied().unwrap_or(0));
                if let Ok(mut slots) = slots.lock() {
                    if let Some(slot) = slots.get_mut(i) {
                        *slot = Some(report);
                    }
                }
            });
        }
    });
    let slots = slots.into_inner().unwrap_or_else(|e| e.into_inner());
    slots
        .into_iter()
        .zip(paths)
        .map(|(r, p)| {
            r.unwrap_or_else(|| {
                let mut r = FileReport::empty(&p.display().to_string(), 0);
                r.flags.push(Flag::new(
                    FlagCode::Unreadable,
                    None,
                    format!("{}: the report could not be made", p.display()),
                ));
                r.verdict = Verdict::Invalid;
                r
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
