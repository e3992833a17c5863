//! Sharded checkpoints: a `*.safetensors.index.json` (`{"metadata": {"total_size": …},
//! "weight_map": {tensor: shard file}}`, as transformers and diffusers write it) makes the
//! shards of its directory one model. The model report checks that every mapped tensor is in the
//! shard the map names, that the shards hold nothing else, and gives totals per model.

use super::flags::{Flag, FlagCode};
use super::metadata::{escape, ModelInfo};
use super::{FileReport, Verdict};
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The suffix that marks an index file.
pub const INDEX_SUFFIX: &str = ".safetensors.index.json";

/// A parsed index file.
#[derive(Debug, Clone, PartialEq)]
pub struct Index {
    /// Tensor name → shard file name (relative to the index's directory).
    pub weight_map: BTreeMap<String, String>,
    /// `metadata.total_size`, when present.
    pub total_size: Option<u64>,
    /// The index's `metadata` object.
    pub metadata: Option<Value>,
    /// `weight_map` entries that are not a plain file name in the index's directory: tensor
    /// name → what is wrong (each gets its own `index_invalid` flag; not in `weight_map`).
    pub invalid_entries: BTreeMap<String, String>,
}

impl Index {
    /// The shard file names, sorted, once each.
    pub fn shards(&self) -> BTreeSet<&str> {
        self.weight_map.values().map(String::as_str).collect()
    }
}

/// Whether `path` names an index file.
pub fn is_index(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(INDEX_SUFFIX))
}

/// Reads and checks an index file; the error says what is wrong with it.
pub fn read_index(path: &Path) -> Result<Index, String> {
    let mut text = String::new();
    crate::file::open_regular(path)
        .and_then(|mut f| std::io::Read::read_to_string(&mut f, &mut text))
        .map_err(|e| format!("cannot be read: {e}"))?;
    let value: Value =
        serde_json::from_str(&text).map_err(|e| format!("is not valid JSON: {e}"))?;
    let Some(map) = value.get("weight_map").and_then(Value::as_object) else {
        return Err("has no `weight_map` object".into());
    };
    let mut weight_map = BTreeMap::new();
    let mut invalid_entries = BTreeMap::new();
    for (tensor, shard) in map {
        let Some(shard) = shard.as_str() else {
            invalid_entries.insert(
                tensor.clone(),
                format!(
                    "`weight_map` entry `{}` is not a file name string",
                    escape(tensor)
                ),
            );
            continue;
        };
        let plain = Path::new(shard)
            .file_name()
            .is_some_and(|n| n.to_str() == Some(shard));
        if !plain {
            invalid_entries.insert(
                tensor.clone(),
                format!(
                    "`weight_map` entry `{}` names `{}`, which is not a file name in the index's directory",
                    escape(tensor),
                    escape(shard)
                ),
            );
            continue;
        }
        weight_map.insert(tensor.clone(), shard.to_owned());
    }
    let metadata = value.get("metadata").cloned();
    let total_size = metadata
        .as_ref()
        .and_then(|m| m.get("total_size"))
        .and_then(|t| {
            t.as_u64()
                .or_else(|| t.as_str().and_then(|s| s.parse().ok()))
        });
    Ok(Index {
        weight_map,
        total_size,
        metadata,
        invalid_entries,
    })
}

/// The shard paths an index names (for the caller to report on before [`model_report`]).
pub fn shard_paths(index_path: &Path, index: &Index) -> Vec<PathBuf> {
    let dir = index_path.parent().unwrap_or(Path::new("."));
    index.shards().into_iter().map(|s| dir.join(s)).collect()
}

/// The report on one sharded model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelReport {
    /// Always `"model"`.
    pub kind: &'static str,
    /// The index file.
    pub path: String,
    /// Worst of the model's own flags and its shards' verdicts.
    pub verdict: Verdict,
    /// Shard file names, sorted.
    pub shards: Vec<String>,
    /// Per shard file name: its own report's verdict.
    pub shard_verdicts: BTreeMap<String, Verdict>,
    pub tensor_count: u64,
    pub parameter_count: u64,
    pub bytes_per_dtype: BTreeMap<String, u64>,
    /// Sum of every shard's tensor bytes.
    pub data_bytes: u64,
    /// `metadata.total_size` of the index.
    pub declared_total_size: Option<u64>,
    pub flags: Vec<Flag>,
    /// From the first shard (by name) whose `__metadata__` gives any.
    pub model_info: ModelInfo,
    /// The index's `metadata` object.
    pub index_metadata: Option<Value>,
}

