//! `NativeCompaction`: compaction through the JVM (spec/dataset.md §5.8.2). The rules are the
//! dataset crate's (`compaction.rs`); the JVM lists, copies shards between its file system and a
//! task's local work directory, and commits with the writers' protocol.

use crate::{arg, failed, guard, parse_json, to_json, JniError};
use ::jni::objects::{JClass, JString};
use ::jni::sys::jint;
use ::jni::{Env, EnvUnowned};
use safetensors_spark_dataset::compaction::{
    compaction_manifest, conflict, merge_output, plan_compaction, task_slices, CompactionPlan,
    CompactionRequest,
};
use safetensors_spark_dataset::manifest::{CommitInfo, ManifestShard};
use safetensors_spark_dataset::names::shard_index_part_file_name;
use safetensors_spark_dataset::vacuum::{deletes_at_commit, LogEntry};
use safetensors_spark_dataset::{check_shard_path, parse_manifest};
use serde_json::json;
use std::path::Path;

fn manifest(text: &str, what: &str) -> Result<safetensors_spark_dataset::Manifest, JniError> {
    parse_manifest(text).map_err(|e| JniError::from(e).context(format_args!("{what}")))
}

#[derive(serde::Deserialize)]
struct PlanRequest {
    batch_size: Option<u64>,
    target_shard_size_mb: Option<u64>,
    write_id: String,
}

/// `planCompaction`: the plan of a compaction of the latest manifest `latest`.
pub fn plan_compaction_json(latest: &str, request_json: &str) -> Result<String, JniError> {
    let r: PlanRequest = parse_json(request_json, "compaction request")?;
    let m = manifest(latest, "the dataset's current manifest")?;
    let plan = plan_compaction(
        &m,
        &CompactionRequest {
            batch_size: r.batch_size,
            target_shard_size_mb: r.target_shard_size_mb,
        },
        &r.write_id,
    )
    .map_err(|e| JniError::invalid_argument(e.to_string()))?;
    to_json(&plan)
}

/// `compactShard`: writes output `index` of `plan` into `work_dir` from the input shards there
/// (and its index part when `indexed`); returns its manifest entry.
pub fn compact_shard_json(
    latest: &str,
    plan_json: &str,
    index: usize,
    work_dir: &str,
    indexed: bool,
) -> Result<String, JniError> {
    let m = manifest(latest, "the compaction's base manifest")?;
    let plan: CompactionPlan = parse_json(plan_json, "compaction plan")?;
    let out = plan
        .outputs
        .get(index)
        .ok_or_else(|| JniError::invalid_argument(format!("no output {index} in the plan")))?;
    let dir = Path::new(work_dir);
    let mut inputs = Vec::new();
    for s in &out.inputs {
        check_shard_path(&s.shard)?;
        let p = dir.join(&s.shard);
        let bytes = std::fs::read(&p).map_err(|e| failed(format!("{}: {e}", p.display())))?;
        inputs.push((s.shard.clone(), bytes));
    }
    let refs: Vec<(&str, &[u8])> = inputs
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice()))
        .collect();
    let merged = merge_output(&m, &plan, out, &refs)?;
    let dest = dir.join(&out.name);
    std::fs::write(&dest, &merged.bytes).map_err(|e| failed(format!("{}: {e}", dest.display())))?;
    if indexed {
        if let Some(part) = shard_index_part_file_name(&out.name) {
            safetensors_spark_dataset::compaction::local::write_index_part(
                &dir.join(part),
                &m,
                &out.name,
                &merged.bytes,
            )
            .map_err(failed)?;
        }
    }
    to_json(&merged.entry)
}

/// `compactionTasks`: for each output of `plan`, what its task is given (`[{"base", "plan"}]`):
/// the base manifest listing only the output's inputs and the plan of that output alone
/// ([`task_slices`]); a task runs [`compact_shard_json`] on them with output 0.
pub fn compaction_tasks_json(latest: &str, plan_json: &str) -> Result<String, JniError> {
    let m = manifest(latest, "the compaction's base manifest")?;
    let plan: CompactionPlan = parse_json(plan_json, "compaction plan")?;
    let mut out = Vec::with_capacity(plan.outputs.len());
    for (base, p) in task_slices(&m, &plan)? {
        out.push(json!({
            "base": serde_json::to_string(&base).map_err(failed)?,
            "plan": serde_json::to_string(&p).map_err(failed)?,
        }));
    }
    to_json(&out)
}

