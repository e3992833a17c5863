//! `NativeLog`: the manifest log's rules for the Spark side (spec/dataset.md §5.10), which lists
//! and reads `_manifest_log/` through Hadoop: the entry a commit writes, what rebuilding a version
//! reads next, and the chores after a commit. The rules are [`safetensors_spark_dataset::log`].

use crate::versions_api::opt;
use crate::{arg, guard, parse_json, to_json, JniError};
use ::jni::objects::{JClass, JString};
use ::jni::sys::{jboolean, jlong};
use ::jni::EnvUnowned;
use safetensors_spark_dataset::commit::{chores_need_listing, Head};
use safetensors_spark_dataset::log::follow::{
    manifest_listing, plan_follow_by_names, FollowPlan, OnChange,
};
use safetensors_spark_dataset::log::{
    after_commit, log_entry_text, parse_log_file, plan_state_by_names, ListedFile, LogFile,
    StatePlan,
};
use safetensors_spark_dataset::manifest::ManifestShard;
use safetensors_spark_dataset::parse_manifest;
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
