//! Header parsing, validation and serialisation.
//!
//! Parsing is strict: every rule of the reference implementation, plus the ones it is lax on
//! (duplicate keys at any level, unknown fields, non-object entries, non-string dtypes, offsets
//! that are not exactly two integers). Serialisation produces the same bytes as the reference
//! writer for the same tensors, with `__metadata__` keys sorted.

use crate::dtype::Dtype;
use crate::error::FormatError;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::Path;

/// Largest header (JSON plus padding) the format allows, in bytes. Decimal, as in the reference.
pub const MAX_HEADER_SIZE: u64 = 100_000_000;

/// Length of the little-endian header-size prefix.
pub const PREFIX_LEN: u64 = 8;

/// The reserved key holding the string→string metadata map.
pub const METADATA_KEY: &str = "__metadata__";

/// One tensor's entry in a header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// `[begin, end)` relative to the start of the data section.
    pub data_offsets: [u64; 2],
}

impl TensorInfo {
    /// Number of data bytes of this tensor.
    pub fn byte_len(&self) -> u64 {
        self.data_offsets[1] - self.data_offsets[0]
    }

    /// Number of elements (the empty shape is a scalar: one element).
    pub fn element_count(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// A validated header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// `None` when the file has no `__metadata__` (or has `null` there).
    pub metadata: Option<BTreeMap<String, String>>,
    /// Tensors in data order (sorted by offsets), whatever their order in the JSON.
    pub tensors: Vec<TensorInfo>,
    /// N: the header length in bytes, padding included.
    pub header_len: u64,
    /// Length of the data section.
    pub data_len: u64,
    /// Positions in `tensors`, ordered by name: [`Header::tensor`] is a binary search, so
    /// looking up every tensor of a 100,000-tensor header stays O(n log n).
    by_name: Vec<u32>,
}

impl Header {
    /// A header from its parts (the name index is built here).
    pub fn new(
        metadata: Option<BTreeMap<String, String>>,
        tensors: Vec<TensorInfo>,
        header_len: u64,
        data_len: u64,
    ) -> Self {
        let mut by_name: Vec<u32> = (0..tensors.len() as u32).collect();
        by_name.sort_unstable_by(|&a, &b| tensors[a as usize].name.cmp(&tensors[b as usize].name));
        Header {
            metadata,
            tensors,
            header_len,
            data_len,
            by_name,
        }
    }

    /// Absolute file offset of the first data byte.
    pub fn data_start(&self) -> u64 {
        PREFIX_LEN + self.header_len
    }

    /// The total file length this header describes.
    pub fn file_len(&self) -> u64 {
        self.data_start() + self.data_len
    }

    /// Looks a tensor up by name (binary search over the name index).
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let at = |i: &u32| self.tensors.get(*i as usize);
        self.by_name
            .binary_search_by(|i| at(i).map_or("", |t| t.name.as_str()).cmp(name))
            .ok()
            .and_then(|k| self.by_name.get(k))
            .and_then(at)
    }
}

/// Checks the 8-byte prefix against the file length and returns N, the header length.
///
/// Runs before anything of size N is allocated or read: `file_len ≥ 8`, `N ≤ 100,000,000`,
/// `8 + N ≤ file_len`.
pub fn check_prefix(prefix: &[u8], file_len: u64) -> Result<u64, FormatError> {
    let bytes: [u8; 8] = match prefix.get(..8).and_then(|p| p.try_into().ok()) {
        Some(b) if file_len >= PREFIX_LEN => b,
        _ => return Err(FormatError::HeaderTooSmall { file_len }),
    };
    let header_len = u64::from_le_bytes(bytes);
    if header_len > MAX_HEADER_SIZE {
        return Err(FormatError::HeaderTooLarge {
            header_len,
            limit: MAX_HEADER_SIZE,
        });
    }
    // header_len ≤ 1e8, so the addition cannot overflow.
    if PREFIX_LEN + header_len > file_len {
        return Err(FormatError::HeaderBeyondFile {
            header_len,
            file_len,
        });
    }
    Ok(header_len)
}

/// Parses and validates a whole file held in memory.
pub fn parse_file_bytes(bytes: &[u8]) -> Result<Header, FormatError> {
    let file_len = bytes.len() as u64;
    let header_len = check_prefix(bytes, file_len)?;
    // check_prefix guarantees 8 + header_len ≤ bytes.len().
    let json = bytes
        .get(8..8 + header_len as usize)
        .ok_or(FormatError::HeaderBeyondFile {
            header_len,
            file_len,
        })?;
    parse_header(json, file_len)
}

