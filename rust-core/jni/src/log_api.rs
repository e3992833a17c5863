//! `NativeLog`: the manifest log's rules for the Spark side (spec/dataset.md §5.10), which lists
//! and reads `_manifest_log/` through Hadoop: the entry a commit writes, what rebuilding a version
//! reads next, and the chores after a commit. The rules are [`safetensors_spark_dataset::log`].

use crate::versions_api::opt;
use crate::{arg, guard, parse_json, to_json, JniError};
use ::jni::objects::{JClass, JObjectArray, JString};
use ::jni::sys::{jboolean, jlong};
use ::jni::EnvUnowned;
use safetensors_spark_dataset::commit::{
    chores_need_listing, entry_text, next_append_on_head, Head,
};
use safetensors_spark_dataset::log::follow::{
    manifest_listing, plan_follow_by_names, FollowPlan, OnChange,
};
use safetensors_spark_dataset::log::{
    after_commit, log_entry_text, parse_log_file, plan_state_by_names, ListedFile, LogFile, Replay,
    StatePlan,
};
use safetensors_spark_dataset::manifest::{stream_batch_committed, ManifestShard, StreamBatch};
use safetensors_spark_dataset::parse_manifest;
use safetensors_spark_dataset::vacuum::deletes_at_commit;
use std::collections::BTreeMap;

fn manifest(text: &str, what: &str) -> Result<safetensors_spark_dataset::Manifest, JniError> {
    parse_manifest(text).map_err(|e| JniError::from(e).context(format_args!("{what}")))
}

/// `logEntry`: the text of the log entry of `next` committed on `base` (`None`: nothing before).
pub fn log_entry_json(base: Option<&str>, next: &str) -> Result<String, JniError> {
    let base = base
        .map(|b| manifest(b, "the commit's base manifest"))
        .transpose()?;
    let next = manifest(next, "the committed manifest")?;
    Ok(log_entry_text(base.as_ref(), &next)?)
}

/// `appendOnHead`: the next version of an append (a streaming micro-batch's when `batch`) of
/// `write_manifest` on top of version `base_version`, whose own `_manifest_log/` entry is
/// `base_entry` — what the commit's critical section needs, at the cost of the write and the
/// columns, never of the shards the dataset holds ([`next_append_on_head`]). `None` when that
/// entry gives no head (a delta that keeps its base's schema, written before entries always gave
/// it), or a write of no rows: the caller commits on the whole base. Else `(answer, entry)`: `{"version", "superseded":
/// [], "retain"}` and the entry to create, or `{"replay": true}` and no entry when the base
/// records the batch already (the caller drops the replay's shards).
pub fn append_on_head_json(
    base_entry: &str,
    base_version: u64,
    write_manifest: &str,
    batch: Option<&StreamBatch>,
    commit_info: Option<&str>,
) -> Result<Option<(String, String)>, JniError> {
    let record = parse_log_file(LogFile::Entry(base_version), base_entry)?;
    let Some(head) = Head::of_record(record) else {
        return Ok(None);
    };
    if batch.is_some_and(|b| stream_batch_committed(Some(&head.manifest), b)) {
        return Ok(Some((
            to_json(&serde_json::json!({"replay": true}))?,
            String::new(),
        )));
    }
    let new = manifest(write_manifest, "this write's manifest")?;
    let Some((mut next, changes)) = next_append_on_head(&head, &new, batch)? else {
        return Ok(None);
    };
    crate::writer_api::stamp(&mut next, commit_info)?;
    let entry = entry_text(Some(&head), &next, &changes)?;
    let answer = to_json(&serde_json::json!({
        "version": next.manifest_version(),
        "superseded": [],
        "retain": !deletes_at_commit(Some(&head.manifest), &next),
    }))?;
    Ok(Some((answer, entry)))
}

/// `applyEntry`: the whole manifest of `version`, committed with the entry `entry` on the
/// version whose whole manifest is `base` (what `dataset_manifest.json` holds once it is
/// published). Costs the dataset's shards: a writer calls it after its commit, outside the
/// critical section. An entry that does not follow `base` is an error naming it.
pub fn apply_entry_json(base: &str, version: u64, entry: &str) -> Result<String, JniError> {
    let base = manifest(base, "the commit's base manifest")?;
    let record = parse_log_file(LogFile::Entry(version), entry)?;
    let mut replay = Replay::from_manifest(&base);
    replay.apply(&record)?;
    Ok(replay.manifest()?.to_json_pretty()?)
}

