//! `io.safetensors.spark.jni.NativeNames`: the names of a dataset directory and the commit bound
//! (`safetensors_spark_dataset::names`, spec/dataset.md §1), so that the connector's Hadoop code
//! builds and parses every name with the one Rust rule instead of a Scala copy.

use ::jni::objects::{JClass, JString};
use ::jni::sys::{jint, jlong};
use ::jni::{Env, EnvUnowned};
use safetensors_spark_dataset::{names, MAX_COMMIT_ATTEMPTS};

use crate::{arg, guard, JniError};

/// A `long` version from the JVM: at least 0 and at most [`names::MAX_VERSION`].
fn version_arg(version: jlong) -> Result<u64, JniError> {
    u64::try_from(version).map_err(|_| {
        JniError::InvalidArgument(format!(
            "version {version}: a dataset version is from 0 to {}",
            names::MAX_VERSION
        ))
    })
}

/// A parsed version for the JVM: -1 for `None` (the name is not one of that kind).
fn version_or_minus_one(v: Option<u64>) -> jlong {
    v.and_then(|v| jlong::try_from(v).ok()).unwrap_or(-1)
}

fn string<'local>(env: &mut Env<'local>, s: &str) -> Result<JString<'local>, JniError> {
    Ok(env.new_string(s)?)
}

/// `static native String constant(String which)`: one of the names of spec/dataset.md §1 and
/// §4 by its Rust name (`MANIFEST_FILE_NAME`, `MANIFEST_LOG_DIR`, `INDEX_DIR_NAME`,
/// `SHARD_FILE_EXTENSION`, `DEFAULT_KV_SEPARATOR`); another name is an IllegalArgumentException
/// listing them.
pub fn constant(which: &str) -> Result<&'static str, JniError> {
    const ALL: [(&str, &str); 5] = [
        ("MANIFEST_FILE_NAME", names::MANIFEST_FILE_NAME),
        ("MANIFEST_LOG_DIR", names::MANIFEST_LOG_DIR),
        ("INDEX_DIR_NAME", names::INDEX_DIR_NAME),
        ("SHARD_FILE_EXTENSION", names::SHARD_FILE_EXTENSION),
        ("DEFAULT_KV_SEPARATOR", names::DEFAULT_KV_SEPARATOR),
    ];
    ALL.iter()
        .find(|(n, _)| *n == which)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let known: Vec<&str> = ALL.iter().map(|(n, _)| *n).collect();
            JniError::InvalidArgument(format!(
                "no dataset name constant '{which}'; the constants are {}",
                known.join(", ")
            ))
        })
}

#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeNames_constant<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    which: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let which = arg(env, &which, "which")?;
        string(env, constant(&which)?)
    })
}

/// `static native int maxCommitAttempts()`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeNames_maxCommitAttempts<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
) -> jint {
    guard(&mut env, |_| {
        Ok(jint::try_from(MAX_COMMIT_ATTEMPTS).unwrap_or(jint::MAX))
    })
}

/// `static native long logKeptVersions()`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeNames_logKeptVersions<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
) -> jlong {
    guard(&mut env, |_| {
        Ok(jlong::try_from(safetensors_spark_dataset::log::KEPT_VERSIONS).unwrap_or(jlong::MAX))
    })
}

/// `static native String checkpointFileName(long version)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeNames_checkpointFileName<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    version: jlong,
) -> JString<'local> {
    guard(&mut env, |env| {
        let name = names::checkpoint_file_name(version_arg(version)?);
        string(env, &name)
    })
}

/// `static native String manifestLogFileName(long version)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeNames_manifestLogFileName<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    version: jlong,
) -> JString<'local> {
    guard(&mut env, |env| {
        let name = names::manifest_log_file_name(version_arg(version)?);
        string(env, &name)
    })
}

/// `static native long parseManifestLogFileName(String name)`: the version, -1 for a name that
/// is no log entry; a name of 20 digits beyond the largest version throws
/// SafetensorsDatasetException naming it.
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeNames_parseManifestLogFileName<
    'local,
>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    name: JString<'local>,
) -> jlong {
    guard(&mut env, |env| {
        let name = arg(env, &name, "name")?;
        Ok(version_or_minus_one(names::parse_manifest_log_file_name(
            &name,
        )?))
    })
}

/// `static native long parseCheckpointFileName(String name)`: the version, -1 for a name that is
/// no checkpoint.
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeNames_parseCheckpointFileName<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    name: JString<'local>,
) -> jlong {
    guard(&mut env, |env| {
        let name = arg(env, &name, "name")?;
        Ok(version_or_minus_one(names::parse_checkpoint_file_name(
            &name,
        )?))
    })
}

/// `static native String indexPartFileName(long version)`: the index part of a manifest version
/// (the layout before per-shard parts, spec/dataset.md §6.1).
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeNames_indexPartFileName<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    version: jlong,
) -> JString<'local> {
    guard(&mut env, |env| {
        let name = names::index_part_file_name(version_arg(version)?);
        string(env, &name)
    })
}

/// `static native long parseIndexPartFileName(String name)`: the version, -1 for another name.
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeNames_parseIndexPartFileName<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    name: JString<'local>,
) -> jlong {
    guard(&mut env, |env| {
        let name = arg(env, &name, "name")?;
        Ok(version_or_minus_one(names::parse_index_part_file_name(
            &name,
        )))
    })
}

/// `static native boolean isHiddenName(String name)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeNames_isHiddenName<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    name: JString<'local>,
) -> ::jni::sys::jboolean {
    guard(&mut env, |env| {
        Ok(names::is_hidden_name(&arg(env, &name, "name")?))
    })
}

/// `static native boolean isShardFileName(String name)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeNames_isShardFileName<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    name: JString<'local>,
) -> ::jni::sys::jboolean {
    guard(&mut env, |env| {
        Ok(names::is_shard_file_name(&arg(env, &name, "name")?))
    })
}

/// `static native long shardFilePartition(String name)`: the partition of one of this
/// connector's shard names, -1 for another name.
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeNames_shardFilePartition<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    name: JString<'local>,
) -> jlong {
    guard(&mut env, |env| {
        let name = arg(env, &name, "name")?;
        Ok(names::parse_shard_file_name(&name).map_or(-1, |(p, _, _)| jlong::from(p)))
    })
}

/// `static native String rewrittenShardFileName(String old, int copy, String writeId)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeNames_rewrittenShardFileName<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    old: JString<'local>,
    copy: jint,
    write_id: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let old = arg(env, &old, "old")?;
        let write_id = arg(env, &write_id, "writeId")?;
        let copy = u32::try_from(copy).map_err(|_| {
            JniError::InvalidArgument(format!("copy {copy}: a shard number is at least 0"))
        })?;
        string(
            env,
            &names::rewritten_shard_file_name(&old, copy, &write_id),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_by_name_and_an_unknown_one_lists_them() {
        assert_eq!(
            constant("MANIFEST_FILE_NAME").ok(),
            Some("dataset_manifest.json")
        );
        let e = constant("NOPE")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("'NOPE'") && e.contains("MANIFEST_LOG_DIR"),
            "{e}"
        );
    }

    #[test]
    fn versions_cross_as_signed_longs() {
        assert!(version_arg(-1).is_err());
        assert_eq!(version_arg(jlong::MAX).ok(), Some(names::MAX_VERSION));
        assert_eq!(version_or_minus_one(None), -1);
        assert_eq!(version_or_minus_one(Some(7)), 7);
    }
}