mod fast;

/// Parses and validates the header bytes (the N bytes after the prefix) of a file of
/// `file_len` bytes.
///
/// A valid header is read by the fast path ([`parse_header_fast`]: straight into typed entries);
/// anything it refuses is read again by [`parse_header_detailed`], whose error is returned, so
/// the errors are the detailed path's whichever path ran.
pub fn parse_header(json: &[u8], file_len: u64) -> Result<Header, FormatError> {
    match fast::parse(json, file_len) {
        Some(header) => Ok(header),
        None => parse_header_detailed(json, file_len),
    }
}

/// The fast path of [`parse_header`]: the header when it is valid, `None` otherwise (or when the
/// fast path cannot prove it valid). It never accepts what [`parse_header_detailed`] rejects, and
/// gives the same header for what both accept (tests compare them).
pub fn parse_header_fast(json: &[u8], file_len: u64) -> Option<Header> {
    fast::parse(json, file_len)
}

/// The detailed path of [`parse_header`]: [`parse_header_items`] (a JSON tree keeping duplicate
/// keys, then each entry on its own), stopping at the first error in the order of format.md §3,
/// then the offset and file-length rules.
pub fn parse_header_detailed(json: &[u8], file_len: u64) -> Result<Header, FormatError> {
    let header_len = json.len() as u64;
    let items = parse_header_items(json)?;
    let mut metadata = None;
    let mut tensors = Vec::with_capacity(items.len());
    for item in items {
        match item? {
            HeaderItem::Metadata(m) => metadata = m?,
            HeaderItem::Tensor(parts) => tensors.push((*parts).into_tensor()?),
        }
    }
    let data_len = validate_offsets(&mut tensors)?;
    check_coverage(header_len, data_len, file_len)?;
    Ok(Header::new(metadata, tensors, header_len, data_len))
}

/// One top-level entry of a header, parsed as far as its own rules allow (rules 7–8).
#[derive(Debug)]
pub enum HeaderItem {
    /// The `__metadata__` entry: its map (`None` for `null`) or why it is invalid (rule 7).
    Metadata(Result<Option<BTreeMap<String, String>>, FormatError>),
    /// A tensor entry, each field parsed on its own.
    Tensor(Box<TensorParts>),
}

/// A tensor entry with each of its fields parsed on its own, so that one bad field does not hide
/// the others. [`TensorParts::into_tensor`] is the strict reading: the first error, in the order
/// of format.md §3.2.
#[derive(Debug)]
pub struct TensorParts {
    pub name: String,
    /// The first structural problem of the entry, in field order: not an object (rule 8a), an
    /// unknown field (8b) or a field given twice (6).
    pub entry_error: Option<FormatError>,
    /// Rule 8c (or 8f when missing).
    pub dtype: Result<Dtype, FormatError>,
    /// Rule 8d (or 8f when missing).
    pub shape: Result<Vec<u64>, FormatError>,
    /// Rule 8e (or 8f when missing).
    pub data_offsets: Result<[u64; 2], FormatError>,
}

impl TensorParts {
    /// The tensor, or the first rule it breaks.
    pub fn into_tensor(self) -> Result<TensorInfo, FormatError> {
        if let Some(e) = self.entry_error {
            return Err(e);
        }
        Ok(TensorInfo {
            dtype: self.dtype?,
            shape: self.shape?,
            data_offsets: self.data_offsets?,
            name: self.name,
        })
    }
}

