//! Compaction (spec/dataset.md §5.8.2): the rules, once. Which shards of a dataset are merged
//! ([`plan_compaction`]), the byte-level merge of one new shard ([`merge_output`]) and the
//! manifest of the compaction version rebased on whatever is committed when it commits
//! ([`compaction_manifest`]). No I/O here: [`local`] runs a compaction on a local directory (the
//! CLI, the Python package); the Spark connector reads and writes the shards through Hadoop's
//! file systems and calls these functions through JNI.
//!
//! * Batch layout: shards with fewer real rows than `batch_size` (tails, small appends, stream
//!   batches) are merged, in manifest order: their real rows (padding dropped) are concatenated
//!   and cut into shards of `batch_size` rows; the last one is a tail (padded again with
//!   `tail_strategy=pad`). Ragged columns: values concatenated, offsets rebased.
//! * KV layout: shards smaller than `target_shard_size_mb` are packed, whole, in manifest order,
//!   into shards of up to about that size; every tensor is copied unchanged.
//!
//! Full shards are never touched; a merge that would rewrite a single shard is not planned.

use crate::kv::{split_kv_header, KvColumn};
use crate::manifest::{
    ragged_offsets_name, CommitInfo, DatasetMode, Manifest, ManifestShard, Operation, TailStrategy,
};
use crate::names::{
    parse_shard_file_name, shard_file_name, PADDED_SAMPLES_METADATA_KEY, RAGGED_METADATA_KEY,
    SAMPLES_METADATA_KEY,
};
use crate::vacuum::LogEntry;
use crate::DatasetError;
use safetensors_spark_format::file::{crc32c_hex, serialize};
use safetensors_spark_format::header::{parse_file_bytes, Header, TensorEntry};
use safetensors_spark_format::Dtype;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub mod local;

/// The KV shard size a compaction aims at when not told (the writer's `target_shard_size_mb`
/// default).
pub const DEFAULT_TARGET_SHARD_SIZE_MB: u64 = 300;
/// The largest `target_shard_size_mb` (as the writer's option).
pub const MAX_TARGET_SHARD_SIZE_MB: u64 = 65536;
pub use crate::names::RESERVED_METADATA_PREFIX;

/// What a compaction is asked to do.
#[derive(Debug, Clone, Default)]
pub struct CompactionRequest {
    /// Batch layout: rows per shard; must be the dataset's `batch_size` when given.
    pub batch_size: Option<u64>,
    /// KV layout: the shard size to aim at, MiB (default [`DEFAULT_TARGET_SHARD_SIZE_MB`]).
    pub target_shard_size_mb: Option<u64>,
}

/// Rows `[start, end)` of the real rows of shard `shard` (KV: all its keys, `0..samples`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputSlice {
    pub shard: String,
    pub start: u64,
    pub end: u64,
}

/// One shard a compaction writes: its name and the input rows it holds, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedShard {
    pub name: String,
    pub partition: u32,
    pub inputs: Vec<InputSlice>,
    /// Real rows (KV: keys).
    pub samples: u64,
    /// Padding rows after them (batch layout with `tail_strategy=pad`).
    pub padded: u64,
}

/// What a compaction merges: `replaced` shards of version `base_version` become `outputs`.
/// Empty `outputs`: nothing to compact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionPlan {
    pub base_version: u64,
    pub layout: DatasetMode,
    /// The uuid of the new shards' names (a fresh one per compaction).
    pub write_id: String,
    /// Batch layout: rows per shard.
    pub batch_size: Option<u64>,
    /// KV layout: the size aimed at, bytes.
    pub target_bytes: Option<u64>,
    /// The shards merged, in manifest order.
    pub replaced: Vec<String>,
    pub outputs: Vec<PlannedShard>,
    /// Real rows (KV: keys) moved: the rows of `replaced`, and of `outputs`.
    pub rows: u64,
    /// Bytes of `replaced`.
    pub replaced_bytes: u64,
    /// What the rewrite is: a `compaction` (the same rows) or a `delete` (spec/dataset.md §5.11:
    /// `rows_removed` rows of `replaced` are not in `outputs`).
    #[serde(default = "compaction_operation")]
    pub operation: Operation,
    /// Rows (KV: keys) of `replaced` that `outputs` leave out (a delete's).
    #[serde(default)]
    pub rows_removed: u64,
    /// KV delete: the keys whose tensors the outputs leave out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deleted_keys: Vec<String>,
}

