//! Any text as `dataset_manifest.json`: parsing never panics; every shard name a parsed manifest
//! lists that passes the trust rule is a plain file name (no separator, no `..`, no scheme), and
//! the next manifest built on it (append and overwrite) never panics either.
#![no_main]
use libfuzzer_sys::fuzz_target;
use safetensors_spark_dataset::manifest::{next_manifest, parse_manifest, superseded_shards};
use safetensors_spark_dataset::names::check_shard_path;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(m) = parse_manifest(text) else {
        return;
    };
    for s in &m.shards {
        if check_shard_path(&s.shard_path).is_ok() {
            let p = s.shard_path.as_str();
            assert!(
                !p.contains('/') && !p.contains('\\') && !p.contains('\0'),
                "{p:?}"
            );
            assert!(p != "." && p != ".." && !p.contains(':'), "{p:?}");
        }
    }
    for append in [false, true] {
        if let Ok(next) = next_manifest(Some(&m), &m, append, &[]) {
            let _ = superseded_shards(&m, &next);
            let _ = serde_json::to_string(&next);
        }
    }
});
