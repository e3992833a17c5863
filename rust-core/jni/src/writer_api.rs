//! Exports of `io.safetensors.spark.jni.NativeWriter` (the Spark write path). spec/jni.md
//! documents every native: arguments, ownership of each address, threading and errors.
//!
//! This module is glue only: it decodes strings/JSON, calls the write engine and encodes the
//! results as JSON. Plan errors become `IllegalArgumentException` ([`JniError::InvalidArgument`]),
//! data/format/IO errors `SafetensorsException` ([`JniError::Failed`]).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use ::jni::objects::{JClass, JObjectArray, JString};
use ::jni::refs::Reference;
use ::jni::sys::{jboolean, jint, jlong};
use ::jni::{Env, EnvUnowned};
use serde_json::json;

use super::{
    arg, failed, guard, handle_mut, into_handle, parse_json, take_handle, to_json, JniError,
};
use safetensors_spark_engine::write::{ShardReport, TaskReport, WriteMode, WritePlan};

use safetensors_spark_dataset::log::{log_entry_text, parse_log_file, LogFile};
use safetensors_spark_dataset::manifest::{
    next_manifest, next_stream_manifest, parse_manifest, stamp_commit, stream_batch_committed,
    superseded_shards, CommitInfo, ShardReplacement, StreamBatch,
};
use safetensors_spark_dataset::names::{MANIFEST_FILE_NAME, MANIFEST_LOG_DIR};
use safetensors_spark_dataset::vacuum::{
    deletes_at_commit, parse_retention, plan_vacuum, vacuum_manifest, LogEntry, VacuumRequest,
    RETENTION_EXPECTED,
};
use safetensors_spark_dataset::Manifest;
use safetensors_spark_engine::write::commit::{
    commit_manifest, merge_key_runs, rewrite_shard_without_keys, write_shard_index_part,
    KeyRunInput,
};
use safetensors_spark_engine::write::plan::{plan_append, plan_write};
use safetensors_spark_engine::write::task::{import_batch, TaskWriter};

/// The native state behind a `NativeWriter` handle. `None` once finished or aborted.
pub struct WriterHandle {
    writer: Option<TaskWriter>,
}

/// An optional Java string argument (null → `None`).
fn opt_arg(env: &Env<'_>, s: &JString<'_>) -> Result<Option<String>, JniError> {
    if s.is_null() {
        Ok(None)
    } else {
        Ok(Some(s.try_to_string(env)?))
    }
}

fn new_string<'local>(env: &mut Env<'local>, s: &str) -> Result<JString<'local>, JniError> {
    Ok(env.new_string(s)?)
}

// ---- pure bodies (unit-tested without a JVM) -------------------------------------------------

/// `planWrite`: options JSON is an object of string → string (Spark's parameters, `path`
/// included). With the text of the dataset's latest manifest and the file it was read from
/// (`dataset_manifest.json` or a `_manifest_log/` entry), the plan of an append on top of it: the
/// settings it records fill the options left out, and it must fit (spec/dataset.md §5.2). The
/// manifest is validated here as `checkManifest` does, a bad one an error naming that file, so
/// an append parses it once for both (tens of MB at 100,000 shards).
pub fn plan_write_on_json(
    schema_json: &str,
    options_json: &str,
    case_sensitive: bool,
    existing: Option<(&str, &str)>,
) -> Result<String, JniError> {
    let options: BTreeMap<String, String> = parse_json(options_json, "options")?;
    let plan = match existing {
        None => plan_write(schema_json, &options, case_sensitive)?,
        Some((m, source)) => {
            let existing = parse_manifest(m).map_err(|e| {
                JniError::from(e).context(format_args!("the dataset's current manifest {source}"))
            })?;
            plan_append(schema_json, &options, case_sensitive, &existing)?
        }
    };
    to_json(&plan)
}

fn parse_plan(plan_json: &str) -> Result<WritePlan, JniError> {
    parse_json(plan_json, "write plan")
}

pub fn open_writer(plan_json: &str, partition: jint, work_dir: &str) -> Result<jlong, JniError> {
    let plan = parse_plan(plan_json)?;
    let partition = u32::try_from(partition)
        .map_err(|_| JniError::invalid_argument(format!("partition {partition} < 0")))?;
    let writer = TaskWriter::open(plan, partition, PathBuf::from(work_dir))?;
    Ok(into_handle(WriterHandle {
        writer: Some(writer),
    }))
}

fn live(state: &mut WriterHandle) -> Result<&mut TaskWriter, JniError> {
    state
        .writer
        .as_mut()
        .ok_or_else(|| JniError::invalid_argument("writer already finished or aborted"))
}

/// # Safety
/// `handle` as for [`handle_mut`]; the addresses must be 0 or exported C Data structs.
pub unsafe fn write_batch_json(
    handle: jlong,
    array_addr: jlong,
    schema_addr: jlong,
) -> Result<String, JniError> {
    // SAFETY: per the contract of this function.
    let state = unsafe { handle_mut::<WriterHandle>(handle)? };
    let writer = live(state)?;
    if array_addr == 0 || schema_addr == 0 {
        return Err(JniError::invalid_argument("Arrow C Data address is 0"));
    }
    // SAFETY: the JVM passes the addresses of an ArrowArray/ArrowSchema it just exported; the
    // contents are moved into Rust (the structs are left released) and dropped below.
    let batch = unsafe { import_batch(array_addr as *mut _, schema_addr as *mut _) }?;
    let sealed = writer.write_batch(&batch).map_err(JniError::from);
    drop(batch); // the JVM may free its vectors as soon as we return
    to_json(&sealed_files(&sealed?))
}