fn compaction_operation() -> Operation {
    Operation::Compaction
}

impl CompactionPlan {
    /// The plan without its lists (`replaced`, `outputs`, `deleted_keys`).
    fn clone_without_lists(&self) -> CompactionPlan {
        CompactionPlan {
            base_version: self.base_version,
            layout: self.layout,
            write_id: self.write_id.clone(),
            batch_size: self.batch_size,
            target_bytes: self.target_bytes,
            replaced: Vec::new(),
            outputs: Vec::new(),
            rows: self.rows,
            replaced_bytes: self.replaced_bytes,
            operation: self.operation,
            rows_removed: self.rows_removed,
            deleted_keys: Vec::new(),
        }
    }

    /// The plan's kind as the manifest names it (`compaction`, `delete`), for messages.
    pub fn what(&self) -> &'static str {
        match self.operation {
            Operation::Delete => "delete",
            _ => "compaction",
        }
    }
}

fn err(problem: impl Into<String>) -> DatasetError {
    DatasetError::Compaction {
        problem: problem.into(),
    }
}

/// The partition of a listed shard: its recorded `partition`, else the one in its file name, else
/// 0 (compaction and delete group shards by it).
pub(crate) fn partition_of(s: &ManifestShard) -> u32 {
    s.partition
        .or_else(|| parse_shard_file_name(&s.shard_path).map(|(p, _, _)| p))
        .unwrap_or(0)
}