/// `choresNeedListing`: whether the committer of the version whose entry is `entry` lists the log
/// for its chores ([`chores_need_listing`]), given the text of its base's own entry (`None`: no
/// base, or not read). A base entry that does not parse counts as an older log (listed).
pub fn chores_need_listing_json(
    entry: &str,
    base_entry: Option<&str>,
    prune_entries: bool,
) -> Result<bool, JniError> {
    let file = |text: &str| -> Option<LogFile> {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        Some(LogFile::Entry(v.get("manifest_version")?.as_u64()?))
    };
    let Some(own) = file(entry) else {
        return Err(JniError::invalid_argument(
            "the commit's entry has no manifest_version",
        ));
    };
    let next = parse_log_file(own, entry)?;
    let base = base_entry
        .filter(|_| next.base_version > 0)
        .and_then(|t| parse_log_file(LogFile::Entry(next.base_version), t).ok())
        .and_then(Head::of_record);
    Ok(chores_need_listing(
        next.version,
        &next.manifest,
        base.as_ref(),
        prune_entries,
    ))
}

/// `rebuild`: given the log's file names and the texts read so far (`{name: text}`), either
/// `{"read": [names]}` or `{"manifest": text}` — the whole manifest of `version`.
pub fn rebuild_json(names_json: &str, version: u64, read_json: &str) -> Result<String, JniError> {
    let names: Vec<String> = parse_json(names_json, "manifest log names")?;
    let texts: BTreeMap<String, String> = parse_json(read_json, "manifest log texts")?;
    match plan_state_by_names(&names, version, texts)? {
        StatePlan::Read(need) => to_json(&serde_json::json!({
            "read": need.iter().map(|f| f.name()).collect::<Vec<_>>()
        })),
        StatePlan::Done(m) => to_json(&serde_json::json!({
            "manifest": m.to_json_pretty()?
        })),
    }
}

/// `follow`: what a reader at version `after` reads to reach `upto` (spec/dataset.md §5.12),
/// given the log's file names and the texts read so far: `{"read": [names]}` or
/// `{"versions": [{version, operation, committed_at_ms, followed, add}]}`.
pub fn follow_json(
    names_json: &str,
    after: u64,
    upto: u64,
    read_json: &str,
    skip_changes: bool,
    skip_option: &str,
) -> Result<String, JniError> {
    let names: Vec<String> = parse_json(names_json, "manifest log names")?;
    let texts: BTreeMap<String, String> = parse_json(read_json, "manifest log texts")?;
    let on = if skip_changes {
        OnChange::Skip
    } else {
        OnChange::Fail
    };
    match plan_follow_by_names(&names, after, upto, texts, on, skip_option)? {
        FollowPlan::Read(need) => to_json(&serde_json::json!({
            "read": need.iter().map(|f| f.name()).collect::<Vec<_>>()
        })),
        FollowPlan::Done(v) => to_json(&serde_json::json!({ "versions": v })),
    }
}

#[derive(serde::Deserialize)]
struct Listed {
    name: String,
    modified_ms: u64,
}

/// `afterCommit`: `{"write_checkpoint": bool, "delete": [names]}` for the committer of `version`
/// (its manifest `next`), given the log's listing `[{name, modified_ms}]`.
pub fn after_commit_json(
    listing_json: &str,
    version: u64,
    next: &str,
    prune_entries: bool,
    now_ms: u64,
) -> Result<String, JniError> {
    let listed: Vec<Listed> = parse_json(listing_json, "manifest log listing")?;
    let mut files = Vec::with_capacity(listed.len());
    for l in listed {
        if let Some(file) = LogFile::parse(&l.name)? {
            files.push(ListedFile {
                file,
                modified_ms: l.modified_ms,
            });
        }
    }
    let next = manifest(next, "the committed manifest")?;
    let chores = after_commit(&files, version, &next, prune_entries, now_ms);
    to_json(&serde_json::json!({
        "write_checkpoint": chores.write_checkpoint,
        "delete": chores.delete.iter().map(|f| f.name()).collect::<Vec<_>>(),
    }))
}

fn version(v: jlong, what: &str) -> Result<u64, JniError> {
    u64::try_from(v).map_err(|_| JniError::invalid_argument(format!("{what} must be ≥ 0, got {v}")))
}

/// `static native String logEntry(String baseOrNull, String next)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeLog_logEntry<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    base: JString<'local>,
    next: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let base = opt(env, &base)?;
        let next = arg(env, &next, "next")?;
        let text = log_entry_json(base.as_deref(), &next)?;
        Ok(env.new_string(text)?)
    })
}