/// A log entry as the compaction's caller passes it: a `ListedLogEntry` whose text was read and
/// whose time a compaction does not need.
#[derive(serde::Deserialize)]
struct LogEntryText {
    version: u64,
    text: String,
}

/// `compactionManifest`: the compaction version on top of `current` (`{"manifest", "version",
/// "retain"}`), or the conflict naming the version that removed a replaced shard (`log`: the
/// entries after the plan's base).
pub fn compaction_manifest_json(
    current: &str,
    plan_json: &str,
    new_json: &str,
    commit_info_json: &str,
    log_json: &str,
) -> Result<String, JniError> {
    let current = manifest(current, "the dataset's current manifest")?;
    let plan: CompactionPlan = parse_json(plan_json, "compaction plan")?;
    let new: Vec<ManifestShard> = parse_json(new_json, "compaction shards")?;
    let info: CommitInfo = parse_json(commit_info_json, "commit info")?;
    let entries: Vec<LogEntryText> = parse_json(log_json, "manifest log")?;
    let mut log = Vec::new();
    for e in entries {
        let file = safetensors_spark_dataset::log::LogFile::Entry(e.version);
        let record = safetensors_spark_dataset::log::parse_log_file(file, &e.text)
            .map_err(|err| JniError::from(err).context(format_args!("a manifest log entry")))?;
        log.push(LogEntry::from_record(record, 0));
    }
    if let Some(e) = conflict(&plan, &current, &log) {
        return Err(JniError::from(e));
    }
    let next = compaction_manifest(&current, &plan, &new, &info)?;
    to_json(&json!({
        "manifest": next.to_json_pretty().map_err(failed)?,
        "version": next.manifest_version(),
        "retain": !deletes_at_commit(Some(&current), &next),
    }))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteRequest {
    write_id: String,
    /// Shard name → the indices of its real rows to delete.
    #[serde(default)]
    delete: std::collections::BTreeMap<String, Vec<u64>>,
    /// Shard name → the runs `[start, end)` of its real rows to keep (a copy-on-write DELETE's
    /// rows read and not matched): every other row of the shard is deleted.
    #[serde(default)]
    keep: std::collections::BTreeMap<String, Vec<(u64, u64)>>,
    /// Every row of every shard (a DELETE whose condition selects whole partitions: no shard is
    /// read).
    #[serde(default)]
    all: bool,
    /// KV layout: the keys to delete (then `delete`, `keep` and `all` are not given).
    keys: Option<Vec<String>>,
    /// With `keys`: the headers of the candidate shards (those that may hold a key, found by the
    /// caller through the tensor index or a scan), as stored, with the file's length; no other
    /// listed shard is examined (`delete::plan_delete_keys_in`).
    #[serde(default)]
    headers: std::collections::BTreeMap<String, ShardHeaderText>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ShardHeaderText {
    header: String,
    length: u64,
}

/// The KV half of `planDelete`: `keys` from the candidate shards `headers`.
fn plan_delete_keys_json(
    m: &safetensors_spark_dataset::Manifest,
    keys: Vec<String>,
    headers: std::collections::BTreeMap<String, ShardHeaderText>,
    write_id: &str,
) -> Result<String, JniError> {
    if keys.is_empty() {
        return Err(JniError::invalid_argument(
            "delete: the list of keys is empty; give at least one key",
        ));
    }
    let mut parsed = std::collections::BTreeMap::new();
    for (shard, h) in headers {
        check_shard_path(&shard)?;
        let header = safetensors_spark_format::header::parse_header(h.header.as_bytes(), h.length)
            .map_err(|e| JniError::invalid_argument(format!("delete: shard {shard}: {e}")))?;
        parsed.insert(shard, header);
    }
    let keys: std::collections::BTreeSet<String> = keys.into_iter().collect();
    let plan = safetensors_spark_dataset::delete::plan_delete_keys_in(m, &parsed, &keys, write_id)
        .map_err(|e| JniError::invalid_argument(e.to_string()))?;
    to_json(&plan)
}

/// `planDelete`: the plan of a delete (spec/dataset.md §5.11) on the latest manifest `latest`.
pub fn plan_delete_json(latest: &str, request_json: &str) -> Result<String, JniError> {
    let r: DeleteRequest = parse_json(request_json, "delete request")?;
    let m = manifest(latest, "the dataset's current manifest")?;
    if let Some(keys) = r.keys {
        if r.all || !r.delete.is_empty() || !r.keep.is_empty() {
            return Err(JniError::invalid_argument(
                "delete: a request gives keys (KV layout) or rows (delete, keep, all), not both",
            ));
        }
        return plan_delete_keys_json(&m, keys, r.headers, &r.write_id);
    }
    if !r.headers.is_empty() {
        return Err(JniError::invalid_argument(
            "delete: headers are given with keys only",
        ));
    }
    let mut rows: std::collections::BTreeMap<String, std::collections::BTreeSet<u64>> = r
        .delete
        .into_iter()
        .map(|(k, v)| (k, v.into_iter().collect()))
        .collect();
    for (shard, runs) in r.keep {
        let samples = m
            .shards
            .iter()
            .find(|s| s.shard_path == shard)
            .map(|s| s.samples_count)
            .ok_or_else(|| {
                JniError::invalid_argument(format!(
                    "delete: shard {shard} is not listed by version {} of the dataset (a \
                     concurrent commit removed it)",
                    m.manifest_version()
                ))
            })?;
        let mut keep = vec![false; usize::try_from(samples).map_err(failed)?];
        for (a, b) in runs {
            if a > b || b > samples {
                return Err(JniError::invalid_argument(format!(
                    "delete: rows {a}..{b} of shard {shard}, which has {samples} rows"
                )));
            }
            for k in &mut keep[a as usize..b as usize] {
                *k = true;
            }
        }
        let set = rows.entry(shard).or_default();
        set.extend((0..samples).filter(|i| !keep[*i as usize]));
    }
    if r.all {
        for s in &m.shards {
            rows.entry(s.shard_path.clone())
                .or_default()
                .extend(0..s.samples_count);
        }
    }
    let plan = safetensors_spark_dataset::delete::plan_delete_rows(&m, &rows, &r.write_id)
        .map_err(|e| JniError::invalid_argument(e.to_string()))?;
    to_json(&plan)
}

/// `deleteKeyTensors`: the tensor names (JSON array) of `keys_json` (a JSON array of keys) in
/// the KV dataset whose latest manifest is `latest` (`delete::kv_tensor_names`).
pub fn delete_key_tensors_json(latest: &str, keys_json: &str) -> Result<String, JniError> {
    let keys: Vec<String> = parse_json(keys_json, "keys")?;
    let m = manifest(latest, "the dataset's current manifest")?;
    let keys: std::collections::BTreeSet<String> = keys.into_iter().collect();
    let names = safetensors_spark_dataset::delete::kv_tensor_names(&m, &keys)
        .map_err(|e| JniError::invalid_argument(e.to_string()))?;
    to_json(&names)
}

/// `headerHoldsAny`: whether the shard header `header` (its JSON text, of a file of `length`
/// bytes) names one of the tensors in `names_json` (a JSON array), by the format's header rule.
/// A header that does not parse is kept (true): the delete's plan then refuses it, naming it.
pub fn header_holds_any(header: &str, length: u64, names_json: &str) -> Result<bool, JniError> {
    let names: std::collections::BTreeSet<String> = parse_json(names_json, "tensor names")?;
    Ok(
        match safetensors_spark_format::header::parse_header(header.as_bytes(), length) {
            Ok(h) => h.tensors.iter().any(|t| names.contains(&t.name)),
            Err(_) => true,
        },
    )
}

/// `static native boolean headerHoldsAny(String headerJson, long fileLength, String namesJson)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeCompaction_headerHoldsAny<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    header: JString<'local>,
    length: ::jni::sys::jlong,
    names: JString<'local>,
) -> ::jni::sys::jboolean {
    guard(&mut env, |env| {
        let header = arg(env, &header, "headerJson")?;
        let names = arg(env, &names, "namesJson")?;
        let length = u64::try_from(length).map_err(|_| {
            JniError::invalid_argument(format!("fileLength {length}: must be >= 0"))
        })?;
        header_holds_any(&header, length, &names)
    })
}

/// `static native String deleteKeyTensors(String latestManifestJson, String keysJson)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeCompaction_deleteKeyTensors<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    latest: JString<'local>,
    keys: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let latest = arg(env, &latest, "latestManifestJson")?;
        let keys = arg(env, &keys, "keysJson")?;
        let json = delete_key_tensors_json(&latest, &keys)?;
        new_string(env, &json)
    })
}