/// What the JVM needs of a sealed shard to place it: its name and where the task wrote it.
/// (Full reports, with every tensor, reach the driver once, in the task report file.)
#[derive(serde::Serialize)]
struct SealedFile<'a> {
    file: &'a str,
    local_path: &'a str,
}

fn sealed_files(sealed: &[ShardReport]) -> Vec<SealedFile<'_>> {
    sealed
        .iter()
        .map(|s| SealedFile {
            file: &s.file,
            local_path: &s.local_path,
        })
        .collect()
}

/// # Safety
/// `handle` as for [`handle_mut`].
pub unsafe fn finish_json(handle: jlong) -> Result<String, JniError> {
    // SAFETY: per the contract of this function.
    let state = unsafe { handle_mut::<WriterHandle>(handle)? };
    let writer = state
        .writer
        .take()
        .ok_or_else(|| JniError::invalid_argument("writer already finished or aborted"))?;
    let done = writer.finish()?;
    // The report itself stays in its file (it can hold one entry per KV row); the JVM stages
    // the file like a shard and the driver reads it.
    #[derive(serde::Serialize)]
    struct Finished<'a> {
        sealed: Vec<SealedFile<'a>>,
        /// `{"shard", "file" (the part's name), "local_path"}` per index part.
        index_parts: Vec<serde_json::Value>,
        report_file: SealedFile<'a>,
    }
    let report_path = done.report_path.to_string_lossy();
    to_json(&Finished {
        sealed: sealed_files(&done.sealed),
        index_parts: done
            .index_parts
            .iter()
            .map(|(shard, file, p)| json!({"shard": shard, "file": file, "local_path": p.to_string_lossy()}))
            .collect(),
        report_file: SealedFile {
            file: &done.report_file,
            local_path: &report_path,
        },
    })
}

/// # Safety
/// `handle` as for [`handle_mut`].
pub unsafe fn abort_writer(handle: jlong) -> Result<(), JniError> {
    // SAFETY: per the contract of this function.
    let state = unsafe { handle_mut::<WriterHandle>(handle)? };
    if let Some(w) = state.writer.take() {
        w.abort();
    }
    Ok(())
}

/// # Safety
/// `handle` as for [`take_handle`]; it is dangling afterwards.
pub unsafe fn close_writer(handle: jlong) -> Result<(), JniError> {
    // SAFETY: per the contract of this function.
    let state = unsafe { take_handle::<WriterHandle>(handle)? };
    if let Some(w) = state.writer {
        w.abort(); // closed without finish: delete what it wrote
    }
    Ok(())
}

pub fn commit_job_json(plan_json: &str, reports_json: &str) -> Result<String, JniError> {
    let plan = parse_plan(plan_json)?;
    let reports: Vec<TaskReport> = parse_json(reports_json, "task reports")?;
    let commit = commit_manifest(&plan, &reports)?;
    // Each rewrite carries the shard's current report, so `rewriteShard` can report the new file
    // exactly (KV keys and columns included).
    let mut rewrites = Vec::with_capacity(commit.rewrites.len());
    for r in &commit.rewrites {
        let shard = reports
            .iter()
            .flat_map(|t| t.shards.iter())
            .find(|s| s.file == r.file)
            .ok_or_else(|| failed(format!("rewrite of unknown shard {}", r.file)))?;
        rewrites.push(json!({
            "file": r.file,
            "drop": r.drop_tensors,
            "samples_after": r.samples_after,
            "delete": r.delete,
            "shard": shard,
        }));
    }
    // Serialised from the struct, not through `json!`: a `serde_json::Value` map would sort the
    // manifest's `tensors` by name, losing the written column order (dataset.md §5).
    #[derive(serde::Serialize)]
    struct Committed<'a> {
        manifest: &'a safetensors_spark_dataset::Manifest,
        rewrites: Vec<serde_json::Value>,
    }
    to_json(&Committed {
        manifest: &commit.manifest,
        rewrites,
    })
}

/// `nextManifest`: this write's manifest (from `commitJob`) on top of `base`, the directory's
/// latest committed manifest (null: none): the [`CommitAnswer`] of the attempt.
pub fn next_manifest_json(
    base_json: Option<&str>,
    write_manifest_json: &str,
    append: bool,
    replacements_json: Option<&str>,
    commit_info_json: Option<&str>,
) -> Result<CommitAnswer, JniError> {
    let replacements: Vec<ShardReplacement> = match replacements_json {
        Some(j) => parse_json(j, "shard replacements")?,
        None => Vec::new(),
    };
    let base = base_json.map(parse_manifest).transpose().map_err(|e| {
        JniError::from(e).context(format_args!("the dataset's current manifest ({MANIFEST_FILE_NAME} or its newest {MANIFEST_LOG_DIR}/ entry)"))
    })?;
    let new = parse_manifest(write_manifest_json)
        .map_err(|e| JniError::from(e).context("this write's manifest"))?;
    let mut next = next_manifest(base.as_ref(), &new, append, &replacements)?;
    stamp(&mut next, commit_info_json)?;
    commit_answer(base.as_ref(), &next)
}