/// `static native String[] appendOnHead(String baseEntry, long baseVersion, String writeManifestJson, String queryIdOrNull, long batchId, String commitInfoJsonOrNull)`:
/// `{answer, entry}`, or null when the base's entry gives no head ([`append_on_head_json`])
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeLog_appendOnHead<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    base_entry: JString<'local>,
    base_version: jlong,
    write_manifest: JString<'local>,
    query_id: JString<'local>,
    batch_id: jlong,
    commit_info: JString<'local>,
) -> JObjectArray<'local, JString<'local>> {
    guard(&mut env, |env| {
        let base_entry = arg(env, &base_entry, "baseEntry")?;
        let write_manifest = arg(env, &write_manifest, "writeManifestJson")?;
        let batch = match opt(env, &query_id)? {
            Some(q) => Some(crate::writer_api::stream_batch(q, batch_id)?),
            None => None,
        };
        let commit_info = opt(env, &commit_info)?;
        let Some((answer, entry)) = append_on_head_json(
            &base_entry,
            version(base_version, "baseVersion")?,
            &write_manifest,
            batch.as_ref(),
            commit_info.as_deref(),
        )?
        else {
            return Ok(JObjectArray::default());
        };
        crate::string_array(env, &[&answer, &entry])
    })
}

/// `static native String applyEntry(String baseManifest, long version, String entry)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeLog_applyEntry<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    base: JString<'local>,
    v: jlong,
    entry: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let base = arg(env, &base, "baseManifest")?;
        let entry = arg(env, &entry, "entry")?;
        let text = apply_entry_json(&base, version(v, "version")?, &entry)?;
        Ok(env.new_string(text)?)
    })
}

/// `static native boolean choresNeedListing(String entry, String baseEntryOrNull, boolean pruneEntries)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeLog_choresNeedListing<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    entry: JString<'local>,
    base_entry: JString<'local>,
    prune: jboolean,
) -> jboolean {
    guard(&mut env, |env| {
        let entry = arg(env, &entry, "entry")?;
        let base_entry = opt(env, &base_entry)?;
        chores_need_listing_json(&entry, base_entry.as_deref(), prune)
    })
}

/// `static native String rebuild(String namesJson, long version, String readJson)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeLog_rebuild<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    names: JString<'local>,
    v: jlong,
    read: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let names = arg(env, &names, "namesJson")?;
        let read = arg(env, &read, "readJson")?;
        let text = rebuild_json(&names, version(v, "version")?, &read)?;
        Ok(env.new_string(text)?)
    })
}

/// `static native String afterCommit(String listingJson, long version, String next, boolean pruneEntries, long nowMs)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeLog_afterCommit<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    listing: JString<'local>,
    v: jlong,
    next: JString<'local>,
    prune: jboolean,
    now: jlong,
) -> JString<'local> {
    guard(&mut env, |env| {
        let listing = arg(env, &listing, "listingJson")?;
        let next = arg(env, &next, "next")?;
        let text = after_commit_json(
            &listing,
            version(v, "version")?,
            &next,
            prune,
            version(now, "nowMs")?,
        )?;
        Ok(env.new_string(text)?)
    })
}

/// `static native String follow(String namesJson, long after, long upto, String readJson, boolean skipChanges, String skipOption)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeLog_follow<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    names: JString<'local>,
    after: jlong,
    upto: jlong,
    read: JString<'local>,
    skip_changes: jboolean,
    skip_option: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let names = arg(env, &names, "namesJson")?;
        let read = arg(env, &read, "readJson")?;
        let skip_option = arg(env, &skip_option, "skipOption")?;
        let text = follow_json(
            &names,
            version(after, "after")?,
            version(upto, "upto")?,
            &read,
            skip_changes,
            &skip_option,
        )?;
        Ok(env.new_string(text)?)
    })
}