/// Rules 4–8 without stopping at the first broken one: the header's top-level entries in JSON
/// order, each parsed on its own. The outer error is a header that is not UTF-8, not JSON or not
/// an object (nothing else can be read from it); an inner `Err` is a duplicate top-level key
/// (rule 6), whose entry is not parsed. [`parse_header`] stops at the first error of this list;
/// the forensic report (`crate::forensics`) collects them all.
pub fn parse_header_items(
    json: &[u8],
) -> Result<Vec<Result<HeaderItem, FormatError>>, FormatError> {
    let text = std::str::from_utf8(json).map_err(|e| FormatError::HeaderNotUtf8 {
        valid_up_to: e.valid_up_to(),
    })?;
    let value: Json = serde_json::from_str(text).map_err(|e| FormatError::InvalidJson {
        message: e.to_string(),
    })?;
    let entries = match value {
        Json::Object(entries) => entries,
        other => {
            return Err(FormatError::HeaderNotObject {
                found: other.kind(),
            })
        }
    };
    let mut seen_metadata = false;
    let mut names: HashSet<&str> = HashSet::with_capacity(entries.len());
    let mut items = Vec::with_capacity(entries.len());
    for (key, value) in &entries {
        let first = if key == METADATA_KEY {
            !std::mem::replace(&mut seen_metadata, true)
        } else {
            names.insert(key)
        };
        items.push(if !first {
            Err(FormatError::DuplicateKey {
                key: key.clone(),
                context: "the header".into(),
            })
        } else if key == METADATA_KEY {
            Ok(HeaderItem::Metadata(parse_metadata(value)))
        } else {
            Ok(HeaderItem::Tensor(Box::new(parse_tensor(key, value))))
        });
    }
    Ok(items)
}

/// Rule 14: the prefix, the header and the data section make up the whole file.
pub fn check_coverage(header_len: u64, data_len: u64, file_len: u64) -> Result<(), FormatError> {
    let expected = PREFIX_LEN
        .checked_add(header_len)
        .and_then(|n| n.checked_add(data_len))
        .ok_or(FormatError::FileLengthOverflow {
            header_len,
            data_len,
        })?;
    if expected != file_len {
        return Err(FormatError::FileLengthMismatch {
            header_len,
            data_len,
            expected,
            file_len,
        });
    }
    Ok(())
}

fn parse_metadata(value: &Json) -> Result<Option<BTreeMap<String, String>>, FormatError> {
    let entries = match value {
        Json::Null => return Ok(None),
        Json::Object(entries) => entries,
        other => {
            return Err(FormatError::MetadataNotObject {
                found: other.kind(),
            })
        }
    };
    let mut map = BTreeMap::new();
    for (key, value) in entries {
        let Json::String(s) = value else {
            return Err(FormatError::MetadataValueNotString {
                key: key.clone(),
                found: value.kind(),
            });
        };
        if map.insert(key.clone(), s.clone()).is_some() {
            return Err(FormatError::DuplicateKey {
                key: key.clone(),
                context: "`__metadata__`".into(),
            });
        }
    }
    Ok(Some(map))
}

fn parse_tensor(name: &str, value: &Json) -> TensorParts {
    let missing = |field| FormatError::MissingField {
        name: name.into(),
        field,
    };
    let Json::Object(fields) = value else {
        return TensorParts {
            name: name.into(),
            entry_error: Some(FormatError::TensorNotObject {
                name: name.into(),
                found: value.kind(),
            }),
            dtype: Err(missing("dtype")),
            shape: Err(missing("shape")),
            data_offsets: Err(missing("data_offsets")),
        };
    };
    let mut entry_error = None;
    let (mut dtype, mut shape, mut offsets) = (None, None, None);
    for (field, v) in fields {
        let slot = match field.as_str() {
            "dtype" => &mut dtype,
            "shape" => &mut shape,
            "data_offsets" => &mut offsets,
            _ => {
                entry_error.get_or_insert(FormatError::UnknownField {
                    name: name.into(),
                    field: field.clone(),
                });
                continue;
            }
        };
        if slot.is_some() {
            entry_error.get_or_insert(FormatError::DuplicateKey {
                key: field.clone(),
                context: format!("tensor `{name}`"),
            });
        } else {
            *slot = Some(v);
        }
    }
    let dtype = match dtype {
        None => Err(missing("dtype")),
        Some(Json::String(s)) => Dtype::from_name(s).ok_or_else(|| FormatError::UnknownDtype {
            name: name.into(),
            dtype: s.clone(),
        }),
        Some(other) => Err(FormatError::DtypeNotString {
            name: name.into(),
            found: other.kind(),
        }),
    };
    let shape = match shape {
        None => Err(missing("shape")),
        Some(v) => unsigned_array(v).map_err(|problem| FormatError::InvalidShape {
            name: name.into(),
            problem,
        }),
    };
    let data_offsets = match offsets.map(unsigned_array) {
        None => Err(missing("data_offsets")),
        Some(Ok(v)) => match v.as_slice() {
            &[begin, end] => Ok([begin, end]),
            _ => Err(FormatError::InvalidOffsets {
                name: name.into(),
                problem: format!("found {} integers", v.len()),
            }),
        },
        Some(Err(problem)) => Err(FormatError::InvalidOffsets {
            name: name.into(),
            problem,
        }),
    };
    TensorParts {
        name: name.into(),
        entry_error,
        dtype,
        shape,
        data_offsets,
    }
}

