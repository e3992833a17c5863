//! File names of a dataset directory (spec/dataset.md §1) and the trust rule for names read from
//! a manifest or an index: one check, used by every path that turns such a name into a path
//! (the write's overwrite and append, the Spark reader, the Python package).

use super::DatasetError;

/// The manifest every reader looks for.
pub const MANIFEST_FILE_NAME: &str = "dataset_manifest.json";
/// The versioned manifests (one file per commit) live in this directory.
pub const MANIFEST_LOG_DIR: &str = "_manifest_log";
/// The tensor index: a directory of Parquet part files (spec/dataset.md §6).
pub const INDEX_DIR_NAME: &str = "_tensor_index.parquet";
/// Shard metadata key holding the number of real rows (keys) in the shard.
pub const SAMPLES_METADATA_KEY: &str = "safetensors_spark.samples";
/// Shard metadata key holding the number of padding rows in the shard.
pub const PADDED_SAMPLES_METADATA_KEY: &str = "safetensors_spark.padded_samples";
/// Shard `__metadata__` key (spec/dataset.md §4): the shard's ragged columns (§2.1), a JSON
/// array of names in column order; present only when there is at least one.
pub const RAGGED_METADATA_KEY: &str = "safetensors_spark.ragged";
/// Shard `__metadata__` key: the dataset mode that wrote the shard (`batch` or `kv`).
pub const LAYOUT_METADATA_KEY: &str = "safetensors_spark.layout";
/// Shard `__metadata__` key (KV shards): the separator between key and column in tensor names.
pub const KV_SEPARATOR_METADATA_KEY: &str = "safetensors_spark.kv_separator";
/// Shard `__metadata__` key: the version of these metadata keys (`1`).
pub const FORMAT_VERSION_METADATA_KEY: &str = "safetensors_spark.format_version";
/// Shard `__metadata__` key: the id of the write that made the shard.
pub const WRITE_ID_METADATA_KEY: &str = "safetensors_spark.write_id";
/// The prefix of every key above: a user's `metadata` option may not use it.
pub const RESERVED_METADATA_PREFIX: &str = "safetensors_spark.";
/// KV mode's separator between key and column when the write gives no `kv_separator`.
pub const DEFAULT_KV_SEPARATOR: &str = "__";
/// The ending of every shard file's name.
pub const SHARD_FILE_EXTENSION: &str = ".safetensors";
/// The largest dataset version: versions are signed 64-bit numbers for every reader (the JVM's
/// `long`, the index's and the history's Parquet/Arrow int64), so no larger one is ever created
/// or trusted.
pub const MAX_VERSION: u64 = i64::MAX as u64;

/// Whether a directory entry's name is hidden (spec/dataset.md §1): it starts with `_` or `.`.
/// A hidden entry is never a shard, a partition directory or data: the dataset's own files
/// (`_manifest_log/`, `_tensor_index.parquet/`), staging and temporary files are hidden.
pub fn is_hidden_name(name: &str) -> bool {
    name.starts_with('_') || name.starts_with('.')
}

/// Whether a listed file's name is a shard's: it ends in [`SHARD_FILE_EXTENSION`] and is not
/// hidden (what a reader of a directory without a manifest takes as its shards).
pub fn is_shard_file_name(name: &str) -> bool {
    name.ends_with(SHARD_FILE_EXTENSION) && !is_hidden_name(name)
}

/// Shard file name for a partition, a per-task shard counter and the write id.
pub fn shard_file_name(partition: u32, shard: u32, write_id: &str) -> String {
    format!("part-{partition:05}-{shard:04}-{write_id}.safetensors")
}

/// File name of the manifest of commit `version` in [`MANIFEST_LOG_DIR`]: zero-padded so that
/// name order is version order.
pub fn manifest_log_file_name(version: u64) -> String {
    format!("{version:020}.json")
}

/// The version of a [`manifest_log_file_name`], `None` for any other name (a temporary file,
/// notes). A name of 20 digits beyond [`MAX_VERSION`] is an error naming it (spec/dataset.md
/// §5.9): it looks like an entry but holds no version, so no reader may skip it silently.
pub fn parse_manifest_log_file_name(name: &str) -> Result<Option<u64>, DatasetError> {
    let Some(digits) = name.strip_suffix(".json") else {
        return Ok(None);
    };
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(None);
    }
    match digits.parse::<u64>() {
        Ok(v) if v <= MAX_VERSION => Ok(Some(v)),
        _ => Err(DatasetError::Version {
            problem: format!(
                "{MANIFEST_LOG_DIR}/{name}: not a version number (at most {MAX_VERSION}); \
                 remove this file"
            ),
        }),
    }
}