/// The plan of a compaction of `base` (the latest committed manifest). Errors (nothing is
/// changed): a manifest of another tool, a `batch_size` of 0 or other than the dataset's, an
/// option of the other layout, a `target_shard_size_mb` out of range.
pub fn plan_compaction(
    base: &Manifest,
    req: &CompactionRequest,
    write_id: &str,
) -> Result<CompactionPlan, DatasetError> {
    let Some(x) = &base.ext else {
        return Err(err(
            "the dataset's manifest has only the published fields (written by another tool); \
             compaction works on datasets this connector wrote",
        ));
    };
    let mut plan = CompactionPlan {
        base_version: x.manifest_version,
        layout: x.mode,
        write_id: write_id.to_string(),
        batch_size: None,
        target_bytes: None,
        replaced: Vec::new(),
        outputs: Vec::new(),
        rows: 0,
        replaced_bytes: 0,
        operation: Operation::Compaction,
        rows_removed: 0,
        deleted_keys: Vec::new(),
    };
    let candidates: Vec<&ManifestShard>;
    match x.mode {
        DatasetMode::Batch => {
            if req.target_shard_size_mb.is_some() {
                return Err(err(
                    "target_shard_size_mb is for KV datasets; this dataset is in batch layout \
                     (its shards hold batch_size rows: give batch_size or nothing)",
                ));
            }
            let b = x.batch_size.unwrap_or(0);
            match req.batch_size {
                Some(0) => {
                    return Err(err(
                        "batch_size is 0; it must be the dataset's batch_size (or left out)",
                    ))
                }
                Some(n) if n != b => {
                    return Err(err(format!(
                        "batch_size is {n}, the dataset has batch_size {b}; a compaction keeps \
                         the dataset's batch_size (leave it out, or give {b})"
                    )))
                }
                _ => {}
            }
            plan.batch_size = Some(b);
            candidates = base.shards.iter().filter(|s| s.samples_count < b).collect();
            if candidates.len() < 2 {
                return Ok(plan);
            }
            let total: u64 = candidates.iter().map(|s| s.samples_count).sum();
            let pad = x.tail_strategy == Some(TailStrategy::Pad);
            let first_partition = partition_of(candidates[0]);
            let (mut at, mut offset) = (0usize, 0u64);
            let mut k = 0u32;
            let mut done = 0u64;
            while done < total {
                let samples = b.min(total - done);
                let mut need = samples;
                let mut inputs = Vec::new();
                while need > 0 {
                    let s = candidates[at];
                    let take = need.min(s.samples_count - offset);
                    inputs.push(InputSlice {
                        shard: s.shard_path.clone(),
                        start: offset,
                        end: offset + take,
                    });
                    offset += take;
                    need -= take;
                    if offset == s.samples_count {
                        at += 1;
                        offset = 0;
                    }
                }
                plan.outputs.push(PlannedShard {
                    name: shard_file_name(first_partition, k, write_id),
                    partition: first_partition,
                    inputs,
                    samples,
                    padded: if pad { b - samples } else { 0 },
                });
                k += 1;
                done += samples;
            }
        }
        DatasetMode::Kv => {
            if req.batch_size.is_some() {
                return Err(err(
                    "batch_size is for batch datasets; this dataset is in KV layout (give \
                     target_shard_size_mb or nothing)",
                ));
            }
            let mb = req
                .target_shard_size_mb
                .unwrap_or(DEFAULT_TARGET_SHARD_SIZE_MB);
            if !(1..=MAX_TARGET_SHARD_SIZE_MB).contains(&mb) {
                return Err(err(format!(
                    "target_shard_size_mb is {mb}; expected an integer from 1 to \
                     {MAX_TARGET_SHARD_SIZE_MB}"
                )));
            }
            let target = mb << 20;
            plan.target_bytes = Some(target);
            let small: Vec<&ManifestShard> =
                base.shards.iter().filter(|s| s.bytes < target).collect();
            let mut groups: Vec<Vec<&ManifestShard>> = Vec::new();
            let mut size = 0u64;
            for s in small {
                match groups.last_mut() {
                    Some(g) if size + s.bytes <= target => {
                        g.push(s);
                        size += s.bytes;
                    }
                    _ => {
                        groups.push(vec![s]);
                        size = s.bytes;
                    }
                }
            }
            groups.retain(|g| g.len() >= 2);
            candidates = groups.iter().flatten().copied().collect();
            let first_partition = candidates.first().map_or(0, |s| partition_of(s));
            for (k, g) in groups.iter().enumerate() {
                plan.outputs.push(PlannedShard {
                    name: shard_file_name(first_partition, k as u32, write_id),
                    partition: first_partition,
                    inputs: g
                        .iter()
                        .map(|s| InputSlice {
                            shard: s.shard_path.clone(),
                            start: 0,
                            end: s.samples_count,
                        })
                        .collect(),
                    samples: g.iter().map(|s| s.samples_count).sum(),
                    padded: 0,
                });
            }
        }
    }
    plan.replaced = candidates.iter().map(|s| s.shard_path.clone()).collect();
    plan.rows = candidates.iter().map(|s| s.samples_count).sum();
    plan.replaced_bytes = candidates.iter().map(|s| s.bytes).sum();
    Ok(plan)
}

/// A shard a compaction wrote: its bytes and its manifest entry (CRC-32C included).
#[derive(Debug, Clone)]
pub struct MergedShard {
    pub bytes: Vec<u8>,
    pub entry: ManifestShard,
}