fn unsigned_array(value: &Json) -> Result<Vec<u64>, String> {
    let Json::Array(items) = value else {
        return Err(format!("found {}", value.kind()));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Json::Unsigned(n) => Ok(*n),
            Json::Negative(n) => Err(format!("item {i} is negative ({n})")),
            Json::Float(f) => Err(format!("item {i} is not an integer ({f})")),
            other => Err(format!("item {i} is {}", other.kind())),
        })
        .collect()
}

/// Sorts `tensors` into data order and checks offsets, sizes and contiguity. Returns the data
/// section length.
fn validate_offsets(tensors: &mut [TensorInfo]) -> Result<u64, FormatError> {
    tensors.sort_by_key(|t| t.data_offsets);
    let mut cursor = 0u64;
    for t in tensors.iter() {
        check_placement(&t.name, t.data_offsets, cursor)?;
        check_size(t)?;
        cursor = t.data_offsets[1];
    }
    Ok(cursor)
}

/// Rules 9–10 for one tensor taken in data order: it begins exactly where the previous one
/// ended (`cursor`) and does not end before it begins.
pub fn check_placement(name: &str, offsets: [u64; 2], cursor: u64) -> Result<(), FormatError> {
    let [begin, end] = offsets;
    if begin > cursor {
        return Err(FormatError::OffsetHole {
            name: name.into(),
            begin,
            end,
            expected: cursor,
        });
    }
    if begin < cursor {
        return Err(FormatError::OffsetOverlap {
            name: name.into(),
            begin,
            end,
            expected: cursor,
        });
    }
    if end < begin {
        return Err(FormatError::ReversedOffsets {
            name: name.into(),
            begin,
            end,
        });
    }
    Ok(())
}

/// Rules 11–13 for one tensor: its shape and dtype give exactly the bytes its offsets span.
/// Returns that byte count.
pub fn check_size(t: &TensorInfo) -> Result<u64, FormatError> {
    let [begin, end] = t.data_offsets;
    let expected = tensor_byte_len(&t.name, t.dtype, &t.shape)?;
    let actual = end.wrapping_sub(begin);
    if end < begin || actual != expected {
        return Err(FormatError::SizeMismatch {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            expected,
            actual,
        });
    }
    Ok(expected)
}

/// Byte size of a tensor of `shape` and `dtype`, with checked arithmetic and the sub-byte rule.
pub fn tensor_byte_len(name: &str, dtype: Dtype, shape: &[u64]) -> Result<u64, FormatError> {
    let overflow = || FormatError::SizeOverflow {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
    };
    let elements = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)?;
    let bits = elements
        .checked_mul(u64::from(dtype.bits()))
        .ok_or_else(overflow)?;
    if !bits.is_multiple_of(8) {
        return Err(FormatError::MisalignedSubByte {
            name: name.into(),
            dtype,
            elements,
            bits: dtype.bits(),
        });
    }
    Ok(bits / 8)
}

/// A tensor to be written: name, dtype and shape. Its byte size follows from them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
}

/// The plan of a file to be written: tensors in reference order with their offsets, and the
/// serialised prefix + padded header.
#[derive(Debug, Clone)]
pub struct FilePlan {
    /// Tensors in the order their data must be written.
    pub tensors: Vec<TensorInfo>,
    /// The 8-byte prefix followed by the space-padded header JSON.
    pub header_bytes: Vec<u8>,
    pub data_len: u64,
}

impl FilePlan {
    /// Total file length.
    pub fn file_len(&self) -> u64 {
        self.header_bytes.len() as u64 + self.data_len
    }
}