/// `static native String followManifest(String baseManifest, String shardsJson)`: `base` listing
/// only the shard records `shardsJson` (a JSON array), totals recomputed (spec/dataset.md §5.12).
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeLog_followManifest<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    base: JString<'local>,
    shards: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let base = arg(env, &base, "baseManifest")?;
        let shards: Vec<ManifestShard> = parse_json(&arg(env, &shards, "shardsJson")?, "shards")?;
        let text = manifest_listing(&base, shards)?;
        Ok(env.new_string(text)?)
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn manifest(v: u64, shards: u64) -> safetensors_spark_dataset::Manifest {
        let list: Vec<String> = (1..=shards)
            .map(|i| {
                format!(
                    r#"{{"shard_path":"part-{i:05}-0000-00000000-0000-0000-0000-{i:012}.safetensors","samples_count":1,"bytes":4,"partition":{i},"padded_samples":0,"num_tensors":1}}"#
                )
            })
            .collect();
        parse_manifest(&format!(
            r#"{{"format_version":"1.0","safetensors_version":"1.0","total_samples":{shards},"total_bytes":{b},"shards":[{s}],"schema":{{"x":{{"dtype":"F32","shape":[1]}}}},"format":"safetensors-spark-dataset","created_by":"t","manifest_version":{v},"layout":"batch","batch_size":1,"tail_strategy":"write","kv_separator":null,"padded_samples":0,"dropped_samples":0,"checkpoint_interval":10}}"#,
            b = 4 * shards,
            s = list.join(",")
        ))
        .unwrap()
    }

    /// The head path of a commit (the base's entry, then the entry applied to the base after the
    /// commit) gives the version the whole path gives: the same entry, the same manifest, the
    /// same answer; a replayed micro-batch is answered as one.
    #[test]
    fn an_append_on_the_base_entry_is_the_append_on_the_whole_base() {
        let base = manifest(6, 6);
        let base_text = base.to_json_pretty().unwrap();
        let base_entry = log_entry_text(Some(&manifest(5, 5)), &base).unwrap();
        let mut write = manifest(8, 8);
        write.shards = write.shards.split_off(6);
        write.recompute_totals();
        let write = serde_json::to_string(&write).unwrap();
        let info = r#"{"committed_at_ms":1764000000000,"app_id":"local-1"}"#;
        let whole =
            crate::writer_api::next_manifest_json(Some(&base_text), &write, true, None, Some(info))
                .unwrap();
        let (answer, entry) = append_on_head_json(&base_entry, 6, &write, None, Some(info))
            .unwrap()
            .unwrap();
        assert_eq!(entry, whole.entry);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&answer).unwrap(),
            serde_json::from_str::<serde_json::Value>(&whole.answer).unwrap()
        );
        assert_eq!(
            apply_entry_json(&base_text, 7, &entry).unwrap(),
            whole.manifest
        );
        // an entry that does not follow the base is refused, naming it
        let e = apply_entry_json(&manifest(5, 5).to_json_pretty().unwrap(), 7, &entry);
        assert!(format!("{:?}", e.unwrap_err()).contains("00000000000000000007"));
        // a stream's batch: recorded in the entry; once recorded, a replay
        let batch = StreamBatch {
            query_id: "q".into(),
            batch_id: 3,
        };
        let (_, entry) = append_on_head_json(&base_entry, 6, &write, Some(&batch), Some(info))
            .unwrap()
            .unwrap();
        let seven = apply_entry_json(&base_text, 7, &entry).unwrap();
        let seven_entry = log_entry_text(Some(&base), &manifest_of(&seven)).unwrap();
        assert_eq!(seven_entry, entry);
        let (answer, entry) = append_on_head_json(&seven_entry, 7, &write, Some(&batch), None)
            .unwrap()
            .unwrap();
        assert_eq!(answer, r#"{"replay":true}"#);
        assert!(entry.is_empty());
        // a write of no rows is committed on the whole base
        let mut empty = manifest(8, 8);
        empty.shards.clear();
        empty.recompute_totals();
        empty.schema = Default::default();
        let empty = serde_json::to_string(&empty).unwrap();
        assert!(append_on_head_json(&base_entry, 6, &empty, None, None)
            .unwrap()
            .is_none());
    }

    fn manifest_of(text: &str) -> safetensors_spark_dataset::Manifest {
        parse_manifest(text).unwrap()
    }

    #[test]
    fn the_chores_list_the_log_only_when_the_rule_says_so() {
        let entry = |v: u64| {
            let base = (v > 1).then(|| manifest(v - 1, v - 1));
            log_entry_text(base.as_ref(), &manifest(v, v)).unwrap()
        };
        let (six, seven) = (entry(6), entry(7));
        // a delta base between checkpoints: nothing to list
        assert!(!chores_need_listing_json(&seven, Some(&six), false).unwrap());
        // a checkpoint version, retention 0, a base not read, a base that does not parse, a
        // whole base (an older log), the first commit
        assert!(chores_need_listing_json(&entry(10), Some(&entry(9)), false).unwrap());
        assert!(chores_need_listing_json(&seven, Some(&six), true).unwrap());
        assert!(chores_need_listing_json(&seven, None, false).unwrap());
        assert!(chores_need_listing_json(&seven, Some("{not json"), false).unwrap());
        let whole = manifest(6, 6).to_json_pretty().unwrap();
        assert!(chores_need_listing_json(&seven, Some(&whole), false).unwrap());
        assert!(chores_need_listing_json(&entry(1), None, false).unwrap());
        // an entry that is not one is an error, not a guess
        assert!(chores_need_listing_json("{}", None, false).is_err());
    }
}
