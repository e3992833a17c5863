//! `NativeVersions`: the versions of a dataset for the Spark side (spec/dataset.md §5.8), which
//! lists `_manifest_log/` through Hadoop and asks here which version to read, whether its shards
//! are there as written, and what the history is. The rules are the dataset crate's
//! ([`safetensors_spark_dataset::versions`]).

use crate::{arg, guard, parse_json, to_json, JniError};
use ::jni::objects::{JClass, JString};
use ::jni::sys::jlong;
use ::jni::EnvUnowned;
use safetensors_spark_dataset::versions::{
    check_entry_shards, history_listed, select_listed, starting_listed, version_spec,
    ListedLogEntry,
};
use safetensors_spark_dataset::DatasetError;
use std::collections::BTreeMap;

/// A bad option value is the user's options error.
fn options(e: DatasetError) -> JniError {
    JniError::Options(e.to_string())
}

/// `selectVersion`: the version to read among `entries` (texts needed for a timestamp).
pub fn select_version_json(
    entries_json: &str,
    version_as_of: Option<&str>,
    timestamp_as_of: Option<&str>,
) -> Result<u64, JniError> {
    let spec = version_spec(version_as_of, timestamp_as_of).map_err(options)?;
    let entries: Vec<ListedLogEntry> = parse_json(entries_json, "manifest log entries")?;
    Ok(select_listed(&entries, spec)?)
}

/// `checkVersionShards`: every shard `manifest` (version `version`) lists against `found`
/// (shard name → file size; absent: missing).
pub fn check_version_shards_json(
    manifest: &str,
    version: u64,
    found_json: &str,
) -> Result<(), JniError> {
    // the entry must agree with its name (spec/dataset.md §5.9) before its shards are checked
    let found: BTreeMap<String, u64> = parse_json(found_json, "shard sizes")?;
    check_entry_shards(manifest, version, &found)?;
    Ok(())
}

/// `history`: the history rows (JSON array) of `entries` (every text given).
pub fn history_json(entries_json: &str) -> Result<String, JniError> {
    let entries: Vec<ListedLogEntry> = parse_json(entries_json, "manifest log entries")?;
    to_json(&history_listed(&entries)?)
}

/// An optional (nullable) Java string argument.
pub(crate) fn opt(env: &::jni::Env<'_>, s: &JString<'_>) -> Result<Option<String>, JniError> {
    if s.is_null() {
        Ok(None)
    } else {
        Ok(Some(s.try_to_string(env)?))
    }
}

/// `static native long selectVersion(String entriesJson, String versionAsOfOrNull, String timestampAsOfOrNull)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeVersions_selectVersion<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    entries: JString<'local>,
    version_as_of: JString<'local>,
    timestamp_as_of: JString<'local>,
) -> jlong {
    guard(&mut env, |env| {
        let entries = arg(env, &entries, "entriesJson")?;
        let v = opt(env, &version_as_of)?;
        let t = opt(env, &timestamp_as_of)?;
        let version = select_version_json(&entries, v.as_deref(), t.as_deref())?;
        Ok(i64::try_from(version).unwrap_or(i64::MAX))
    })
}

/// `static native long startingVersion(String entriesJson, String startingTimestamp)`: where a
/// follower given a start time begins (the oldest version committed at or after it; one past the
/// latest when none was), every entry's text given. A bad time is the user's options error.
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeVersions_startingVersion<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    entries: JString<'local>,
    timestamp: JString<'local>,
) -> jlong {
    guard(&mut env, |env| {
        let entries: Vec<ListedLogEntry> =
            parse_json(&arg(env, &entries, "entriesJson")?, "manifest log entries")?;
        let t = arg(env, &timestamp, "startingTimestamp")?;
        // a time that does not parse is the option's error; a log that cannot be read, the data's
        safetensors_spark_dataset::versions::parse_time_option(&t, "startingTimestamp")
            .map_err(options)?;
        let version = starting_listed(&entries, &t, "startingTimestamp")?;
        Ok(i64::try_from(version).unwrap_or(i64::MAX))
    })
}

/// `static native void checkVersionShards(String manifestJson, long version, String foundJson)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeVersions_checkVersionShards<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    manifest: JString<'local>,
    version: jlong,
    found: JString<'local>,
) {
    guard(&mut env, |env| {
        let manifest = arg(env, &manifest, "manifestJson")?;
        let found = arg(env, &found, "foundJson")?;
        check_version_shards_json(&manifest, u64::try_from(version).unwrap_or(0), &found)
    })
}

/// `static native String history(String entriesJson)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeVersions_history<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    entries: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let entries = arg(env, &entries, "entriesJson")?;
        let json = history_json(&entries)?;
        Ok(env.new_string(json)?)
    })
}

/// `checkOwnDir`: whether the local dataset directory `dir` has its own directory `name`
/// (`_manifest_log`, `_tensor_index.parquet`); a symbolic link or a non-directory there is a
/// dataset error naming it (spec/dataset.md §5.9, `own::own_dir`).
pub fn check_own_dir(dir: &str, name: &str) -> Result<bool, JniError> {
    let dir = std::path::Path::new(dir);
    safetensors_spark_dataset::own::own_dir(dir, name)
        .map(|d| d.is_some())
        .map_err(|e| JniError::Dataset(format!("{}: {e}", dir.join(name).display())))
}

/// `static native boolean checkOwnDir(String localDir, String name)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeVersions_checkOwnDir<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    dir: JString<'local>,
    name: JString<'local>,
) -> ::jni::sys::jboolean {
    guard(&mut env, |env| {
        let dir = arg(env, &dir, "localDir")?;
        let name = arg(env, &name, "name")?;
        check_own_dir(&dir, &name)
    })
}

/// `static native boolean isOwnSubdir(String localPath)`: a directory that is not a symbolic
/// link (a partition directory of a `partitionBy` root, spec/dataset.md §5.9).
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeVersions_isOwnSubdir<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    path: JString<'local>,
) -> ::jni::sys::jboolean {
    guard(&mut env, |env| {
        let path = arg(env, &path, "localPath")?;
        Ok(safetensors_spark_dataset::own::is_own_subdir(
            std::path::Path::new(&path),
        ))
    })
}

/// `static native boolean isOwnFile(String localPath)`: a regular file that is not a symbolic
/// link, the only kind of file a vacuum deletes (spec/dataset.md §5.9).
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeVersions_isOwnFile<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    path: JString<'local>,
) -> ::jni::sys::jboolean {
    guard(&mut env, |env| {
        let path = arg(env, &path, "localPath")?;
        Ok(safetensors_spark_dataset::own::is_own_file(
            std::path::Path::new(&path),
        ))
    })
}

/// `readManifestFile`: the text of a local manifest, log entry or task report by the one rule of
/// spec/dataset.md §5.9 (`own::read_manifest_text`: a regular file, a FIFO or a device refused at
/// once, within the size bound); `None` when the file does not exist.
pub fn read_manifest_file(path: &str) -> Result<Option<String>, JniError> {
    match safetensors_spark_dataset::own::read_manifest_text(std::path::Path::new(path)) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(JniError::Dataset(format!("{path}: {e}"))),
    }
}

/// `static native String readManifestFile(String localPath)`: null when absent.
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeVersions_readManifestFile<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    path: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let path = arg(env, &path, "localPath")?;
        match read_manifest_file(&path)? {
            Some(t) => Ok(env.new_string(t)?),
            None => Ok(JString::default()),
        }
    })
}