/// What a commit attempt needs from `next` (built on `base`, stamped), as three texts returned to
/// the JVM apart (a `String[3]`), so that neither whole text passes through a JSON parser there:
/// at 100,000 shards the manifest is 27 MB, and escaping it into an answer and parsing it back
/// out cost a fifth of an append (spec/performance.md §14.1).
#[derive(Debug, Default)]
pub struct CommitAnswer {
    /// `{"version", "superseded", "retain"}`. `superseded`: the shards `base` lists and `next`
    /// does not. `retain`: by spec/dataset.md §5.8.1 they (and their index parts) stay until a
    /// vacuum and the writer prunes no log entry (retention not 0, `deletes_at_commit`); false:
    /// the writer deletes them and prunes old log entries itself.
    pub answer: String,
    /// `next` as `dataset_manifest.json` (and a checkpoint when one is due) hold it.
    pub manifest: String,
    /// The version's `_manifest_log/` entry: what it changes on `base` (spec/dataset.md §5.10),
    /// from the manifests parsed here (the JVM no longer asks for it with both texts again).
    pub entry: String,
}

fn commit_answer(base: Option<&Manifest>, next: &Manifest) -> Result<CommitAnswer, JniError> {
    let superseded: Vec<&str> = base.map(|b| superseded_shards(b, next)).unwrap_or_default();
    Ok(CommitAnswer {
        answer: to_json(&json!({
            "version": next.manifest_version(),
            "superseded": superseded,
            "retain": !deletes_at_commit(base, next),
        }))?,
        manifest: next.to_json_pretty().map_err(failed)?,
        entry: log_entry_text(base, next)?,
    })
}

/// A [`CommitAnswer`] as the `String[3]` `{answer, manifest, entry}` the JVM receives.
fn commit_answer_array<'local>(
    env: &mut Env<'local>,
    a: &CommitAnswer,
) -> Result<JObjectArray<'local, JString<'local>>, JniError> {
    crate::string_array(env, &[&a.answer, &a.manifest, &a.entry])
}

/// Records the commit's time and writer (`commitInfoJson`: a [`CommitInfo`]) in `next`.
pub(crate) fn stamp(
    next: &mut safetensors_spark_dataset::Manifest,
    commit_info_json: Option<&str>,
) -> Result<(), JniError> {
    if let Some(j) = commit_info_json {
        let info: CommitInfo = parse_json(j, "commit info")?;
        stamp_commit(next, &info)?;
    }
    Ok(())
}

/// A micro-batch of a streaming query from its JNI arguments (a negative id is refused).
pub(crate) fn stream_batch(query_id: String, batch_id: jlong) -> Result<StreamBatch, JniError> {
    let batch_id = u64::try_from(batch_id).map_err(|_| {
        JniError::invalid_argument(format!(
            "streaming batch id must be ≥ 0, got {batch_id} (query {query_id})"
        ))
    })?;
    Ok(StreamBatch { query_id, batch_id })
}

/// `streamBatchCommitted`: whether the directory's latest committed manifest (null: none)
/// records `batch` as committed (spec/dataset.md §5.7).
pub fn stream_batch_committed_json(
    base_json: Option<&str>,
    batch: &StreamBatch,
) -> Result<bool, JniError> {
    let base = base_json.map(parse_manifest).transpose().map_err(|e| {
        JniError::from(e).context(format_args!("the dataset's current manifest ({MANIFEST_FILE_NAME} or its newest {MANIFEST_LOG_DIR}/ entry)"))
    })?;
    Ok(stream_batch_committed(base.as_ref(), batch))
}

/// `nextStreamManifest`: [`next_manifest_json`] for a streaming micro-batch: an append that
/// also records the batch as its query's last committed one, in the same version.
pub fn next_stream_manifest_json(
    base_json: Option<&str>,
    write_manifest_json: &str,
    replacements_json: Option<&str>,
    batch: &StreamBatch,
    commit_info_json: Option<&str>,
) -> Result<CommitAnswer, JniError> {
    let replacements: Vec<ShardReplacement> = match replacements_json {
        Some(j) => parse_json(j, "shard replacements")?,
        None => Vec::new(),
    };
    let base = base_json.map(parse_manifest).transpose().map_err(|e| {
        JniError::from(e).context(format_args!("the dataset's current manifest ({MANIFEST_FILE_NAME} or its newest {MANIFEST_LOG_DIR}/ entry)"))
    })?;
    let new = parse_manifest(write_manifest_json)
        .map_err(|e| JniError::from(e).context("this write's manifest"))?;
    let mut next = next_stream_manifest(base.as_ref(), &new, &replacements, batch)?;
    stamp(&mut next, commit_info_json)?;
    commit_answer(base.as_ref(), &next)
}

/// `checkManifest`: parses and validates a dataset's current manifest (every shard name passes
/// the trust rule) before a write that would act on it changes anything. `source` is the file
/// the text was read from (`dataset_manifest.json`, or the `_manifest_log/` entry of a newer
/// version): the error names it.
pub fn check_manifest_json(manifest_json: &str, source: &str) -> Result<(), JniError> {
    parse_manifest(manifest_json).map(|_| ()).map_err(|e| {
        JniError::from(e).context(format_args!("the dataset's current manifest {source}"))
    })
}