/// An input shard, checked against the manifest entry that lists it: its size, its CRC-32C when
/// recorded, its header, and its `__metadata__` row counts.
fn input<'a>(
    base: &'a Manifest,
    name: &str,
    inputs: &[(&str, &'a [u8])],
) -> Result<(&'a [u8], Header, &'a ManifestShard), DatasetError> {
    let entry = base
        .shards
        .iter()
        .find(|s| s.shard_path == name)
        .ok_or_else(|| {
            err(format!(
                "shard {name} is not listed by the dataset's manifest"
            ))
        })?;
    let bytes = inputs
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, b)| *b)
        .ok_or_else(|| {
            err(format!(
                "shard {name}: its bytes were not given to the merge"
            ))
        })?;
    if bytes.len() as u64 != entry.bytes {
        return Err(err(format!(
            "shard {name} has {} bytes, the manifest records {}: it changed since it was written",
            bytes.len(),
            entry.bytes
        )));
    }
    if let Some(want) = &entry.crc32c {
        let got = crc32c_hex(crc32c::crc32c(bytes));
        if &got != want {
            return Err(err(format!(
                "shard {name} has CRC-32C {got}, the manifest records {want}: it changed since \
                 it was written"
            )));
        }
    }
    let header = parse_file_bytes(bytes).map_err(|e| err(format!("shard {name}: {e}")))?;
    let meta = header.metadata.clone().unwrap_or_default();
    for (key, want) in [
        (SAMPLES_METADATA_KEY, entry.samples_count),
        (PADDED_SAMPLES_METADATA_KEY, entry.padded()),
    ] {
        let got = meta.get(key).and_then(|v| v.parse::<u64>().ok());
        if got != Some(want) {
            return Err(err(format!(
                "shard {name}: __metadata__ {key} is {got:?}, the manifest records {want}"
            )));
        }
    }
    Ok((bytes, header, entry))
}

/// User metadata (keys outside [`RESERVED_METADATA_PREFIX`]) that every input agrees on.
fn common_user_metadata(headers: &[&Header]) -> BTreeMap<String, String> {
    let user = |h: &Header| -> BTreeMap<String, String> {
        h.metadata
            .iter()
            .flatten()
            .filter(|(k, _)| !k.starts_with(RESERVED_METADATA_PREFIX))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let mut out = headers.first().map(|h| user(h)).unwrap_or_default();
    for h in headers.iter().skip(1) {
        let u = user(h);
        out.retain(|k, v| u.get(k) == Some(v));
    }
    out
}

fn data<'a>(
    bytes: &'a [u8],
    header: &Header,
    name: &str,
    shard: &str,
) -> Result<&'a [u8], DatasetError> {
    let t = header
        .tensor(name)
        .ok_or_else(|| err(format!("shard {shard} has no tensor '{name}'")))?;
    let start = (header.data_start() + t.data_offsets[0]) as usize;
    let end = (header.data_start() + t.data_offsets[1]) as usize;
    bytes.get(start..end).ok_or_else(|| {
        err(format!(
            "shard {shard}: tensor '{name}' lies beyond the file"
        ))
    })
}