/// File name of the checkpoint of version `version` in [`MANIFEST_LOG_DIR`] (spec/dataset.md
/// §5.10): the whole manifest of that version, from which a reader replays later entries.
pub fn checkpoint_file_name(version: u64) -> String {
    format!("{version:020}.checkpoint.json")
}

/// The version of a [`checkpoint_file_name`], `None` for any other name; 20 digits beyond
/// [`MAX_VERSION`] are an error naming the file, as for entries.
pub fn parse_checkpoint_file_name(name: &str) -> Result<Option<u64>, DatasetError> {
    match name.strip_suffix(".checkpoint.json") {
        Some(digits) => parse_manifest_log_file_name(&format!("{digits}.json")),
        None => Ok(None),
    }
}

/// File name of the index part that belongs to manifest version `version`.
pub fn index_part_file_name(version: u64) -> String {
    format!("part-{version:020}.parquet")
}

/// The manifest version of an [`index_part_file_name`], `None` for any other name.
pub fn parse_index_part_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("part-")?.strip_suffix(".parquet")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok().filter(|v| *v <= MAX_VERSION))
        .flatten()
}

/// File name of the index part of shard `shard` in [`INDEX_DIR_NAME`] (spec/dataset.md §6.1): the
/// shard's name with `.parquet` for `.safetensors`; `None` for a name that does not pass
/// [`check_shard_path`].
pub fn shard_index_part_file_name(shard: &str) -> Option<String> {
    check_shard_path(shard).ok()?;
    Some(format!(
        "{}.parquet",
        shard.strip_suffix(SHARD_FILE_EXTENSION)?
    ))
}

