//! Delete (spec/dataset.md §5.11): the rules, once. A delete is copy-on-write: the shards holding
//! rows to delete are rewritten without them, as one version with `operation: "delete"`; every
//! other shard is untouched. The plan is a [`CompactionPlan`] with `operation: delete`, so the
//! byte-level merge ([`crate::compaction::merge_output`]), the commit rebased on concurrent
//! appends and the conflict with a concurrent rewrite of the same shards
//! ([`crate::compaction::conflict`], [`crate::compaction::compaction_manifest`]) are the
//! compaction's, and so is the runner of every language (local: [`local`]; Spark: JNI).
//!
//! * Batch layout: the rows of a shard are named by their index among its real rows (0-based,
//!   what the readers' provenance `row_index` says). The kept rows of all the affected shards,
//!   in manifest order, are concatenated and cut into shards of `batch_size` rows; the last one
//!   is a tail (padded again with `tail_strategy=pad`; with `drop` it is kept short: a delete
//!   removes exactly the rows it is asked to).
//! * KV layout: keys. Each shard holding a deleted key is rewritten without that key's tensors;
//!   a shard left with no key is dropped.
//! * A shard all of whose rows are deleted is dropped without being read.

use crate::compaction::partition_of;
use crate::compaction::{CompactionPlan, InputSlice, PlannedShard};
use crate::kv::{split_kv_header, KvColumn};
use crate::manifest::{DatasetMode, Manifest, Operation, TailStrategy};
use crate::names::shard_file_name;
use crate::DatasetError;
use safetensors_spark_format::header::Header;
use std::collections::{BTreeMap, BTreeSet};

pub mod local;

fn err(problem: impl Into<String>) -> DatasetError {
    DatasetError::Delete {
        problem: problem.into(),
    }
}

fn ext_of(base: &Manifest) -> Result<&crate::manifest::ManifestExt, DatasetError> {
    base.ext.as_ref().ok_or_else(|| {
        err(
            "the dataset's manifest has only the published fields (written by another tool); \
             a delete works on datasets this connector wrote",
        )
    })
}

fn empty_plan(base: &Manifest, write_id: &str) -> Result<CompactionPlan, DatasetError> {
    let x = ext_of(base)?;
    Ok(CompactionPlan {
        base_version: x.manifest_version,
        layout: x.mode,
        write_id: write_id.to_string(),
        batch_size: x.batch_size,
        target_bytes: None,
        replaced: Vec::new(),
        outputs: Vec::new(),
        rows: 0,
        replaced_bytes: 0,
        operation: Operation::Delete,
        rows_removed: 0,
        deleted_keys: Vec::new(),
    })
}