/// What the task that writes each output of `plan` needs, and no more: `base` with only the
/// output's input shards listed (its totals theirs) and `plan` with only that output (its
/// `replaced`: those inputs), so that a task parses what it merges, not the whole dataset (a
/// plan of `n` outputs over `s` shards costs O(s) on the driver, not O(n·s) in the tasks).
/// [`merge_output`] gives the same shard from a slice as from the whole.
pub fn task_slices(
    base: &Manifest,
    plan: &CompactionPlan,
) -> Result<Vec<(Manifest, CompactionPlan)>, DatasetError> {
    let by_name: BTreeMap<&str, &ManifestShard> = base
        .shards
        .iter()
        .map(|s| (s.shard_path.as_str(), s))
        .collect();
    let mut out = Vec::with_capacity(plan.outputs.len());
    for o in &plan.outputs {
        let mut names: Vec<&str> = o.inputs.iter().map(|i| i.shard.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        let mut m = Manifest {
            shards: Vec::with_capacity(names.len()),
            ..base.clone_without_shards()
        };
        for n in &names {
            let s = by_name
                .get(n)
                .ok_or_else(|| err(format!("shard {n} is not listed by the dataset's manifest")))?;
            m.shards.push((*s).clone());
        }
        m.recompute_totals();
        let p = CompactionPlan {
            replaced: names.iter().map(|n| n.to_string()).collect(),
            outputs: vec![o.clone()],
            deleted_keys: plan.deleted_keys.clone(),
            ..plan.clone_without_lists()
        };
        out.push((m, p));
    }
    Ok(out)
}

fn read_offsets(raw: &[u8]) -> Vec<i64> {
    raw.chunks_exact(8)
        .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect()
}

/// Writes shard `out` of `plan` from the bytes of its input shards (`inputs`: name → whole file;
/// each checked against `base`'s entry: size, CRC-32C, header, row counts). Batch layout: every
/// column's rows of the input slices concatenated in order (a ragged column's values
/// concatenated and its offsets rebased), padding added back for `tail_strategy=pad`; KV: every
/// tensor of the inputs copied unchanged. The shard's `__metadata__`: the reserved keys
/// (spec/dataset.md §4, `write_id` the compaction's) and the user keys every input has with the
/// same value.
pub fn merge_output(
    base: &Manifest,
    plan: &CompactionPlan,
    out: &PlannedShard,
    inputs: &[(&str, &[u8])],
) -> Result<MergedShard, DatasetError> {
    let Some(x) = &base.ext else {
        return Err(err("the dataset's manifest is not this connector's"));
    };
    let mut checked = Vec::with_capacity(out.inputs.len());
    for s in &out.inputs {
        checked.push(input(base, &s.shard, inputs)?);
    }
    let headers: Vec<&Header> = checked.iter().map(|(_, h, _)| h).collect();
    let mut meta = common_user_metadata(&headers);
    meta.insert(
        format!("{RESERVED_METADATA_PREFIX}format_version"),
        "1".into(),
    );
    meta.insert(
        format!("{RESERVED_METADATA_PREFIX}write_id"),
        plan.write_id.clone(),
    );
    meta.insert(SAMPLES_METADATA_KEY.into(), out.samples.to_string());
    meta.insert(PADDED_SAMPLES_METADATA_KEY.into(), out.padded.to_string());
    let mut owned: Vec<(TensorEntry, Vec<u8>)> = Vec::new();
    let mut borrowed: Vec<(TensorEntry, &[u8])> = Vec::new();
    match x.mode {
        DatasetMode::Batch => {
            meta.insert(format!("{RESERVED_METADATA_PREFIX}layout"), "batch".into());
            let ragged: Vec<&str> = base
                .schema
                .0
                .iter()
                .filter(|(_, t)| t.ragged.is_some())
                .map(|(n, _)| n.as_str())
                .collect();
            if !ragged.is_empty() {
                meta.insert(
                    RAGGED_METADATA_KEY.into(),
                    serde_json::to_string(&ragged).map_err(|e| err(e.to_string()))?,
                );
            }
            let rows = out.samples + out.padded;
            let expected_tensors = base.schema.len() + ragged.len();
            for ((_, h, e), s) in checked.iter().zip(&out.inputs) {
                if h.tensors.len() != expected_tensors {
                    return Err(err(format!(
                        "shard {} has {} tensors; the dataset's schema needs {expected_tensors}",
                        s.shard,
                        h.tensors.len()
                    )));
                }
                if s.end > e.samples_count {
                    return Err(err(format!("shard {}: rows beyond its samples", s.shard)));
                }
            }
            for (name, col) in &base.schema.0 {
                match &col.ragged {
                    None => {
                        let sample: Vec<u64> = col
                            .shape
                            .as_ref()
                            .map(|s| s.iter().skip(1).copied().collect())
                            .unwrap_or_default();
                        let row_bytes = col
                            .dtype
                            .checked_byte_len(sample.iter().product())
                            .ok_or_else(|| err(format!("column '{name}': row size overflows")))?;
                        let mut buf = Vec::with_capacity((row_bytes * rows) as usize);
                        for ((bytes, h, e), s) in checked.iter().zip(&out.inputs) {
                            let t = h.tensor(name).ok_or_else(|| {
                                err(format!("shard {} has no tensor '{name}'", s.shard))
                            })?;
                            let in_rows = e.samples_count + e.padded();
                            let mut want = vec![in_rows];
                            want.extend(&sample);
                            if t.dtype != col.dtype || t.shape != want {
                                return Err(err(format!(
                                    "shard {}: tensor '{name}' is {} {:?}; the schema needs {} {want:?}",
                                    s.shard, t.dtype, t.shape, col.dtype
                                )));
                            }
                            let raw = data(bytes, h, name, &s.shard)?;
                            buf.extend_from_slice(
                                &raw[(s.start * row_bytes) as usize..(s.end * row_bytes) as usize],
                            );
                        }
                        buf.resize((rows * row_bytes) as usize, 0);
                        let mut shape = vec![rows];
                        shape.extend(sample);
                        owned.push((
                            TensorEntry {
                                name: name.clone(),
                                dtype: col.dtype,
                                shape,
                            },
                            buf,
                        ));
                    }
                    Some(r) => {
                        let elem_bytes = col
                            .dtype
                            .checked_byte_len(r.inner_shape.iter().product())
                            .ok_or_else(|| {
                                err(format!("column '{name}': element size overflows"))
                            })?;
                        let offsets_name = ragged_offsets_name(name);
                        let mut values = Vec::new();
                        let mut offsets: Vec<i64> = vec![0];
                        for ((bytes, h, e), s) in checked.iter().zip(&out.inputs) {
                            let in_rows = e.samples_count + e.padded();
                            let elements =
                                crate::ragged::check_ragged_tensors(h, name, col.dtype, r, in_rows)
                                    .map_err(|m| err(format!("shard {}: {m}", s.shard)))?;
                            let offs = read_offsets(data(bytes, h, &offsets_name, &s.shard)?);
                            crate::ragged::check_offsets(name, &offs, elements)
                                .map_err(|m| err(format!("shard {}: {m}", s.shard)))?;
                            let raw = data(bytes, h, name, &s.shard)?;
                            let (a, z) = (offs[s.start as usize], offs[s.end as usize]);
                            let last = *offsets.last().unwrap_or(&0);
                            for i in s.start..s.end {
                                offsets.push(last + offs[i as usize + 1] - a);
                            }
                            values.extend_from_slice(
                                &raw[(a as u64 * elem_bytes) as usize
                                    ..(z as u64 * elem_bytes) as usize],
                            );
                        }
                        let last = *offsets.last().unwrap_or(&0);
                        offsets.resize((rows + 1) as usize, last);
                        let elements = values.len() as u64 / elem_bytes.max(1);
                        let elements = if elem_bytes == 0 {
                            last as u64
                        } else {
                            elements
                        };
                        let mut shape = vec![elements];
                        shape.extend(&r.inner_shape);
                        owned.push((
                            TensorEntry {
                                name: name.clone(),
                                dtype: col.dtype,
                                shape,
                            },
                            values,
                        ));
                        owned.push((
                            TensorEntry {
                                name: offsets_name,
                                dtype: Dtype::I64,
                                shape: vec![rows + 1],
                            },
                            offsets.iter().flat_map(|o| o.to_le_bytes()).collect(),
                        ));
                    }
                }
            }
        }
        DatasetMode::Kv => {
            let sep = x.kv_separator.clone().unwrap_or_default();
            meta.insert(format!("{RESERVED_METADATA_PREFIX}layout"), "kv".into());
            meta.insert(
                format!("{RESERVED_METADATA_PREFIX}kv_separator"),
                sep.clone(),
            );
            let deleted: std::collections::BTreeSet<&str> =
                plan.deleted_keys.iter().map(String::as_str).collect();
            let columns = kv_columns(base);
            for ((bytes, h, _), s) in checked.iter().zip(&out.inputs) {
                let split = if deleted.is_empty() {
                    None
                } else {
                    Some(
                        split_kv_header(h, &columns, &sep)
                            .map_err(|m| err(format!("shard {}: {m}", s.shard)))?,
                    )
                };
                for (i, t) in h.tensors.iter().enumerate() {
                    if let Some(split) = &split {
                        if deleted.contains(split.tensors[i].0) {
                            continue;
                        }
                    }
                    borrowed.push((
                        TensorEntry {
                            name: t.name.clone(),
                            dtype: t.dtype,
                            shape: t.shape.clone(),
                        },
                        data(bytes, h, &t.name, &s.shard)?,
                    ));
                }
            }
        }
    }
    let tensors: Vec<(TensorEntry, &[u8])> = owned
        .iter()
        .map(|(e, b)| (e.clone(), b.as_slice()))
        .chain(borrowed)
        .collect();
    let bytes = serialize(Some(&meta), &tensors)
        .map_err(|e| err(format!("new shard {}: {e}", out.name)))?;
    if x.mode == DatasetMode::Kv {
        // the keys of the new shard are exactly those of its inputs (no key split or lost)
        let header = parse_file_bytes(&bytes).map_err(|e| err(e.to_string()))?;
        let keys = split_kv_header(
            &header,
            &kv_columns(base),
            x.kv_separator.as_deref().unwrap_or_default(),
        )
        .map_err(|m| err(format!("new shard {}: {m}", out.name)))?
        .keys as u64;
        if keys != out.samples {
            return Err(err(format!(
                "new shard {} holds {keys} keys, its inputs list {}",
                out.name, out.samples
            )));
        }
    }
    let entry = ManifestShard {
        shard_path: out.name.clone(),
        samples_count: out.samples,
        bytes: bytes.len() as u64,
        partition: Some(out.partition),
        padded_samples: Some(out.padded),
        num_tensors: Some(tensors.len() as u64),
        crc32c: Some(crc32c_hex(crc32c::crc32c(&bytes))),
        added_version: None,
    };
    Ok(MergedShard { bytes, entry })
}

fn kv_columns(m: &Manifest) -> Vec<KvColumn> {
    m.schema
        .0
        .iter()
        .map(|(n, t)| KvColumn {
            name: n.clone(),
            dtype: t.dtype.name().to_string(),
            shape: t.shape.clone(),
        })
        .collect()
}

/// The first version after `base` in `log` that no longer lists `shard`: the commit that
/// removed a shard a compaction meant to replace.
pub fn version_that_removed<'a>(
    log: &'a [LogEntry],
    base: u64,
    shard: &str,
) -> Option<&'a LogEntry> {
    log.iter()
        .filter(|l| l.version > base)
        .find(|l| match &l.change {
            crate::log::Change::Full => !l.manifest.shards.iter().any(|s| s.shard_path == shard),
            crate::log::Change::Delta { remove, .. } => {
                remove.iter().any(|s| s.shard_path == shard)
            }
        })
}