/// One run of `mergeKeys`: a shard and its index part (a local file).
#[derive(serde::Deserialize)]
struct RunRequest {
    file: String,
    part: String,
    #[serde(default)]
    existing: bool,
    #[serde(default)]
    partition: u32,
    #[serde(default)]
    shard: u32,
}

/// `mergeKeys`: KV keys across the shards of `runs_json` (`[{"file", "part", "existing",
/// "partition", "shard"}]`), merged from their sorted index parts (spec/dataset.md §3, §6.1).
/// With `fail` a key twice is a `SafetensorsException` naming it and both shards (as is a tensor
/// name collision, whatever the strategy). With `lastWin` returns the shards that lose keys,
/// `[{"file", "keys", "count"}]`, each loser's keys written as a JSON array to the file `keys`
/// in `work_dir` (they are never in JVM memory).
pub fn merge_keys_json(
    plan_json: &str,
    runs_json: &str,
    work_dir: &str,
) -> Result<String, JniError> {
    let plan = parse_plan(plan_json)?;
    let WriteMode::Kv { duplicates, .. } = &plan.mode else {
        return to_json(&Vec::<()>::new());
    };
    let runs: Vec<RunRequest> = parse_json(runs_json, "key runs")?;
    let inputs: Vec<KeyRunInput> = runs
        .into_iter()
        .map(|r| KeyRunInput {
            file: r.file,
            part: PathBuf::from(r.part),
            existing: r.existing,
            rank: (u64::from(r.partition) << 32) | u64::from(r.shard),
        })
        .collect();
    let losers = merge_key_runs(&inputs, *duplicates)?;
    let mut out = Vec::with_capacity(losers.len());
    for (i, (file, keys)) in losers.into_iter().enumerate() {
        let path = Path::new(work_dir).join(format!("lost-keys-{i}.json"));
        let text = serde_json::to_vec(&keys).map_err(failed)?;
        std::fs::write(&path, text).map_err(|e| failed(format!("{}: {e}", path.display())))?;
        out.push(json!({"file": file, "keys": path.to_string_lossy(), "count": keys.len()}));
    }
    to_json(&out)
}

/// `rewriteShardKeys`: [`rewrite_shard_without_keys`] with the keys of a `mergeKeys` answer
/// (`keys_path`); the new index part goes to `part_path` (null: none). Returns
/// `{"delete", "bytes", "samples", "num_tensors"}`.
pub fn rewrite_shard_keys_json(
    plan_json: &str,
    input: &str,
    output: &str,
    output_file: &str,
    part: Option<&str>,
    keys_path: &str,
) -> Result<String, JniError> {
    let plan = parse_plan(plan_json)?;
    let text = std::fs::read(keys_path).map_err(|e| failed(format!("{keys_path}: {e}")))?;
    let keys: HashSet<String> =
        serde_json::from_slice(&text).map_err(|e| failed(format!("{keys_path}: {e}")))?;
    let done = rewrite_shard_without_keys(
        &plan,
        Path::new(input),
        Path::new(output),
        output_file,
        part.map(Path::new),
        &keys,
    )?;
    to_json(&done)
}

/// `indexPartFromHeader`: writes the index part of the dataset's shard `file` (its header text
/// and file length) at `part_path`. Returns the row count.
pub fn index_part_from_header_json(
    plan_json: &str,
    file: &str,
    header_json: &str,
    file_len: u64,
    part: &str,
) -> Result<u64, JniError> {
    let plan = parse_plan(plan_json)?;
    let header = safetensors_spark_format::header::parse_header(header_json.as_bytes(), file_len)
        .map_err(|e| JniError::from(e).context(file))?;
    Ok(write_shard_index_part(
        &plan,
        file,
        &header,
        Path::new(part),
    )?)
}

// ---- exports ---------------------------------------------------------------------------------

/// `static native String mergeKeys(String planJson, String runsJson, String workDir)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeWriter_mergeKeys<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    plan: JString<'local>,
    runs: JString<'local>,
    work_dir: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let plan = arg(env, &plan, "planJson")?;
        let runs = arg(env, &runs, "runsJson")?;
        let work_dir = arg(env, &work_dir, "workDir")?;
        let json = merge_keys_json(&plan, &runs, &work_dir)?;
        new_string(env, &json)
    })
}

/// `static native String rewriteShardKeys(String planJson, String inputPath, String outputPath,
/// String outputFileName, String partPathOrNull, String keysPath)`
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeWriter_rewriteShardKeys<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    plan: JString<'local>,
    input: JString<'local>,
    output: JString<'local>,
    output_file: JString<'local>,
    part: JString<'local>,
    keys: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let plan = arg(env, &plan, "planJson")?;
        let input = arg(env, &input, "inputPath")?;
        let output = arg(env, &output, "outputPath")?;
        let output_file = arg(env, &output_file, "outputFileName")?;
        let part = opt_arg(env, &part)?;
        let keys = arg(env, &keys, "keysPath")?;
        let json =
            rewrite_shard_keys_json(&plan, &input, &output, &output_file, part.as_deref(), &keys)?;
        new_string(env, &json)
    })
}