/// `static native String planDelete(String latestManifestJson, String requestJson)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeCompaction_planDelete<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    latest: JString<'local>,
    request: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let latest = arg(env, &latest, "latestManifestJson")?;
        let request = arg(env, &request, "requestJson")?;
        let json = plan_delete_json(&latest, &request)?;
        new_string(env, &json)
    })
}

fn new_string<'local>(env: &mut Env<'local>, s: &str) -> Result<JString<'local>, JniError> {
    Ok(env.new_string(s)?)
}

/// `static native String planCompaction(String latestManifestJson, String requestJson)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeCompaction_planCompaction<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    latest: JString<'local>,
    request: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let latest = arg(env, &latest, "latestManifestJson")?;
        let request = arg(env, &request, "requestJson")?;
        let json = plan_compaction_json(&latest, &request)?;
        new_string(env, &json)
    })
}

/// `static native String compactShard(String baseManifestJson, String planJson, int output,
/// String workDir, boolean indexed)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeCompaction_compactShard<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    base: JString<'local>,
    plan: JString<'local>,
    output: jint,
    work_dir: JString<'local>,
    indexed: ::jni::sys::jboolean,
) -> JString<'local> {
    guard(&mut env, |env| {
        let base = arg(env, &base, "baseManifestJson")?;
        let plan = arg(env, &plan, "planJson")?;
        let work_dir = arg(env, &work_dir, "workDir")?;
        let index = usize::try_from(output)
            .map_err(|_| JniError::invalid_argument(format!("output {output}")))?;
        let json = compact_shard_json(&base, &plan, index, &work_dir, indexed)?;
        new_string(env, &json)
    })
}