/// Plans a file exactly as the reference writer would: tensors sorted by dtype (descending in
/// declaration order) then name, consecutive offsets, compact JSON with `__metadata__` first
/// (keys sorted), spaces up to a multiple of 8.
pub fn plan_file(
    metadata: Option<&BTreeMap<String, String>>,
    mut entries: Vec<TensorEntry>,
) -> Result<FilePlan, FormatError> {
    let mut names = HashSet::with_capacity(entries.len());
    for e in &entries {
        if e.name == METADATA_KEY {
            return Err(FormatError::ReservedName);
        }
        if !names.insert(e.name.as_str()) {
            return Err(FormatError::DuplicateTensorName {
                name: e.name.clone(),
            });
        }
    }
    entries.sort_by(|a, b| b.dtype.cmp(&a.dtype).then_with(|| a.name.cmp(&b.name)));
    let mut cursor = 0u64;
    let mut tensors = Vec::with_capacity(entries.len());
    for e in entries {
        let len = tensor_byte_len(&e.name, e.dtype, &e.shape)?;
        let end = cursor
            .checked_add(len)
            .ok_or_else(|| FormatError::SizeOverflow {
                name: e.name.clone(),
                dtype: e.dtype,
                shape: e.shape.clone(),
            })?;
        tensors.push(TensorInfo {
            name: e.name,
            dtype: e.dtype,
            shape: e.shape,
            data_offsets: [cursor, end],
        });
        cursor = end;
    }
    let header_bytes = serialize_header(metadata, &tensors)?;
    Ok(FilePlan {
        tensors,
        header_bytes,
        data_len: cursor,
    })
}

/// Serialises the prefix and padded header for tensors given in data order.
pub fn serialize_header(
    metadata: Option<&BTreeMap<String, String>>,
    tensors: &[TensorInfo],
) -> Result<Vec<u8>, FormatError> {
    serialize_entries(metadata, tensors.len(), || {
        tensors.iter().map(|t| HeaderEntry {
            name: [&t.name, "", ""],
            dtype: t.dtype,
            shape: &t.shape,
            data_offsets: t.data_offsets,
        })
    })
}

/// One tensor entry as [`serialize_entries`] writes it. The name is the concatenation of its
/// three parts (KV shards: key, separator, column), so callers need not build it.
#[derive(Debug, Clone, Copy)]
pub struct HeaderEntry<'a> {
    pub name: [&'a str; 3],
    pub dtype: Dtype,
    pub shape: &'a [u64],
    /// `[begin, end)` relative to the start of the data section.
    pub data_offsets: [u64; 2],
}

/// Serialises the prefix and padded header for `count` entries given in data order (the
/// reference's order, as [`plan_file`] plans it: the caller has ordered them, checked their
/// names and computed consecutive offsets). The only memory it needs is the header itself.
pub fn serialize_entries<'a, I: Iterator<Item = HeaderEntry<'a>>>(
    metadata: Option<&BTreeMap<String, String>>,
    count: usize,
    entries: impl Fn() -> I,
) -> Result<Vec<u8>, FormatError> {
    let mut out = Vec::with_capacity(64 + count.saturating_mul(80));
    write_entries(&mut out, Path::new("<header>"), metadata, entries)?;
    Ok(out)
}

/// Streams the prefix and padded header of the entries `entries()` yields (in data order, as
/// for [`serialize_entries`]) into `out`, holding one chunk of it at a time: a first pass over
/// the entries measures the header, the second writes it. Returns the bytes written (prefix
/// included). `path` names `out` in I/O errors.
pub fn write_entries<'a, I: Iterator<Item = HeaderEntry<'a>>>(
    out: &mut impl std::io::Write,
    path: &Path,
    metadata: Option<&BTreeMap<String, String>>,
    entries: impl Fn() -> I,
) -> Result<u64, FormatError> {
    const CHUNK: usize = 1 << 16;
    let mut chunk = Vec::with_capacity(CHUNK + 256);
    let mut scratch = Vec::new();
    // Pass 1: the JSON's length (braces, metadata, entries and the commas between them).
    let mut items = 0u64;
    let mut unpadded = 2u64;
    if let Some(meta) = metadata {
        push_metadata(&mut chunk, meta);
        unpadded += chunk.len() as u64;
        chunk.clear();
        items += 1;
    }
    for e in entries() {
        push_entry(&mut chunk, &mut scratch, &e);
        unpadded += chunk.len() as u64;
        chunk.clear();
        items += 1;
    }
    unpadded += items.saturating_sub(1);
    let header_len = unpadded.next_multiple_of(8);
    if header_len > MAX_HEADER_SIZE {
        return Err(FormatError::HeaderTooLarge {
            header_len,
            limit: MAX_HEADER_SIZE,
        });
    }
    // Pass 2: the bytes.
    let io = |e| FormatError::io(path, e);
    out.write_all(&header_len.to_le_bytes()).map_err(io)?;
    let mut written = 0u64;
    chunk.push(b'{');
    let mut first = true;
    if let Some(meta) = metadata {
        first = false;
        push_metadata(&mut chunk, meta);
    }
    for e in entries() {
        if !std::mem::take(&mut first) {
            chunk.push(b',');
        }
        push_entry(&mut chunk, &mut scratch, &e);
        if chunk.len() >= CHUNK {
            out.write_all(&chunk).map_err(io)?;
            written += chunk.len() as u64;
            chunk.clear();
        }
    }
    chunk.push(b'}');
    if written + chunk.len() as u64 != unpadded {
        return Err(FormatError::io(
            path,
            std::io::Error::other("header entries changed between its two passes"),
        ));
    }
    chunk.resize(chunk.len() + (header_len - unpadded) as usize, b' ');
    out.write_all(&chunk).map_err(io)?;
    Ok(8 + header_len)
}