/// Why a compaction cannot commit on top of `current`: a shard it replaces is gone (an
/// overwrite, a KV `lastWin` rewrite, another compaction committed since its plan). The message
/// names the version that removed it when `log` still holds it.
pub fn conflict(
    plan: &CompactionPlan,
    current: &Manifest,
    log: &[LogEntry],
) -> Option<DatasetError> {
    let gone = plan
        .replaced
        .iter()
        .find(|r| !current.shards.iter().any(|s| &s.shard_path == *r))?;
    let by = version_that_removed(log, plan.base_version, gone).map_or_else(
        || format!("version {} no longer lists it", current.manifest_version()),
        |l| {
            format!(
                "version {} ({}) removed it",
                l.version,
                l.manifest.ext.as_ref().and_then(|x| x.operation).map_or(
                    "operation not recorded".to_string(),
                    |o| {
                        serde_json::to_value(o)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_string))
                            .unwrap_or_default()
                    }
                )
            )
        },
    );
    let what = plan.what();
    let e = format!(
        "the {what} planned on version {} replaces shard {gone}, but {by}; nothing was \
         committed and the {what}'s own shards were deleted; run it again",
        plan.base_version
    );
    Some(match plan.operation {
        Operation::Delete => DatasetError::Delete { problem: e },
        _ => err(e),
    })
}