/// `static native String compactionManifest(String currentManifestJson, String planJson,
/// String newShardsJson, String commitInfoJson, String logJson)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeCompaction_compactionManifest<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    current: JString<'local>,
    plan: JString<'local>,
    new: JString<'local>,
    info: JString<'local>,
    log: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let current = arg(env, &current, "currentManifestJson")?;
        let plan = arg(env, &plan, "planJson")?;
        let new = arg(env, &new, "newShardsJson")?;
        let info = arg(env, &info, "commitInfoJson")?;
        let log = arg(env, &log, "logJson")?;
        let json = compaction_manifest_json(&current, &plan, &new, &info, &log)?;
        new_string(env, &json)
    })
}

/// `static native String compactionTasks(String baseManifestJson, String planJson)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeCompaction_compactionTasks<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    base: JString<'local>,
    plan: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let base = arg(env, &base, "baseManifestJson")?;
        let plan = arg(env, &plan, "planJson")?;
        let json = compaction_tasks_json(&base, &plan)?;
        new_string(env, &json)
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const SHARD: &str = "part-00000-0000-da00469b-a55f-4073-aab9-ebe00a87c0f3.safetensors";

    fn kv_manifest() -> String {
        json!({
            "format_version": "1.0", "safetensors_version": "1.0", "total_samples": 2,
            "total_bytes": 1000,
            "shards": [{"shard_path": SHARD, "samples_count": 2, "bytes": 1000, "partition": 0,
                        "padded_samples": 0, "num_tensors": 4, "added_version": 1}],
            "schema": {"x": {"dtype": "F32", "shape": [3]}, "y": {"dtype": "I32", "shape": []}},
            "format": "safetensors-spark-dataset", "created_by": "test", "manifest_version": 1,
            "layout": "kv",
            "batch_size": null, "tail_strategy": null, "kv_separator": "__",
            "padded_samples": 0, "dropped_samples": 0
        })
        .to_string()
    }

    /// A header of `keys` (each with x: F32 [3] and y: I32 []) and the file length it implies.
    fn header(keys: &[&str]) -> (String, u64) {
        let mut h = serde_json::Map::new();
        let mut at = 0u64;
        for k in keys {
            h.insert(
                format!("{k}__x"),
                json!({"dtype": "F32", "shape": [3], "data_offsets": [at, at + 12]}),
            );
            h.insert(
                format!("{k}__y"),
                json!({"dtype": "I32", "shape": [], "data_offsets": [at + 12, at + 16]}),
            );
            at += 16;
        }
        let text = serde_json::Value::Object(h).to_string();
        let len = 8 + text.len() as u64 + at;
        (text, len)
    }

    fn request(keys: &[&str], headers: &[(&str, (String, u64))], extra: &str) -> String {
        let hs: serde_json::Map<String, serde_json::Value> = headers
            .iter()
            .map(|(n, (t, l))| (n.to_string(), json!({"header": t, "length": l})))
            .collect();
        let mut r = json!({"write_id": "00000000-0000-0000-0000-000000000001", "keys": keys, "headers": hs});
        if !extra.is_empty() {
            r[extra] = json!(true);
        }
        r.to_string()
    }

    #[test]
    fn a_header_holds_a_key_by_its_tensor_names_not_its_metadata() {
        let (text, len) = header(&["a", "b"]);
        assert!(header_holds_any(&text, len, r#"["zz__x","b__y"]"#).unwrap());
        assert!(!header_holds_any(&text, len, r#"["zz__x","a"]"#).unwrap());
        // __metadata__ is no tensor name
        let with_meta = text.replacen('{', r#"{"__metadata__":{"k":"v"},"#, 1);
        let meta_len = len + (with_meta.len() - text.len()) as u64;
        assert!(!header_holds_any(&with_meta, meta_len, r#"["__metadata__"]"#).unwrap());
        // a header that does not parse is kept, for the plan to refuse by name
        assert!(header_holds_any("{not json", 100, r#"["a__x"]"#).unwrap());
        assert!(header_holds_any(&text, len, "[1]").is_err());
    }

    #[test]
    fn delete_by_keys_plans_from_the_candidate_headers_and_refuses_bad_requests() {
        let m = kv_manifest();
        let names: Vec<String> =
            serde_json::from_str(&delete_key_tensors_json(&m, r#"["b","a"]"#).unwrap()).unwrap();
        assert_eq!(names, ["a__x", "a__y", "b__x", "b__y"]);
        let e = delete_key_tensors_json(&m, "[]").unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");

        let plan: serde_json::Value = serde_json::from_str(
            &plan_delete_json(
                &m,
                &request(&["a", "zz"], &[(SHARD, header(&["a", "b"]))], ""),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(plan["replaced"], json!([SHARD]));
        assert_eq!(plan["rows_removed"], json!(1));
        assert_eq!(plan["deleted_keys"], json!(["a"]));
        assert_eq!(plan["outputs"].as_array().unwrap().len(), 1);
        // no candidate: nothing to do
        let plan: serde_json::Value =
            serde_json::from_str(&plan_delete_json(&m, &request(&["a"], &[], "")).unwrap())
                .unwrap();
        assert_eq!(plan["replaced"], json!([]));

        let refused = |req: String, want: &str| {
            let e = plan_delete_json(&m, &req).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        };
        refused(request(&[], &[], ""), "empty");
        refused(request(&["a"], &[], "all"), "not both");
        refused(
            request(
                &["a"],
                &[("part-00009-0000-x.safetensors", header(&["a"]))],
                "",
            ),
            "not listed",
        );
        let (text, len) = header(&["a"]);
        refused(request(&["a"], &[(SHARD, (text, len + 1))], ""), SHARD);
        refused(
            json!({"write_id": "w", "all": true, "headers": {SHARD: {"header": "{}", "length": 8}}})
                .to_string(),
            "with keys only",
        );
    }
}