/// `static native long indexPartFromHeader(String planJson, String fileName, String headerJson,
/// long fileLength, String partPath)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeWriter_indexPartFromHeader<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    plan: JString<'local>,
    file: JString<'local>,
    header_json: JString<'local>,
    file_len: jlong,
    part: JString<'local>,
) -> jlong {
    guard(&mut env, |env| {
        let plan = arg(env, &plan, "planJson")?;
        let file = arg(env, &file, "fileName")?;
        let header_json = arg(env, &header_json, "headerJson")?;
        let part = arg(env, &part, "partPath")?;
        let file_len = u64::try_from(file_len)
            .map_err(|_| JniError::invalid_argument(format!("{file}: negative file length")))?;
        let n = index_part_from_header_json(&plan, &file, &header_json, file_len, &part)?;
        Ok(n as jlong)
    })
}

/// `static native String planWrite(String sparkSchemaJson, String optionsJson, boolean caseSensitive, String existingManifestJsonOrNull, String existingSourceOrNull)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeWriter_planWrite<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    schema: JString<'local>,
    options: JString<'local>,
    case_sensitive: jboolean,
    existing_manifest: JString<'local>,
    existing_source: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let schema = arg(env, &schema, "sparkSchemaJson")?;
        let options = arg(env, &options, "optionsJson")?;
        let existing = opt_arg(env, &existing_manifest)?;
        let source = opt_arg(env, &existing_source)?;
        let source = source.as_deref().unwrap_or(MANIFEST_FILE_NAME);
        let existing = existing.as_deref().map(|m| (m, source));
        let plan = plan_write_on_json(&schema, &options, case_sensitive, existing)?;
        new_string(env, &plan)
    })
}

/// `static native long open(String planJson, int partition, String workDir)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeWriter_open<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    plan: JString<'local>,
    partition: jint,
    work_dir: JString<'local>,
) -> jlong {
    guard(&mut env, |env| {
        let plan = arg(env, &plan, "planJson")?;
        let work_dir = arg(env, &work_dir, "workDir")?;
        open_writer(&plan, partition, &work_dir)
    })
}

/// `static native String writeBatch(long handle, long arrowArrayAddr, long arrowSchemaAddr)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeWriter_writeBatch<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
    array_addr: jlong,
    schema_addr: jlong,
) -> JString<'local> {
    guard(&mut env, |env| {
        // SAFETY: the Java owner serialises calls on a handle and passes live C Data structs.
        let json = unsafe { write_batch_json(handle, array_addr, schema_addr)? };
        new_string(env, &json)
    })
}

/// `static native String finish(long handle)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeWriter_finish<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
) -> JString<'local> {
    guard(&mut env, |env| {
        // SAFETY: the Java owner serialises calls on a handle.
        let json = unsafe { finish_json(handle)? };
        new_string(env, &json)
    })
}

/// `static native void abort(long handle)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeWriter_abort<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
) {
    // SAFETY: the Java owner serialises calls on a handle.
    guard(&mut env, |_env| unsafe { abort_writer(handle) })
}

/// `static native void close(long handle)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeWriter_close<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    handle: jlong,
) {
    // SAFETY: the Java owner calls close at most once per handle (then forgets it).
    guard(&mut env, |_env| unsafe { close_writer(handle) })
}

/// `static native String commitJob(String planJson, String taskReportsJsonArray, String existingManifestJsonOrNull)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeWriter_commitJob<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    plan: JString<'local>,
    reports: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let plan = arg(env, &plan, "planJson")?;
        let reports = arg(env, &reports, "taskReportsJsonArray")?;
        let json = commit_job_json(&plan, &reports)?;
        new_string(env, &json)
    })
}

/// `static native void checkManifest(String manifestJson, String source)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeWriter_checkManifest<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    manifest: JString<'local>,
    source: JString<'local>,
) {
    guard(&mut env, |env| {
        let manifest = arg(env, &manifest, "manifestJson")?;
        let source = arg(env, &source, "source")?;
        check_manifest_json(&manifest, &source)
    })
}

/// `static native String writeOptionNames()`: the writer's user options, a JSON array of names
/// as the docs spell them (catalog tables sort their options into read and write ones with it).
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeWriter_writeOptionNames<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let json = to_json(&safetensors_spark_engine::write::plan::WRITE_OPTIONS)?;
        new_string(env, &json)
    })
}

/// `static native String[] nextManifest(String baseManifestJsonOrNull, String writeManifestJson, boolean append, String replacementsJsonOrNull, String commitInfoJsonOrNull)`: `{answer, manifest, entry}` ([`CommitAnswer`])
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeWriter_nextManifest<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    base: JString<'local>,
    write_manifest: JString<'local>,
    append: jboolean,
    replacements: JString<'local>,
    commit_info: JString<'local>,
) -> JObjectArray<'local, JString<'local>> {
    guard(&mut env, |env| {
        let base = opt_arg(env, &base)?;
        let write_manifest = arg(env, &write_manifest, "writeManifestJson")?;
        let replacements = opt_arg(env, &replacements)?;
        let commit_info = opt_arg(env, &commit_info)?;
        let answer = next_manifest_json(
            base.as_deref(),
            &write_manifest,
            append,
            replacements.as_deref(),
            commit_info.as_deref(),
        )?;
        commit_answer_array(env, &answer)
    })
}