/// Builds the model report of `index_path` from its parsed index (or why it could not be read)
/// and the reports of its shards, found through `shard(path)`.
pub fn model_report<'a>(
    index_path: &Path,
    index: &Result<Index, String>,
    shard: impl Fn(&Path) -> Option<&'a FileReport>,
) -> ModelReport {
    let label = index_path.display().to_string();
    let mut m = ModelReport {
        kind: "model",
        path: label.clone(),
        verdict: Verdict::Clean,
        shards: Vec::new(),
        shard_verdicts: BTreeMap::new(),
        tensor_count: 0,
        parameter_count: 0,
        bytes_per_dtype: BTreeMap::new(),
        data_bytes: 0,
        declared_total_size: None,
        flags: Vec::new(),
        model_info: ModelInfo::default(),
        index_metadata: None,
    };
    let index = match index {
        Ok(i) => i,
        Err(why) => {
            m.flags.push(Flag::new(
                FlagCode::IndexInvalid,
                None,
                format!("index {label} {why}"),
            ));
            m.verdict = Verdict::Invalid;
            return m;
        }
    };
    m.declared_total_size = index.total_size;
    m.index_metadata = index.metadata.clone();
    // one flag per bad entry, naming its tensor; the valid entries are still checked
    for (tensor, why) in &index.invalid_entries {
        m.flags.push(Flag::new(
            FlagCode::IndexInvalid,
            Some(tensor),
            format!("index {label}: {why}"),
        ));
    }
    let dir = index_path.parent().unwrap_or(Path::new("."));
    let mut worst = Verdict::Clean;
    for name in index.shards() {
        m.shards.push(name.to_owned());
        let path = dir.join(name);
        let report = shard(&path).filter(|r| path.is_file() && r.header_size.is_some());
        let Some(report) = report else {
            let mapped = index.weight_map.values().filter(|s| *s == name).count();
            m.flags.push(Flag::new(
                FlagCode::ShardMissing,
                None,
                format!(
                    "shard `{}` ({mapped} tensors in the weight_map) is missing or unreadable: {}",
                    escape(name),
                    path.display()
                ),
            ));
            continue;
        };
        worst = worst.max(report.verdict);
        m.shard_verdicts.insert(name.to_owned(), report.verdict);
        m.tensor_count += report.tensor_count;
        m.parameter_count = m.parameter_count.saturating_add(report.parameter_count);
        for (d, b) in &report.bytes_per_dtype {
            let t = m.bytes_per_dtype.entry(d.clone()).or_default();
            *t = t.saturating_add(*b);
            m.data_bytes = m.data_bytes.saturating_add(*b);
        }
        if m.model_info == ModelInfo::default() {
            m.model_info = report.model_info.clone();
        }
        let held: BTreeSet<&str> = report.tensors.iter().map(|t| t.name.as_str()).collect();
        for (tensor, _) in index.weight_map.iter().filter(|(_, s)| *s == name) {
            if !held.contains(tensor.as_str()) {
                m.flags.push(Flag::new(
                    FlagCode::IndexTensorMissing,
                    Some(tensor),
                    format!(
                        "tensor `{}` is mapped to shard `{}`, which does not hold it ({} tensors there)",
                        escape(tensor),
                        escape(name),
                        held.len()
                    ),
                ));
            }
        }
        for t in &report.tensors {
            match index.weight_map.get(&t.name) {
                Some(s) if s == name => {}
                // its entry is flagged already (index_invalid)
                None if index.invalid_entries.contains_key(&t.name) => {}
                other => m.flags.push(Flag::new(
                    FlagCode::IndexTensorExtra,
                    Some(&t.name),
                    format!(
                        "shard `{}` holds tensor `{}` ({} bytes) that the weight_map {}",
                        escape(name),
                        escape(&t.name),
                        t.byte_size,
                        match other {
                            Some(s) => format!("maps to shard `{}`", escape(s)),
                            None => "does not list".into(),
                        }
                    ),
                )),
            }
        }
    }
    if let Some(declared) = index.total_size {
        let complete = !m.flags.iter().any(|f| f.code == FlagCode::ShardMissing);
        if complete && declared != m.data_bytes {
            m.flags.push(Flag::new(
                FlagCode::IndexTotalSizeMismatch,
                None,
                format!(
                    "the index declares total_size {declared}, the shards' tensors hold {} bytes",
                    m.data_bytes
                ),
            ));
        }
    }
    m.verdict = worst.max(Verdict::of(&m.flags));
    m
}