/// The manifest of the compaction version on top of `current`, the latest committed manifest
/// when the compaction commits (its plan's base or newer): `current`'s shards without
/// `plan.replaced`, plus `new` (the merged shards), `operation: compaction`, the next version,
/// `info` stamped. Shards appended since the plan are kept. Fails ([`conflict`]) when a shard it
/// replaces is no longer listed, or when the layout changed.
pub fn compaction_manifest(
    current: &Manifest,
    plan: &CompactionPlan,
    new: &[ManifestShard],
    info: &CommitInfo,
) -> Result<Manifest, DatasetError> {
    if let Some(e) = conflict(plan, current, &[]) {
        return Err(e);
    }
    let Some(x) = &current.ext else {
        return Err(err("the dataset's manifest is not this connector's"));
    };
    if x.mode != plan.layout || (plan.batch_size.is_some() && x.batch_size != plan.batch_size) {
        return Err(err(format!(
            "version {} changed the dataset's layout since the compaction's plan",
            x.manifest_version
        )));
    }
    let mut out = current.clone();
    out.shards
        .retain(|s| !plan.replaced.contains(&s.shard_path));
    for n in new {
        if out.shards.iter().any(|s| s.shard_path == n.shard_path) {
            return Err(err(format!("shard {} is listed twice", n.shard_path)));
        }
        out.shards.push(n.clone());
    }
    out.shards
        .sort_by(|a, b| a.shard_path.as_bytes().cmp(b.shard_path.as_bytes()));
    if out.shards.is_empty() {
        // a delete of every row: an empty dataset has no columns (spec/dataset.md §5)
        out.schema = Default::default();
    }
    out.recompute_totals();
    if Some(out.total_samples) != current.total_samples.checked_sub(plan.rows_removed) {
        return Err(err(format!(
            "the new shards hold {} rows in all, the shards they replace {} less {} removed",
            out.total_samples, current.total_samples, plan.rows_removed
        )));
    }
    crate::manifest::stamp_commit(&mut out, info)?;
    if let Some(x) = &mut out.ext {
        x.manifest_version += 1;
        x.operation = Some(plan.operation);
        x.vacuumed = None;
    }
    crate::manifest::stamp_added_versions(Some(current), &mut out);
    out.validate()?;
    Ok(out)
}