/// `static native boolean streamBatchCommitted(String baseManifestJsonOrNull, String queryId, long batchId)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeWriter_streamBatchCommitted<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    base: JString<'local>,
    query_id: JString<'local>,
    batch_id: jlong,
) -> jboolean {
    guard(&mut env, |env| {
        let base = opt_arg(env, &base)?;
        let batch = stream_batch(arg(env, &query_id, "queryId")?, batch_id)?;
        stream_batch_committed_json(base.as_deref(), &batch)
    })
}

/// `static native String[] nextStreamManifest(String baseManifestJsonOrNull, String writeManifestJson, String replacementsJsonOrNull, String queryId, long batchId, String commitInfoJsonOrNull)`: as `nextManifest`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeWriter_nextStreamManifest<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    base: JString<'local>,
    write_manifest: JString<'local>,
    replacements: JString<'local>,
    query_id: JString<'local>,
    batch_id: jlong,
    commit_info: JString<'local>,
) -> JObjectArray<'local, JString<'local>> {
    guard(&mut env, |env| {
        let base = opt_arg(env, &base)?;
        let write_manifest = arg(env, &write_manifest, "writeManifestJson")?;
        let replacements = opt_arg(env, &replacements)?;
        let batch = stream_batch(arg(env, &query_id, "queryId")?, batch_id)?;
        let commit_info = opt_arg(env, &commit_info)?;
        let answer = next_stream_manifest_json(
            base.as_deref(),
            &write_manifest,
            replacements.as_deref(),
            &batch,
            commit_info.as_deref(),
        )?;
        commit_answer_array(env, &answer)
    })
}