/// Parses the file name `part-{partition}-{shard}-{uuid}.safetensors` this connector writes;
/// `None` when it is not one (the uuid must be lowercase and hyphenated).
pub fn parse_shard_file_name(name: &str) -> Option<(u32, u32, &str)> {
    let rest = name
        .strip_prefix("part-")?
        .strip_suffix(SHARD_FILE_EXTENSION)?;
    let (partition, rest) = rest.split_once('-')?;
    let (shard, uuid) = rest.split_once('-')?;
    let digits = |s: &str, min: usize| s.len() >= min && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(partition, 5) || !digits(shard, 4) {
        return None;
    }
    let groups: Vec<&str> = uuid.split('-').collect();
    let lens = [8, 4, 4, 4, 12];
    let uuid_ok = groups.len() == 5
        && groups.iter().zip(lens).all(|(g, n)| {
            g.len() == n
                && g.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
    if !uuid_ok {
        return None;
    }
    Some((partition.parse().ok()?, shard.parse().ok()?, uuid))
}

/// The name of the copy a write makes of an existing shard it rewrites (a KV `lastWin` append
/// drops the keys it replaces): the old shard's partition when it is one of this connector's
/// names (0 otherwise), `copy` as the shard number, and the rewriting write's id. Each shard a
/// commit rewrites takes its own `copy` number, so copies of shards that share a partition and
/// shard number (two writes of one Spark partition each) never share a name.
pub fn rewritten_shard_file_name(old: &str, copy: u32, write_id: &str) -> String {
    let partition = parse_shard_file_name(old).map_or(0, |(p, _, _)| p);
    shard_file_name(partition, copy, write_id)
}

/// The trust rule for a shard name read from a manifest or an index (`shards[].shard_path`,
/// `file_name`): a plain file name in the dataset directory, ending in `.safetensors`, that a
/// dataset reader would list as a shard. Refused: empty names, path separators (`/`, `\`), `.`
/// and `..`, a leading `.` or `_` (hidden and reserved names), a `:` (schemes, drive letters),
/// control characters (NUL included). Nothing else is ever joined to a dataset path.
pub fn check_shard_path(name: &str) -> Result<(), DatasetError> {
    let problem = if name.is_empty() {
        Some("it is empty")
    } else if name.contains(['/', '\\']) {
        Some("it contains a path separator")
    } else if name.contains(':') {
        Some("it contains ':' (a scheme or drive)")
    } else if name.chars().any(char::is_control) {
        Some("it contains a control character")
    } else if is_hidden_name(name) {
        Some("it starts with '.' or '_' (hidden and reserved names are not shards)")
    } else if !name.ends_with(SHARD_FILE_EXTENSION) || name.len() == SHARD_FILE_EXTENSION.len() {
        Some("it does not end in '.safetensors'")
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(p) => Err(DatasetError::UnsafeShardPath {
            name: name.escape_debug().to_string(),
            problem: p,
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn plain_shard_names_pass() {
        check_shard_path("part-00000-0000-550e8400-e29b-41d4-a716-446655440000.safetensors")
            .unwrap();
        check_shard_path("model-00001-of-00002.safetensors").unwrap();
    }

    #[test]
    fn names_that_would_leave_the_directory_or_hide_fail() {
        for bad in [
            "",
            "../victim/important.safetensors",
            "..",
            ".",
            "a/b.safetensors",
            "a\\b.safetensors",
            "/etc/passwd.safetensors",
            "s3://bucket/x.safetensors",
            "C:x.safetensors",
            "x\0.safetensors",
            "x\n.safetensors",
            ".hidden.safetensors",
            "_staging.safetensors",
            "notes.txt",
            ".safetensors",
            "dataset_manifest.json",
        ] {
            let e = check_shard_path(bad).unwrap_err().to_string();
            assert!(e.contains("is not a shard file name"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn hidden_and_shard_names() {
        for hidden in [
            "_manifest_log",
            ".x.safetensors.tmp",
            "_tensor_index.parquet",
            "_a.safetensors",
        ] {
            assert!(
                is_hidden_name(hidden) && !is_shard_file_name(hidden),
                "{hidden}"
            );
        }
        assert!(is_shard_file_name("model-00001-of-00002.safetensors"));
        assert!(!is_shard_file_name("dataset_manifest.json"));
        assert!(!is_hidden_name("part-00000-0000-x.safetensors"));
    }

    #[test]
    fn rewritten_copies_keep_the_partition_and_never_share_a_name() {
        let w1 = "550e8400-e29b-41d4-a716-446655440000";
        let w2 = "650e8400-e29b-41d4-a716-446655440000";
        let copy = "750e8400-e29b-41d4-a716-446655440000";
        // two writes of one Spark partition each: the same partition and shard numbers
        let (a, b) = (shard_file_name(3, 0, w1), shard_file_name(3, 0, w2));
        let (ca, cb) = (
            rewritten_shard_file_name(&a, 0, copy),
            rewritten_shard_file_name(&b, 1, copy),
        );
        assert_ne!(ca, cb);
        assert_eq!(parse_shard_file_name(&ca), Some((3, 0, copy)));
        assert_eq!(parse_shard_file_name(&cb), Some((3, 1, copy)));
        // another writer's name: partition 0
        assert_eq!(
            rewritten_shard_file_name("model-00001-of-00002.safetensors", 2, copy),
            shard_file_name(0, 2, copy)
        );
    }

    #[test]
    fn log_and_index_names_round_trip() {
        assert_eq!(manifest_log_file_name(7), "00000000000000000007.json");
        assert_eq!(
            parse_manifest_log_file_name(&manifest_log_file_name(7)).unwrap(),
            Some(7)
        );
        assert_eq!(parse_manifest_log_file_name("7.json").unwrap(), None);
        assert_eq!(
            parse_manifest_log_file_name(".00000000000000000007.json.tmp").unwrap(),
            None
        );
        let max = manifest_log_file_name(MAX_VERSION);
        assert_eq!(
            parse_manifest_log_file_name(&max).unwrap(),
            Some(MAX_VERSION)
        );
        // one past the largest version, and past u64: named, never skipped
        for stray in [
            manifest_log_file_name(MAX_VERSION + 1),
            "99999999999999999999.json".into(),
        ] {
            let e = parse_manifest_log_file_name(&stray)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!(
                    "_manifest_log/{stray}: not a version number (at most 9223372036854775807)"
                )),
                "{e}"
            );
        }
        assert_eq!(
            parse_index_part_file_name(&index_part_file_name(MAX_VERSION + 1)),
            None
        );
        assert_eq!(
            parse_index_part_file_name(&index_part_file_name(42)),
            Some(42)
        );
        assert_eq!(parse_index_part_file_name("part-00000.parquet"), None);
    }
}