/// The plan of deleting rows of a batch dataset: `rows` maps a listed shard to the indices of
/// its real rows to delete (0-based). Errors (nothing is changed): a KV dataset, a shard the
/// manifest does not list, a row index beyond the shard's rows. An empty `rows` (or only empty
/// sets) is a plan with nothing to do.
pub fn plan_delete_rows(
    base: &Manifest,
    rows: &BTreeMap<String, BTreeSet<u64>>,
    write_id: &str,
) -> Result<CompactionPlan, DatasetError> {
    let mut plan = empty_plan(base, write_id)?;
    let x = ext_of(base)?;
    if x.mode != DatasetMode::Batch {
        return Err(err(
            "this dataset is in KV layout: delete its rows by key (delete_keys, `safetensors-spark \
             delete --keys`), not by row index",
        ));
    }
    for (shard, set) in rows {
        let Some(s) = base.shards.iter().find(|s| &s.shard_path == shard) else {
            return Err(err(format!(
                "shard {shard} is not listed by version {} of the dataset",
                x.manifest_version
            )));
        };
        if let Some(&last) = set.iter().next_back() {
            if last >= s.samples_count {
                return Err(err(format!(
                    "row {last} of shard {shard}: the shard has {} rows (0 to {})",
                    s.samples_count,
                    s.samples_count.saturating_sub(1)
                )));
            }
        }
    }
    let b = x.batch_size.unwrap_or(0).max(1);
    let pad = x.tail_strategy == Some(TailStrategy::Pad);
    // the affected shards in manifest order, and the runs of rows each keeps
    let mut kept: Vec<InputSlice> = Vec::new();
    let mut first_partition = None;
    for s in &base.shards {
        let Some(set) = rows.get(&s.shard_path).filter(|r| !r.is_empty()) else {
            continue;
        };
        plan.replaced.push(s.shard_path.clone());
        plan.replaced_bytes += s.bytes;
        plan.rows_removed += set.len() as u64;
        first_partition.get_or_insert(partition_of(s));
        let mut start = 0u64;
        for &r in set.iter().chain(std::iter::once(&s.samples_count)) {
            if r > start {
                kept.push(InputSlice {
                    shard: s.shard_path.clone(),
                    start,
                    end: r,
                });
            }
            start = r + 1;
        }
    }
    let total: u64 = kept.iter().map(|k| k.end - k.start).sum();
    plan.rows = total;
    let partition = first_partition.unwrap_or(0);
    let (mut at, mut offset) = (0usize, 0u64);
    let mut done = 0u64;
    let mut k = 0u32;
    while done < total {
        let samples = b.min(total - done);
        let mut need = samples;
        let mut inputs = Vec::new();
        while need > 0 {
            let slice = &kept[at];
            let take = need.min(slice.end - slice.start - offset);
            inputs.push(InputSlice {
                shard: slice.shard.clone(),
                start: slice.start + offset,
                end: slice.start + offset + take,
            });
            offset += take;
            need -= take;
            if slice.start + offset == slice.end {
                at += 1;
                offset = 0;
            }
        }
        plan.outputs.push(PlannedShard {
            name: shard_file_name(partition, k, write_id),
            partition,
            inputs,
            samples,
            padded: if pad { b - samples } else { 0 },
        });
        k += 1;
        done += samples;
    }
    Ok(plan)
}