/// `static native String kvKeyColumn(String stringColumnsJson, String tensorColumnsJson)`: the key
/// column of a KV table that names none, by the one rule (`kv::find_key_column`, spec/dataset.md
/// §5.2); none or several candidates throw SafetensorsOptionsException saying which.
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeWriter_kvKeyColumn<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    string_columns: JString<'local>,
    tensor_columns: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let strings: Vec<String> = parse_json(
            &arg(env, &string_columns, "stringColumnsJson")?,
            "stringColumnsJson",
        )?;
        let tensors: Vec<String> = parse_json(
            &arg(env, &tensor_columns, "tensorColumnsJson")?,
            "tensorColumnsJson",
        )?;
        let strings: Vec<&str> = strings.iter().map(String::as_str).collect();
        let tensors: Vec<&str> = tensors.iter().map(String::as_str).collect();
        let key = safetensors_spark_dataset::kv::find_key_column(&strings, &tensors, "the table")
            .map_err(JniError::Options)?;
        Ok(env.new_string(key)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `planWrite` with an existing manifest read from `dataset_manifest.json`.
    fn plan_write_json(
        schema_json: &str,
        options_json: &str,
        case_sensitive: bool,
        existing: Option<&str>,
    ) -> Result<String, JniError> {
        let existing = existing.map(|m| (m, MANIFEST_FILE_NAME));
        plan_write_on_json(schema_json, options_json, case_sensitive, existing)
    }
    use serde_json::Value;

    const SCHEMA: &str = r#"{"type":"struct","fields":[{"name":"x","type":{"type":"array","elementType":"float","containsNull":true},"nullable":true,"metadata":{}}]}"#;

    #[test]
    fn plan_errors_are_options_errors_and_plans_round_trip() {
        // an option the plan refuses is the user's (SafetensorsOptionsException); options that
        // are not JSON at all are the JVM side's (IllegalArgumentException)
        let e = plan_write_json(SCHEMA, r#"{"path":"/tmp/x","bogus":"1"}"#, false, None);
        assert!(
            matches!(&e, Err(JniError::Options(m)) if m.contains("bogus")),
            "{e:?}"
        );
        let e = plan_write_json(SCHEMA, "not json", false, None);
        assert!(matches!(e, Err(JniError::InvalidArgument(_))));
        let plan = plan_write_json(SCHEMA, r#"{"path":"/tmp/x","batch_size":"2"}"#, false, None);
        let plan = plan
            .ok()
            .and_then(|p| serde_json::from_str::<WritePlan>(&p).ok());
        assert_eq!(plan.map(|p| p.columns.len()), Some(1));
    }

    #[test]
    fn zero_handles_and_addresses_are_rejected() {
        // SAFETY: 0 is always rejected before any dereference.
        unsafe {
            assert!(matches!(finish_json(0), Err(JniError::InvalidArgument(_))));
            assert!(matches!(abort_writer(0), Err(JniError::InvalidArgument(_))));
            assert!(matches!(close_writer(0), Err(JniError::InvalidArgument(_))));
            assert!(matches!(
                write_batch_json(0, 1, 1),
                Err(JniError::InvalidArgument(_))
            ));
        }
    }

    #[test]
    fn open_finish_close_an_empty_task() {
        let dir = std::env::temp_dir().join(format!("jvmw-glue-{}", std::process::id()));
        let plan = plan_write_json(SCHEMA, r#"{"batch_size":"2"}"#, false, None);
        let Ok(plan) = plan else {
            unreachable!("plan failed: {plan:?}")
        };
        let h = open_writer(&plan, 3, &dir.to_string_lossy());
        let Ok(h) = h else {
            unreachable!("open failed")
        };
        // SAFETY: h is a fresh handle, used sequentially and closed once.
        unsafe {
            let done = finish_json(h);
            let v: Value = done
                .ok()
                .and_then(|s| serde_json::from_str(&s).ok())
                .unwrap_or(Value::Null);
            assert_eq!(v["sealed"], json!([]));
            let report_path = v["report_file"]["local_path"].as_str().unwrap_or("");
            assert!(v["report_file"]["file"]
                .as_str()
                .is_some_and(|f| report_path.ends_with(f) && f.ends_with(".report.json")));
            let report: Value = std::fs::read_to_string(report_path)
                .ok()
                .and_then(|s| serde_json::from_str(&s).ok())
                .unwrap_or(Value::Null);
            assert_eq!(report["partition"], json!(3));
            assert_eq!(report["dropped_samples"], json!(0));
            assert!(matches!(finish_json(h), Err(JniError::InvalidArgument(_))));
            assert!(abort_writer(h).is_ok());
            assert!(close_writer(h).is_ok());
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn commit_of_no_reports_is_an_empty_manifest() {
        let plan =
            plan_write_json(SCHEMA, r#"{"batch_size":"2"}"#, false, None).unwrap_or_default();
        let out = commit_job_json(&plan, "[]").unwrap_or_default();
        let v: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        assert_eq!(v["manifest"]["shards"], json!([]));
        assert_eq!(v["manifest"]["total_samples"], json!(0));
        assert_eq!(v["rewrites"], json!([]));
    }

    #[test]
    fn the_commit_answer_says_whether_superseded_shards_are_retained() {
        let manifest_of = |opts: &str| {
            let plan = plan_write_json(SCHEMA, opts, false, None).unwrap_or_default();
            let out = commit_job_json(&plan, "[]").unwrap_or_default();
            let v: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
            v["manifest"].to_string()
        };
        let answer = |base: Option<&str>, new: &str| {
            let out = next_manifest_json(base, new, false, None, None).unwrap_or_default();
            let mut v = serde_json::from_str::<Value>(&out.answer).unwrap_or(Value::Null);
            v["manifest"] = Value::String(out.manifest);
            v["entry"] = Value::String(out.entry);
            v
        };
        let default = manifest_of(r#"{"batch_size":"2"}"#);
        let zero = manifest_of(r#"{"batch_size":"2","retention":"0"}"#);
        assert_eq!(answer(Some(&default), &default)["retain"], json!(true));
        assert_eq!(answer(Some(&default), &zero)["retain"], json!(false));
        // a retention of 0 carries forward to a write that does not set one
        let committed_zero = answer(None, &zero)["manifest"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert_eq!(
            answer(Some(&committed_zero), &default)["retain"],
            json!(false)
        );
        // a base with only the published fields (another tool's): its shards go at the commit
        let published = json!({"format_version": "1.0", "safetensors_version": "1.0",
            "total_samples": 0, "total_bytes": 0, "shards": [], "schema": {}})
        .to_string();
        assert_eq!(answer(Some(&published), &default)["retain"], json!(false));
    }

    #[test]
    fn the_commit_answer_carries_the_entry_of_what_the_version_changes() {
        let plan =
            plan_write_json(SCHEMA, r#"{"batch_size":"2"}"#, false, None).unwrap_or_default();
        let out = commit_job_json(&plan, "[]").unwrap_or_default();
        let v: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        let mine = v["manifest"].to_string();
        let first = next_manifest_json(None, &mine, false, None, None).unwrap_or_default();
        let second =
            next_manifest_json(Some(&first.manifest), &mine, true, None, None).unwrap_or_default();
        for (base, a) in [(None, &first), (Some(first.manifest.as_str()), &second)] {
            // the entry is the one the log's rule makes of the two manifests, and the manifest
            // text is the version's whole manifest, not escaped into the answer
            let expected = crate::log_api::log_entry_json(base, &a.manifest).unwrap_or_default();
            assert!(!a.entry.is_empty());
            assert_eq!(a.entry, expected);
            let m: Value = serde_json::from_str(&a.manifest).unwrap_or(Value::Null);
            let e: Value = serde_json::from_str(&a.entry).unwrap_or(Value::Null);
            assert_eq!(e["manifest_version"], m["manifest_version"]);
            let answer: Value = serde_json::from_str(&a.answer).unwrap_or(Value::Null);
            assert_eq!(answer["version"], m["manifest_version"]);
            assert!(answer.get("manifest").is_none());
        }
        assert_eq!(
            serde_json::from_str::<Value>(&second.entry).unwrap_or(Value::Null)["manifest_version"],
            json!(2)
        );
    }

    #[test]
    fn an_append_is_planned_on_top_of_the_manifest() {
        let plan =
            plan_write_json(SCHEMA, r#"{"batch_size":"3"}"#, false, None).unwrap_or_default();
        let out = commit_job_json(&plan, "[]").unwrap_or_default();
        let v: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        let manifest = v["manifest"].to_string();
        // no options: the manifest's batch_size
        let append = plan_write_json(SCHEMA, "{}", false, Some(&manifest)).unwrap_or_default();
        let p: Value = serde_json::from_str(&append).unwrap_or(Value::Null);
        assert_eq!(p["layout"]["batch_size"], json!(3));
        let e = plan_write_json(SCHEMA, r#"{"batch_size":"4"}"#, false, Some(&manifest));
        assert!(
            matches!(&e, Err(JniError::Options(m)) if m.contains("option batch_size is 4, the dataset has 3")),
            "{e:?}"
        );
        let e = plan_write_json(SCHEMA, "{}", false, Some("{}"));
        assert!(
            matches!(&e, Err(e) if e.to_string().contains("the dataset's current manifest dataset_manifest.json")),
            "{e:?}"
        );
    }
}

/// One `_manifest_log/` entry as the JVM read it.
#[derive(serde::Deserialize)]
struct LogEntryRequest {
    version: u64,
    /// The entry's path, for errors.
    source: String,
    text: String,
    mtime_ms: u64,
}

/// `planVacuum`'s request: the log, the latest manifest, the directory's files.
#[derive(serde::Deserialize)]
struct VacuumPlanRequest {
    log: Vec<LogEntryRequest>,
    /// The checkpoint the replay starts from (the newest at or below the first entry).
    #[serde(default)]
    checkpoint: Option<LogEntryRequest>,
    /// Every checkpoint's version.
    #[serde(default)]
    checkpoint_versions: Vec<u64>,
    latest: String,
    latest_source: String,
    shards: BTreeMap<String, u64>,
    index_parts: BTreeMap<String, u64>,
    retention: Option<String>,
    allow_shorter_retention: bool,
    now_ms: u64,
}

/// `planVacuum`: the vacuum plan (spec/dataset.md §5.8.1) of what the JVM listed.
pub fn plan_vacuum_json(request_json: &str) -> Result<String, JniError> {
    let r: VacuumPlanRequest = parse_json(request_json, "vacuum request")?;
    let retention_seconds = match r.retention.as_deref() {
        None => None,
        Some(v) => Some(parse_retention(v).ok_or_else(|| {
            JniError::invalid_argument(format!(
                "vacuum option retention = '{v}': expected {RETENTION_EXPECTED}"
            ))
        })?),
    };
    let parse = |e: &LogEntryRequest, file: LogFile| {
        parse_log_file(file, &e.text)
            .map(|rec| LogEntry::from_record(rec, e.mtime_ms))
            .map_err(|err| {
                JniError::from(err).context(format_args!("manifest log file {}", e.source))
            })
    };
    let mut log = Vec::with_capacity(r.log.len());
    for e in &r.log {
        log.push(parse(e, LogFile::Entry(e.version))?);
    }
    let start = match &r.checkpoint {
        Some(c) => vec![parse(c, LogFile::Checkpoint(c.version))?],
        None => Vec::new(),
    };
    let latest = parse_manifest(&r.latest).map_err(|err| {
        JniError::from(err).context(format_args!(
            "the dataset's current manifest {}",
            r.latest_source
        ))
    })?;
    let plan = plan_vacuum(
        &log,
        &start,
        &r.checkpoint_versions,
        &latest,
        &r.shards,
        &r.index_parts,
        &VacuumRequest {
            retention_seconds,
            allow_shorter_retention: r.allow_shorter_retention,
            now_ms: r.now_ms,
        },
    )?;
    let vacuumed = plan.vacuumed();
    let checkpoint = plan
        .checkpoint
        .as_ref()
        .map(|m| m.to_json_pretty().map(|t| (m.manifest_version(), t)))
        .transpose()?;
    to_json(&json!({
        "plan": plan,
        "files": vacuumed.files,
        "bytes": vacuumed.bytes,
        "checkpoint": checkpoint.as_ref().map(|(v, t)| json!({"name": LogFile::Checkpoint(*v).name(), "text": t})),
    }))
}

/// `vacuumManifest`: the vacuum version on top of `base` (`{"manifest", "version"}`).
pub fn vacuum_manifest_json(
    base: &str,
    files: u64,
    bytes: u64,
    app_id: Option<String>,
) -> Result<String, JniError> {
    let base = parse_manifest(base).map_err(|e| {
        JniError::from(e).context(format_args!("the dataset's current manifest ({MANIFEST_FILE_NAME} or its newest {MANIFEST_LOG_DIR}/ entry)"))
    })?;
    let next = vacuum_manifest(
        &base,
        safetensors_spark_dataset::manifest::Vacuumed { files, bytes },
        safetensors_spark_dataset::local::now_ms(),
        app_id,
    )?;
    to_json(&json!({
        "manifest": next.to_json_pretty().map_err(failed)?,
        "version": next.manifest_version(),
    }))
}

/// `static native String planVacuum(String requestJson)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeWriter_planVacuum<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    request: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let request = arg(env, &request, "requestJson")?;
        let json = plan_vacuum_json(&request)?;
        new_string(env, &json)
    })
}

/// `static native String vacuumManifest(String baseManifestJson, long files, long bytes, String appIdOrNull)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeWriter_vacuumManifest<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    base: JString<'local>,
    files: jlong,
    bytes: jlong,
    app_id: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let base = arg(env, &base, "baseManifestJson")?;
        let app_id = opt_arg(env, &app_id)?;
        let json = vacuum_manifest_json(
            &base,
            u64::try_from(files).unwrap_or(0),
            u64::try_from(bytes).unwrap_or(0),
            app_id,
        )?;
        new_string(env, &json)
    })
}
