//! `safetensors-spark vacuum` as a real process on a real directory.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::fs;
use std::path::Path;
use std::process::Command;

fn shard(i: u32) -> String {
    format!("part-{i:05}-0000-00000000-0000-0000-0000-{i:012}.safetensors")
}

fn commit(dir: &Path, v: u64, shards: &[u32], at: u64) {
    let entries: Vec<String> = shards
        .iter()
        .map(|i| {
            format!(
                r#"{{"shard_path":"{}","samples_count":1,"bytes":4,"partition":{i},"padded_samples":0,"num_tensors":1}}"#,
                shard(*i)
            )
        })
        .collect();
    let text = format!(
        r#"{{"format_version":"1.0","safetensors_version":"1.0","total_samples":{n},"total_bytes":{b},"shards":[{s}],"schema":{{"x":{{"dtype":"F32","shape":[1]}}}},"format":"safetensors-spark-dataset","created_by":"t","manifest_version":{v},"layout":"batch","batch_size":1,"tail_strategy":"write","kv_separator":null,"padded_samples":0,"dropped_samples":0,"committed_at_ms":{at}}}"#,
        n = shards.len(),
        b = 4 * shards.len(),
        s = entries.join(",")
    );
    fs::create_dir_all(dir.join("_manifest_log")).unwrap();
    fs::write(
        dir.join("_manifest_log").join(format!("{v:020}.json")),
        &text,
    )
    .unwrap();
    fs::write(dir.join("dataset_manifest.json"), &text).unwrap();
    for i in shards {
        fs::write(dir.join(shard(*i)), b"abcd").unwrap();
    }
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_safetensors-spark"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn vacuum_dry_run_override_and_bad_values() {
    let d = std::env::temp_dir().join(format!("vacuum-cli-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    // committed now: version 1 was current until a moment ago, inside 7 days
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    commit(&d, 1, &[1], now - 1);
    commit(&d, 2, &[2], now);
    let ds = d.to_str().unwrap();
    // bad values: exit 2 naming the option and what is allowed; nothing changes
    for bad in ["-1 days", "soon", "99999999999999999999 days"] {
        let (code, _, err) = run(&["vacuum", "--retention", bad, ds]);
        assert_eq!(code, 2, "{bad}");
        assert!(
            err.contains("--retention") && err.contains("seconds, minutes, hours or days"),
            "{err}"
        );
    }
    // shorter than the dataset's default 7 days: refused without the override
    let (code, _, err) = run(&["vacuum", "--retention", "0", ds]);
    assert_eq!(code, 1);
    assert!(
        err.contains("shorter than the dataset's retention"),
        "{err}"
    );
    assert!(d.join(shard(1)).exists());
    // the dataset's own retention (7 days): everything is inside it
    let (code, out, _) = run(&["vacuum", ds]);
    assert_eq!(code, 0);
    assert!(d.join(shard(1)).exists(), "{out}");
    // dry run lists shard 1 and deletes nothing
    let (code, out, _) = run(&[
        "vacuum",
        "--retention",
        "0",
        "--allow-shorter-retention",
        "--dry-run",
        ds,
    ]);
    assert_eq!(code, 0);
    assert!(
        out.contains(&shard(1)) && d.join(shard(1)).exists(),
        "{out}"
    );
    // and for real
    let (code, out, err) = run(&[
        "vacuum",
        "--retention",
        "0 seconds",
        "--allow-shorter-retention",
        ds,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        !d.join(shard(1)).exists() && d.join(shard(2)).exists(),
        "{out}"
    );
    let m = fs::read_to_string(d.join("dataset_manifest.json")).unwrap();
    assert!(
        m.contains("\"operation\": \"vacuum\"") && m.contains("\"manifest_version\": 4"),
        "{m}"
    );
    fs::remove_dir_all(&d).unwrap();
}
