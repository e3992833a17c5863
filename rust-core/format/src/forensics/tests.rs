//! A crafted file per flag, each giving exactly its flag; clean files giving none; hashes;
//! sharded checkpoints.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::sharded::{self, model_report, read_index};
use super::*;
use crate::file::write_file;
use crate::header::TensorEntry;
use sha2::{Digest, Sha256};

/// A file: the prefix, `json` padded with spaces to `pad` (a multiple of it; 1 = unpadded),
/// then `data_len` bytes `0, 1, 2, …`.
fn craft(json: &str, data_len: usize, pad: usize) -> Vec<u8> {
    let mut header = json.as_bytes().to_vec();
    while !header.len().is_multiple_of(pad) {
        header.push(b' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&header);
    out.extend((0..data_len).map(|i| i as u8));
    out
}

fn t(name: &str, dtype: &str, shape: &str, b: u64, e: u64) -> String {
    format!(r#""{name}":{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{b},{e}]}}"#)
}

fn codes(r: &FileReport) -> Vec<&'static str> {
    r.flags.iter().map(|f| f.code.code()).collect()
}

/// The report on `bytes`, checking the invariant every report keeps: error flags exactly when
/// the strict parser rejects the file.
fn report(bytes: &[u8]) -> FileReport {
    header::assert_paths_agree(bytes);
    let r = report_bytes("mem", bytes);
    let strict = header::parse_file_bytes(bytes);
    assert_eq!(
        r.worst() == Some(Level::Error),
        strict.is_err(),
        "errors vs strict parser: {:?} vs {strict:?}",
        r.flags
    );
    assert_eq!(r.strict_error, strict.err().map(|e| e.to_string()));
    assert_eq!(r.verdict, Verdict::of(&r.flags));
    r
}

/// The crafted corpus: (expected code, file bytes). One file per flag code a single file can
/// carry (the huge tensor needs a 2 GiB file: see `huge_tensor_is_flagged_from_the_header`).
fn corpus() -> Vec<(&'static str, Vec<u8>)> {
    let a = t("a", "F32", "[2]", 0, 8);
    let mut big_prefix = 200_000_000u64.to_le_bytes().to_vec();
    big_prefix.extend_from_slice(b"{}      ");
    let mut beyond = 100u64.to_le_bytes().to_vec();
    beyond.extend_from_slice(b"{}      ");
    let mut not_utf8 = craft(&format!("{{{}}}", t("a\u{1}", "F32", "[2]", 0, 8)), 8, 8);
    let at = not_utf8.iter().position(|b| *b == 1).unwrap();
    not_utf8[at] = 0xFF;
    vec![
        ("header_too_small", vec![1, 0, 0]),
        ("header_too_large", big_prefix),
        ("header_beyond_file", beyond),
        ("header_not_utf8", not_utf8),
        ("header_invalid_json", craft(r#"{"a":"#, 0, 8)),
        ("duplicate_key", craft(&format!("{{{a},{a}}}"), 8, 8)),
        (
            "metadata_not_string_map",
            craft(&format!(r#"{{"__metadata__":{{"k":1}},{a}}}"#), 8, 8),
        ),
        (
            "tensor_entry_invalid",
            craft(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}}"#,
                8,
                8,
            ),
        ),
        (
            "unknown_dtype",
            craft(&format!("{{{}}}", t("a", "F33", "[2]", 0, 8)), 8, 8),
        ),
        (
            "invalid_shape",
            craft(&format!("{{{}}}", t("a", "F32", "[-2]", 0, 8)), 8, 8),
        ),
        (
            "invalid_offsets",
            craft(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}}"#,
                8,
                8,
            ),
        ),
        (
            "reversed_offsets",
            craft(&format!("{{{a},{}}}", t("b", "F32", "[2]", 8, 4)), 8, 8),
        ),
        (
            "overlapping_offsets",
            craft(&format!("{{{a},{}}}", t("b", "F32", "[2]", 4, 12)), 12, 8),
        ),
        (
            "bytes_outside_tensors",
            craft(&format!("{{{a},{}}}", t("b", "F32", "[2]", 12, 20)), 20, 8),
        ),
        ("bytes_outside_tensors", craft(&format!("{{{a}}}"), 12, 8)),
        (
            "size_overflow",
            craft(
                &format!("{{{}}}", t("a", "U8", "[9223372036854775808,4]", 0, 8)),
                8,
                8,
            ),
        ),
        (
            "size_not_byte_aligned",
            craft(&format!("{{{}}}", t("a", "F4", "[3]", 0, 2)), 2, 8),
        ),
        (
            "offsets_shape_mismatch",
            craft(&format!("{{{}}}", t("a", "F32", "[3]", 0, 8)), 8, 8),
        ),
        ("data_past_end", craft(&format!("{{{a}}}"), 4, 8)),
        (
            "ghost_tensor",
            craft(
                &format!("{{{a},{}}}", t("empty", "F16", "[0,4096]", 8, 8)),
                8,
                8,
            ),
        ),
        (
            "metadata_malformed",
            craft(
                &format!(r#"{{"__metadata__":{{"ss_steps":"many"}},{a}}}"#),
                8,
                8,
            ),
        ),
        (
            "metadata_spoofed",
            craft(
                &format!(r#"{{"__metadata__":{{"Format":"pt"}},{a}}}"#),
                8,
                8,
            ),
        ),
        (
            "metadata_unlisted_keys",
            craft(
                &format!(r#"{{"__metadata__":{{"payload":"x"}},{a}}}"#),
                8,
                8,
            ),
        ),
        (
            "integer_float_weights",
            craft(
                &format!("{{{}}}", t("layer.0.weight", "U8", "[8]", 0, 8)),
                8,
                8,
            ),
        ),
        (
            "unusual_tensor_name",
            craft(&format!("{{{}}}", t("a b", "F32", "[2]", 0, 8)), 8, 8),
        ),
        // A 54-byte header, unpadded: the data starts at byte 62, not a multiple of 4.
        ("misaligned_tensor", craft(&format!("{{{a}}}"), 8, 1)),
    ]
}

#[test]
fn each_crafted_file_gives_exactly_its_flag() {
    for (code, bytes) in corpus() {
        let r = report(&bytes);
        assert_eq!(codes(&r), [code], "{code}: {:#?}", r.flags);
        let f = &r.flags[0];
        assert_eq!(f.level, f.code.level());
        assert!(!f.message.is_empty());
    }
}

#[test]
fn header_flags_of_a_valid_file_equal_its_report_flags() {
    let json = format!(
        r#"{{"__metadata__":{{"Format":"pt","x":"1"}},{},{},{},{}}}"#,
        t("z.weight", "I8", "[4]", 12, 16),
        t("a b", "F32", "[2]", 0, 8),
        t("ghost", "F16", "[0]", 8, 8),
        t("m", "F32", "[1]", 8, 12)
    );
    let mut checked = 0;
    for (_, bytes) in corpus().into_iter().chain([("", craft(&json, 16, 1))]) {
        let Ok(h) = header::parse_file_bytes(&bytes) else {
            continue;
        };
        assert_eq!(header_flags(&h), report(&bytes).flags);
        checked += 1;
    }
    // The seven warning and info files of the corpus, and the one above.
    assert_eq!(checked, 8);
    // Data order: `a b` (at 0), `ghost` (8), `m` (8, misaligned info comes last), `z.weight`.
    let r = report(&craft(&json, 16, 1));
    let got: Vec<(&str, Option<&str>)> = r
        .flags
        .iter()
        .map(|f| (f.code.code(), f.tensor.as_deref()))
        .collect();
    assert_eq!(
        got,
        [
            ("unusual_tensor_name", Some("a b")),
            ("ghost_tensor", Some("ghost")),
            ("integer_float_weights", Some("z.weight")),
            ("misaligned_tensor", Some("a b")),
            ("metadata_spoofed", None),
            ("metadata_unlisted_keys", None),
        ]
    );
}

#[test]
fn every_file_level_code_is_in_the_corpus_or_tested_apart() {
    let corpus: Vec<&str> = corpus().iter().map(|(c, _)| *c).collect();
    let apart = ["huge_tensor", "unreadable"];
    for code in FlagCode::ALL {
        let c = code.code();
        if !c.starts_with("index_") && c != "shard_missing" {
            assert!(
                corpus.contains(&c) || apart.contains(&c),
                "no crafted file for {c}"
            );
        }
    }
}

#[test]
fn messages_name_the_tensor_and_the_numbers() {
    let find = |code: &str| {
        let (_, bytes) = corpus().into_iter().find(|(c, _)| *c == code).unwrap();
        report(&bytes).flags.remove(0)
    };
    let f = find("overlapping_offsets");
    assert_eq!(f.tensor.as_deref(), Some("b"));
    assert!(
        f.message.contains("[4, 12]") && f.message.contains("`a` at [0, 8]"),
        "{}",
        f.message
    );
    let f = find("data_past_end");
    assert_eq!(f.tensor.as_deref(), Some("a"));
    assert!(f.message.contains("past the end of the"), "{}", f.message);
    let f = find("offsets_shape_mismatch");
    assert!(
        f.message.contains("`a`") && f.message.contains("12 bytes"),
        "{}",
        f.message
    );
    let f = find("ghost_tensor");
    assert_eq!(f.tensor.as_deref(), Some("empty"));
    assert!(f.message.contains("[0, 4096]"), "{}", f.message);
    let f = find("integer_float_weights");
    assert!(f.message.contains("U8"), "{}", f.message);
    let f = find("unknown_dtype");
    assert!(f.message.contains("F33"), "{}", f.message);
    let f = find("misaligned_tensor");
    assert!(f.message.contains("byte 62"), "{}", f.message);
}

#[test]
fn clean_files_give_no_flag_and_full_numbers() {
    let dir = tmp("clean");
    let path = dir.join("m.safetensors");
    let w: Vec<u8> = (0..24u8).collect();
    let b: Vec<u8> = (0..6u8).map(|i| 200 - i).collect();
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    write_file(
        &path,
        Some(&meta),
        &[
            (entry("layer.weight", Dtype::F32, &[2, 3]), &w[..]),
            (entry("layer.bias", Dtype::F16, &[3]), &b[..]),
        ],
    )
    .unwrap();
    let r = report_file(&path, ReportOptions { hash: true });
    assert!(r.flags.is_empty(), "{:?}", r.flags);
    assert_eq!(r.verdict, Verdict::Clean);
    assert_eq!(r.tensor_count, 2);
    assert_eq!(r.parameter_count, 9);
    assert_eq!(
        r.bytes_per_dtype,
        BTreeMap::from([("F16".into(), 6), ("F32".into(), 24)])
    );
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(r.file_size, bytes.len() as u64);
    assert_eq!(
        r.sha256.as_deref(),
        Some(hash::hex(&Sha256::digest(&bytes)).as_str())
    );
    let weight = r.tensors.iter().find(|t| t.name == "layer.weight").unwrap();
    assert_eq!(
        weight.sha256.as_deref(),
        Some(hash::hex(&Sha256::digest(&w)).as_str())
    );
    assert_eq!(weight.data_start % 8, 0);
    assert_eq!(weight.aligned_to, alignment(weight.data_start));
    let bias = r.tensors.iter().find(|t| t.name == "layer.bias").unwrap();
    assert_eq!(
        bias.sha256.as_deref(),
        Some(hash::hex(&Sha256::digest(&b)).as_str())
    );
    assert_eq!(r.model_info.format.as_deref(), Some("pt"));
    // Without hashing: the same report, no digests.
    let n = report_file(&path, ReportOptions { hash: false });
    assert_eq!(n.sha256, None);
    assert!(n.tensors.iter().all(|t| t.sha256.is_none()));
    assert_eq!(n.flags, r.flags);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_file_with_several_problems_gets_each_flag() {
    let json = format!(
        "{{{},{},{}}}",
        t("a", "F32", "[2]", 0, 8),
        t("b c", "X9", "[2]", 4, 12),
        t("w.weight", "I8", "[4]", 12, 16)
    );
    let r = report(&craft(&json, 16, 8));
    assert_eq!(
        codes(&r),
        [
            "unknown_dtype",
            "overlapping_offsets",
            "integer_float_weights"
        ]
    );
    // The tensor with an unknown dtype is still listed, with its dtype text.
    let b = r.tensors.iter().find(|t| t.name == "b c").unwrap();
    assert_eq!(b.dtype.as_deref(), Some("X9"));
}

#[test]
fn huge_tensor_is_flagged_from_the_header() {
    let json = format!("{{{}}}", t("big", "U8", "[2147483649]", 0, 2_147_483_649));
    let bytes = craft(&json, 0, 8);
    let file_len = bytes.len() as u64 + 2_147_483_649;
    let r = analyze("mem", file_len, &bytes[..8], |_| Ok(bytes[8..].to_vec()));
    assert_eq!(codes(&r), ["huge_tensor"]);
    assert!(r.flags[0].message.contains("2147483649 bytes"));
    // Exactly 2 GiB is not huge.
    let json = format!("{{{}}}", t("big", "U8", "[2147483648]", 0, 2_147_483_648));
    let bytes = craft(&json, 0, 8);
    let file_len = bytes.len() as u64 + 2_147_483_648;
    let r = analyze("mem", file_len, &bytes[..8], |_| Ok(bytes[8..].to_vec()));
    assert!(r.flags.is_empty(), "{:?}", r.flags);
}

#[test]
fn a_tensor_imitating_the_metadata_key_is_spoofed_metadata() {
    let json = format!("{{{}}}", t("__METADATA__", "U8", "[0]", 0, 0));
    let r = report(&craft(&json, 0, 8));
    assert_eq!(codes(&r), ["ghost_tensor", "metadata_spoofed"]);
}

#[test]
fn unusual_names() {
    for ok in [
        "model.layers.0.self_attn.q_proj.weight",
        "dense/kernel:0",
        "user42__emb",
        "层.权重",
    ] {
        assert_eq!(unusual_name(ok), None, "{ok}");
    }
    for bad in ["", "a b", "a..b", ".a", "a.", "a\u{200B}b", "a\tb", "x;rm"] {
        assert!(unusual_name(bad).is_some(), "{bad:?}");
    }
}

#[test]
fn unreadable_files_are_reported_not_failed() {
    let r = report_file(
        Path::new("/nonexistent/x.safetensors"),
        ReportOptions { hash: true },
    );
    assert_eq!(codes(&r), ["unreadable"]);
    assert!(r.flags[0].message.contains("/nonexistent/x.safetensors"));
    assert_eq!(r.verdict, Verdict::Invalid);
}

#[test]
fn files_in_parallel_come_back_in_order() {
    let dir = tmp("parallel");
    let mut paths = Vec::new();
    for i in 0..7u8 {
        let p = dir.join(format!("{i}.safetensors"));
        let data = vec![i; 4 * (usize::from(i) + 1)];
        write_file(
            &p,
            None,
            &[(entry("x", Dtype::F32, &[u64::from(i) + 1]), &data[..])],
        )
        .unwrap();
        paths.push(p);
    }
    let counts = crate::progress::Counts::default();
    let reports = report_files(&paths, ReportOptions { hash: true }, 3, &counts);
    // the observer: 7 files, their bytes on disk, each advanced once, started and finished once
    let on_disk: u64 = paths
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert_eq!(counts.totals_and_done(), (7, on_disk, 7, on_disk));
    assert_eq!(counts.calls(), (1, 7, 1));
    for (i, (r, p)) in reports.iter().zip(&paths).enumerate() {
        assert_eq!(r.path, p.display().to_string());
        assert_eq!(r.parameter_count, i as u64 + 1);
        let bytes = std::fs::read(p).unwrap();
        assert_eq!(
            r.sha256.as_deref(),
            Some(hash::hex(&Sha256::digest(&bytes)).as_str())
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sharded_checkpoint_with_a_missing_and_an_extra_tensor() {
    let dir = tmp("sharded");
    let four = [0u8; 4];
    write_file(
        dir.join("model-00001-of-00002.safetensors"),
        None,
        &[
            (entry("a", Dtype::F32, &[1]), &four[..]),
            (entry("extra", Dtype::F32, &[1]), &four[..]),
        ],
    )
    .unwrap();
    write_file(
        dir.join("model-00002-of-00002.safetensors"),
        None,
        &[(entry("b", Dtype::F32, &[1]), &four[..])],
    )
    .unwrap();
    let index = dir.join("model.safetensors.index.json");
    std::fs::write(
        &index,
        r#"{"metadata": {"total_size": 12}, "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
            "missing": "model-00002-of-00002.safetensors"}}"#,
    )
    .unwrap();
    assert!(sharded::is_index(&index));
    let parsed = read_index(&index);
    let shards = sharded::shard_paths(&index, parsed.as_ref().unwrap());
    assert_eq!(shards.len(), 2);
    let reports = report_files(
        &shards,
        ReportOptions { hash: false },
        2,
        &crate::progress::NoProgress,
    );
    let lookup = |p: &Path| reports.iter().find(|r| Path::new(&r.path) == p);
    let m = model_report(&index, &parsed, lookup);
    let got: Vec<(&str, Option<&str>)> = m
        .flags
        .iter()
        .map(|f| (f.code.code(), f.tensor.as_deref()))
        .collect();
    assert_eq!(
        got,
        [
            ("index_tensor_extra", Some("extra")),
            ("index_tensor_missing", Some("missing")),
        ]
    );
    assert_eq!(m.verdict, Verdict::Invalid);
    assert_eq!(m.tensor_count, 3);
    assert_eq!(m.parameter_count, 3);
    assert_eq!(m.data_bytes, 12);
    assert_eq!(m.declared_total_size, Some(12));

    // Consistent: the right map, the right total → clean.
    std::fs::write(
        &index,
        r#"{"metadata": {"total_size": 12}, "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "extra": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors"}}"#,
    )
    .unwrap();
    let m = model_report(&index, &read_index(&index), lookup);
    assert!(m.flags.is_empty(), "{:?}", m.flags);
    assert_eq!(m.verdict, Verdict::Clean);

    // A missing shard, a wrong total (not judged while a shard is missing), a bad index.
    std::fs::write(
        &index,
        r#"{"metadata": {"total_size": 99}, "weight_map": {"a": "model-00001-of-00002.safetensors", "extra": "model-00001-of-00002.safetensors", "z": "gone.safetensors"}}"#,
    )
    .unwrap();
    let m = model_report(&index, &read_index(&index), lookup);
    let got: Vec<&str> = m.flags.iter().map(|f| f.code.code()).collect();
    assert_eq!(got, ["shard_missing"]);
    std::fs::write(&index, r#"{"metadata": {"total_size": 99}, "weight_map": {"a": "model-00001-of-00002.safetensors", "extra": "model-00001-of-00002.safetensors"}}"#).unwrap();
    let m = model_report(&index, &read_index(&index), lookup);
    let got: Vec<&str> = m.flags.iter().map(|f| f.code.code()).collect();
    assert_eq!(got, ["index_total_size_mismatch"]);
    // Several bad entries: a flag for each, naming its tensor; the good entries are still checked.
    std::fs::write(
        &index,
        r#"{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "../x.safetensors",
            "extra": "/abs/y.safetensors", "q": 3, "r": "sub/z.safetensors"}}"#,
    )
    .unwrap();
    let m = model_report(&index, &read_index(&index), lookup);
    let got: Vec<(&str, Option<&str>)> = m
        .flags
        .iter()
        .map(|f| (f.code.code(), f.tensor.as_deref()))
        .collect();
    assert_eq!(
        got,
        [
            ("index_invalid", Some("b")),
            ("index_invalid", Some("extra")),
            ("index_invalid", Some("q")),
            ("index_invalid", Some("r")),
        ]
    );
    assert!(
        m.flags[0].message.contains("../x.safetensors"),
        "{}",
        m.flags[0].message
    );
    assert_eq!(m.verdict, Verdict::Invalid);
    assert_eq!(m.shards, ["model-00001-of-00002.safetensors"]);
    for bad in [r#"{"weight_map": {"a": "../x.safetensors"}}"#, "[]", "{"] {
        std::fs::write(&index, bad).unwrap();
        let m = model_report(&index, &read_index(&index), lookup);
        let got: Vec<&str> = m.flags.iter().map(|f| f.code.code()).collect();
        assert_eq!(got, ["index_invalid"], "{bad}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn entry(name: &str, dtype: Dtype, shape: &[u64]) -> TensorEntry {
    TensorEntry {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
    }
}

fn tmp(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("st-forensics-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