fn push_metadata(json: &mut Vec<u8>, meta: &BTreeMap<String, String>) {
    push_json_string(json, METADATA_KEY);
    json.extend_from_slice(b":{");
    for (i, (k, v)) in meta.iter().enumerate() {
        if i > 0 {
            json.push(b',');
        }
        push_json_string(json, k);
        json.push(b':');
        push_json_string(json, v);
    }
    json.push(b'}');
}

/// The fixed parts of a tensor entry `"name":{"dtype":"..","shape":[..],"data_offsets":[..]}`,
/// between the name, the dtype, the shape and the offsets: [`push_entry`] writes them and
/// [`entry_len_without_name_and_offsets`] counts them.
const ENTRY_BEFORE_DTYPE: &[u8] = b":{\"dtype\":\"";
const ENTRY_BEFORE_SHAPE: &[u8] = b"\",\"shape\":[";
const ENTRY_BEFORE_OFFSETS: &[u8] = b"],\"data_offsets\":[";
const ENTRY_END: &[u8] = b"]}";

fn push_entry(json: &mut Vec<u8>, scratch: &mut Vec<u8>, t: &HeaderEntry<'_>) {
    push_json_concat(json, scratch, &t.name);
    json.extend_from_slice(ENTRY_BEFORE_DTYPE);
    json.extend_from_slice(t.dtype.name().as_bytes());
    json.extend_from_slice(ENTRY_BEFORE_SHAPE);
    push_joined(json, t.shape);
    json.extend_from_slice(ENTRY_BEFORE_OFFSETS);
    push_joined(json, &t.data_offsets);
    json.extend_from_slice(ENTRY_END);
}

/// Writes the concatenation of `parts` as one JSON string. Escaping is per character, so each
/// part is escaped on its own (through `scratch`) and the quotes are added once.
fn push_json_concat(out: &mut Vec<u8>, scratch: &mut Vec<u8>, parts: &[&str]) {
    out.push(b'"');
    for part in parts.iter().filter(|p| !p.is_empty()) {
        scratch.clear();
        push_json_string(scratch, part);
        if let Some(inner) = scratch.get(1..scratch.len().saturating_sub(1)) {
            out.extend_from_slice(inner);
        }
    }
    out.push(b'"');
}

fn push_json_string(out: &mut Vec<u8>, s: &str) {
    // serde_json's escaping is the reference's; writing a &str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

fn push_joined(out: &mut Vec<u8>, values: &[u64]) {
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // `write!` into the Vec formats without a String per number; it cannot fail.
        let _ = std::io::Write::write_fmt(out, format_args!("{v}"));
    }
}

// The lengths of what the writer above writes, for a caller that must bound a header's size
// before it has the whole header (the KV writer's shard sealing). The tests check them against
// the writer's own output.

/// Length of `s` as a JSON string (quotes included), as the header writer escapes it.
#[inline]
pub fn json_string_len(s: &str) -> u64 {
    /// Counts the bytes written to it.
    struct Counter(u64);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Counter(0);
    match serde_json::to_writer(&mut n, s) {
        Ok(()) => n.0,
        Err(_) => s.len() as u64 * 6 + 2,
    }
}

/// Length of `s` as JSON string content, without the quotes (escaping is per character, so
/// the lengths of parts add up, as in a name [`HeaderEntry::name`] gives in parts). Most names
/// need no escaping: their length is their byte length.
#[inline]
pub fn json_string_inner_len(s: &str) -> u64 {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        s.len() as u64
    } else {
        json_string_len(s) - 2
    }
}