/// The index rows (spec/dataset.md §6.2) of a shard a compaction wrote, from its header: batch
/// layout one per tensor (column = tensor name), KV layout split into key and column.
#[cfg(feature = "index")]
pub fn index_rows(
    base: &Manifest,
    file_name: &str,
    bytes: &[u8],
) -> Result<Vec<crate::index::IndexRow>, DatasetError> {
    let header = parse_file_bytes(bytes).map_err(|e| err(format!("{file_name}: {e}")))?;
    let start = header.data_start();
    let kv = match base.ext.as_ref().map(|x| x.mode) {
        Some(DatasetMode::Kv) => {
            let cols = kv_columns(base);
            let sep = base
                .ext
                .as_ref()
                .and_then(|x| x.kv_separator.clone())
                .unwrap_or_default();
            let split = split_kv_header(&header, &cols, &sep)
                .map_err(|m| err(format!("{file_name}: {m}")))?;
            Some(
                split
                    .tensors
                    .into_iter()
                    .map(|(k, i)| (k.to_string(), cols[i].name.clone()))
                    .collect::<Vec<_>>(),
            )
        }
        _ => None,
    };
    Ok(header
        .tensors
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let (sample_key, column) = match &kv {
                Some(v) => (Some(v[i].0.clone()), v[i].1.clone()),
                None => (None, t.name.clone()),
            };
            crate::index::IndexRow {
                tensor_key: t.name.clone(),
                file_name: file_name.to_string(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                data_start: start + t.data_offsets[0],
                data_end: start + t.data_offsets[1],
                sample_key,
                column,
            }
        })
        .collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
pub(crate) mod tests;
