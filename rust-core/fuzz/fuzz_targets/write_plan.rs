//! Any Spark schema JSON and write options: the planner either returns a plan or an error naming
//! the problem; it never panics. Input: the schema JSON, a NUL byte, then the options as a JSON
//! object of strings (or, when that does not parse, the rest as the value of every option the
//! writer knows, so that values are fuzzed even without valid JSON).
#![no_main]
use libfuzzer_sys::fuzz_target;
use safetensors_spark_engine::write::plan::plan_write;
use std::collections::BTreeMap;

const KEYS: [&str; 12] = [
    "batch_size",
    "name_col",
    "tail_strategy",
    "kv_separator",
    "target_shard_size_mb",
    "duplicatesStrategy",
    "dtype",
    "dtypes",
    "columns",
    "shapes",
    "generate_index",
    "metadata",
];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (schema, rest) = text.split_once('\0').unwrap_or((text, ""));
    let options: BTreeMap<String, String> = serde_json::from_str(rest).unwrap_or_else(|_| {
        let mut m = BTreeMap::new();
        let (key, value) = rest.split_once('=').unwrap_or(("batch_size", rest));
        m.insert(key.to_owned(), value.to_owned());
        if let Some(k) = KEYS.iter().find(|k| rest.starts_with(**k)) {
            m.insert((*k).to_owned(), value.to_owned());
        }
        m
    });
    for case_sensitive in [false, true] {
        if let Ok(plan) = plan_write(schema, &options, case_sensitive) {
            let _ = serde_json::to_string(&plan);
        }
    }
});