/// Number of decimal digits of `x`, as the header writer writes it.
#[inline]
pub fn decimal_len(mut x: u64) -> u64 {
    let mut d = 1;
    while x >= 10 {
        x /= 10;
        d += 1;
    }
    d
}

/// Header bytes of the `__metadata__` item `"__metadata__":{..}` (no comma around it).
pub fn metadata_entry_len(meta: &BTreeMap<String, String>) -> u64 {
    json_string_len(METADATA_KEY)
        + 3 // :{}
        + meta
            .iter()
            .map(|(k, v)| json_string_len(k) + 1 + json_string_len(v))
            .sum::<u64>()
        + meta.len().saturating_sub(1) as u64
}

/// Header bytes of one tensor entry `"name":{"dtype":"..","shape":[..],"data_offsets":[..]}`
/// without the name (quotes included) and the offsets' digits: add [`json_string_len`] of the
/// name and the [`decimal_len`] of both offsets for the whole entry.
#[inline]
pub fn entry_len_without_name_and_offsets(dtype: Dtype, shape: &[u64]) -> u64 {
    let shape_len: u64 =
        shape.iter().map(|&d| decimal_len(d)).sum::<u64>() + shape.len().saturating_sub(1) as u64;
    let fixed = ENTRY_BEFORE_DTYPE.len()
        + ENTRY_BEFORE_SHAPE.len()
        + ENTRY_BEFORE_OFFSETS.len()
        + 1 // the comma between the offsets
        + ENTRY_END.len();
    fixed as u64 + dtype.name().len() as u64 + shape_len
}

/// A JSON value whose objects keep every entry, duplicates included, so that duplicate keys can
/// be rejected (serde_json's own `Value` keeps only the last one).
#[derive(Debug)]
enum Json {
    Null,
    Bool,
    Unsigned(u64),
    Negative(i64),
    Float(f64),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    fn kind(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool => "a boolean",
            Json::Unsigned(_) | Json::Negative(_) | Json::Float(_) => "a number",
            Json::String(_) => "a string",
            Json::Array(_) => "an array",
            Json::Object(_) => "an object",
        }
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Json, E> {
        Ok(Json::Bool)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Json, E> {
        Ok(Json::Unsigned(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Json, E> {
        Ok(if v >= 0 {
            Json::Unsigned(v as u64)
        } else {
            Json::Negative(v)
        })
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Json, E> {
        Ok(Json::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Json, E> {
        Ok(Json::String(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Json, E> {
        Ok(Json::String(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Json, A::Error> {
        crate::json_object::read_entries(map).map(Json::Object)
    }
}

/// Checks, on a whole file, that [`parse_header_fast`] and [`parse_header_detailed`] agree (the
/// same header, or `None` exactly when the detailed path errs) and that [`parse_header`] gives
/// the detailed path's result, error included; `Err` describes the disagreement. Files whose
/// prefix is invalid never reach them. The one statement of this rule for the unit tests, the
/// property tests and the `header` fuzz target.
pub fn check_paths_agree(bytes: &[u8]) -> Result<(), String> {
    let file_len = bytes.len() as u64;
    let Some(json) = check_prefix(bytes, file_len)
        .ok()
        .and_then(|n| bytes.get(8..8 + usize::try_from(n).ok()?))
    else {
        return Ok(());
    };
    let fast = parse_header_fast(json, file_len);
    let detailed = parse_header_detailed(json, file_len);
    match (&fast, &detailed) {
        (Some(f), Ok(d)) if f == d => {}
        (None, Err(_)) => {}
        _ => return Err(format!("fast path {fast:?}, detailed path {detailed:?}")),
    }
    let strict = format!("{:?}", parse_header(json, file_len));
    if strict != format!("{detailed:?}") {
        return Err(format!(
            "parse_header gave {strict}, the detailed path {detailed:?}"
        ));
    }
    Ok(())
}

/// [`check_paths_agree`], panicking on a disagreement.
#[cfg(test)]
#[allow(clippy::panic)]
pub(crate) fn assert_paths_agree(bytes: &[u8]) {
    if let Err(e) = check_paths_agree(bytes) {
        panic!("{e}");
    }
}

#[cfg(test)]
mod tests;