/// The columns of a KV manifest's schema, as [`split_kv_header`] takes them.
pub fn kv_columns(m: &Manifest) -> Vec<KvColumn> {
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

/// The plan of deleting `keys` from a KV dataset: `headers` holds the header of every shard
/// `base` lists (by name). Each shard with a deleted key becomes one shard without it (a shard
/// left with none is dropped). Keys the dataset does not hold are ignored (the outcome counts
/// what was removed). Errors: a batch dataset, a missing header, a header that does not split
/// into the schema's columns.
pub fn plan_delete_keys(
    base: &Manifest,
    headers: &BTreeMap<String, Header>,
    keys: &BTreeSet<String>,
    write_id: &str,
) -> Result<CompactionPlan, DatasetError> {
    check_kv(base)?;
    if let Some(s) = base
        .shards
        .iter()
        .find(|s| !headers.contains_key(&s.shard_path))
    {
        return Err(err(format!(
            "no header was read for shard {}",
            s.shard_path
        )));
    }
    plan_delete_keys_in(base, headers, keys, write_id)
}

fn check_kv(base: &Manifest) -> Result<(), DatasetError> {
    if ext_of(base)?.mode != DatasetMode::Kv {
        return Err(err(
            "this dataset is in batch layout: its rows have no keys; delete rows by a predicate \
             (Spark DELETE, SafetensorsDataset.delete) or by shard and row index (delete_rows)",
        ));
    }
    Ok(())
}

/// The tensor names `keys` have in the KV dataset `base` (`<key><kv_separator><column>` for
/// every column of its schema), sorted: what a caller looks up (the tensor index, a per-tensor
/// read's `key` column) to find the candidate shards of [`plan_delete_keys_in`]. Errors: a batch
/// dataset, a manifest of another tool, an empty `keys`.
pub fn kv_tensor_names(
    base: &Manifest,
    keys: &BTreeSet<String>,
) -> Result<Vec<String>, DatasetError> {
    check_kv(base)?;
    if keys.is_empty() {
        return Err(err("the list of keys is empty; give at least one key"));
    }
    let sep = ext_of(base)?.kv_separator.clone().unwrap_or_default();
    let mut names = Vec::with_capacity(keys.len() * base.schema.0.len());
    for k in keys {
        for (c, _) in &base.schema.0 {
            names.push(format!("{k}{sep}{c}"));
        }
    }
    names.sort();
    names.dedup();
    Ok(names)
}

/// [`plan_delete_keys`] given the headers of the **candidate** shards only: the caller found,
/// by other means (the tensor index, or a scan of the headers elsewhere), the listed shards that
/// may hold a key of `keys`, and promises that no other listed shard holds one; only the shards
/// in `headers` are examined and rewritten (the Spark connector, which must not read every
/// header on the driver). A header of a shard `base` does not list is an error (a concurrent
/// commit removed it: plan again on the newer version).
pub fn plan_delete_keys_in(
    base: &Manifest,
    headers: &BTreeMap<String, Header>,
    keys: &BTreeSet<String>,
    write_id: &str,
) -> Result<CompactionPlan, DatasetError> {
    let mut plan = empty_plan(base, write_id)?;
    check_kv(base)?;
    let x = ext_of(base)?;
    if let Some(name) = headers
        .keys()
        .find(|n| !base.shards.iter().any(|s| &&s.shard_path == n))
    {
        return Err(err(format!(
            "shard {name} is not listed by version {} of the dataset",
            x.manifest_version
        )));
    }
    let sep = x.kv_separator.clone().unwrap_or_default();
    let columns = kv_columns(base);
    let mut deleted: BTreeSet<String> = BTreeSet::new();
    for s in &base.shards {
        let Some(h) = headers.get(&s.shard_path) else {
            continue;
        };
        let split = split_kv_header(h, &columns, &sep)
            .map_err(|m| err(format!("shard {}: {m}", s.shard_path)))?;
        let mut here: BTreeSet<&str> = BTreeSet::new();
        let mut all: BTreeSet<&str> = BTreeSet::new();
        for (k, _) in &split.tensors {
            all.insert(k);
            if keys.contains(*k) {
                here.insert(k);
            }
        }
        if here.is_empty() {
            continue;
        }
        plan.replaced.push(s.shard_path.clone());
        plan.replaced_bytes += s.bytes;
        plan.rows_removed += here.len() as u64;
        deleted.extend(here.iter().map(|k| k.to_string()));
        let left = all.len() as u64 - here.len() as u64;
        plan.rows += left;
        if left > 0 {
            let partition = partition_of(s);
            plan.outputs.push(PlannedShard {
                name: shard_file_name(partition, plan.outputs.len() as u32, write_id),
                partition,
                inputs: vec![InputSlice {
                    shard: s.shard_path.clone(),
                    start: 0,
                    end: s.samples_count,
                }],
                samples: left,
                padded: 0,
            });
        }
    }
    plan.deleted_keys = deleted.into_iter().collect();
    Ok(plan)
}

/// The plan of dropping whole shards (every row of each): a delete whose predicate selects
/// whole shards (a partition predicate, spec/dataset.md §7) reads none of them.
pub fn plan_drop_shards(
    base: &Manifest,
    shards: &[String],
    write_id: &str,
) -> Result<CompactionPlan, DatasetError> {
    let mut plan = empty_plan(base, write_id)?;
    for name in shards {
        let Some(s) = base.shards.iter().find(|s| &s.shard_path == name) else {
            return Err(err(format!("shard {name} is not listed by the dataset")));
        };
        if !plan.replaced.contains(name) {
            plan.replaced.push(name.clone());
            plan.replaced_bytes += s.bytes;
            plan.rows_removed += s.samples_count;
        }
    }
    Ok(plan)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
