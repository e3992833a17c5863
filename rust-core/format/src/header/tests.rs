#![allow(clippy::unwrap_used)]

use super::*;

#[test]
fn lengths_agree_with_the_writer() {
    let names = [
        "",
        "k123",
        "a\"b",
        "back\\slash",
        "tab\tnew\nline",
        "\u{1}\u{1f}",
        "del\u{7f}",
        "é/ключ/🙂",
        "__",
    ];
    for s in names {
        let mut out = Vec::new();
        push_json_string(&mut out, s);
        assert_eq!(json_string_len(s), out.len() as u64, "{s:?}");
        assert_eq!(json_string_inner_len(s) + 2, out.len() as u64, "{s:?}");
        let expected = serde_json::to_string(s).map(|j| j.len() as u64 - 2);
        assert_eq!(
            Ok(json_string_inner_len(s)),
            expected.map_err(|_| ()),
            "{s:?}"
        );
    }
    for x in [0, 9, 10, 99, 100, 12_345, u64::MAX] {
        assert_eq!(decimal_len(x), x.to_string().len() as u64, "{x}");
    }
    let shapes: [&[u64]; 4] = [&[], &[0], &[3, 10, 1_000_000], &[u64::MAX, 7]];
    let mut scratch = Vec::new();
    for dtype in [Dtype::Bool, Dtype::F32, Dtype::F8E4M3] {
        for shape in shapes {
            for (parts, offsets) in [
                (["a", "", ""], [0, 0]),
                (["key\"1", "/", "col\\x"], [7, 123_456]),
                (["é", "::", "🙂"], [99, u64::MAX]),
            ] {
                let mut out = Vec::new();
                let entry = HeaderEntry {
                    name: parts,
                    dtype,
                    shape,
                    data_offsets: offsets,
                };
                push_entry(&mut out, &mut scratch, &entry);
                let name = json_string_len(&parts.concat());
                let inner: u64 = parts.iter().map(|p| json_string_inner_len(p)).sum();
                assert_eq!(name, inner + 2, "{parts:?}");
                let expected = name
                    + entry_len_without_name_and_offsets(dtype, shape)
                    + decimal_len(offsets[0])
                    + decimal_len(offsets[1]);
                assert_eq!(expected, out.len() as u64, "{parts:?} {shape:?}");
            }
        }
    }
    for meta in [
        BTreeMap::new(),
        BTreeMap::from([("a".to_string(), "b\"c".to_string())]),
        BTreeMap::from([
            ("format".to_string(), "pt".to_string()),
            ("ключ\n".to_string(), "🙂\u{1}".to_string()),
        ]),
    ] {
        let mut out = Vec::new();
        push_metadata(&mut out, &meta);
        assert_eq!(metadata_entry_len(&meta), out.len() as u64, "{meta:?}");
    }
}

#[test]
fn streamed_header_spans_many_chunks_and_matches_its_measure() {
    // ~5 × the 64 KiB chunk of write_entries, names escaped and split in three parts.
    let keys: Vec<String> = (0..4000).map(|i| format!("sample\t\"{i:06}\"")).collect();
    let shape = [3u64, 2];
    let meta = BTreeMap::from([("k".to_string(), "v\u{e9}".to_string())]);
    let entries = || {
        keys.iter().enumerate().map(|(i, k)| HeaderEntry {
            name: [k, "/", "pixel_values"],
            dtype: Dtype::F16,
            shape: &shape,
            data_offsets: [i as u64 * 12, (i as u64 + 1) * 12],
        })
    };
    let mut out = Vec::new();
    let n = write_entries(&mut out, Path::new("mem"), Some(&meta), entries).unwrap();
    assert!(n > 5 * (1 << 16));
    assert_eq!(n, out.len() as u64);
    assert_eq!((n - 8) % 8, 0);
    out.resize(out.len() + 4000 * 12, 0);
    let h = parse_file_bytes(&out).unwrap();
    assert_eq!(h.metadata, Some(meta.clone()));
    assert_eq!(h.tensors.len(), 4000);
    for (t, k) in h.tensors.iter().zip(&keys) {
        assert_eq!(t.name, format!("{k}/pixel_values"));
        assert_eq!(t.shape, shape);
    }
    assert_eq!(
        serialize_entries(Some(&meta), 4000, entries).unwrap(),
        out[..n as usize]
    );
    // Entries that change between the two passes are an error, not a corrupt header.
    let calls = std::cell::Cell::new(0);
    let err = write_entries(&mut Vec::new(), Path::new("mem"), None, || {
        calls.set(calls.get() + 1);
        let long = calls.get() > 1;
        keys.iter()
            .take(if long { 3 } else { 2 })
            .map(|k| HeaderEntry {
                name: [k, "", ""],
                dtype: Dtype::F16,
                shape: &shape,
                data_offsets: [0, 12],
            })
    })
    .unwrap_err();
    assert!(
        err.to_string().contains("changed between its two passes"),
        "{err}"
    );
}

/// Builds a file from a header JSON text (unpadded) and a data section, and checks that the
/// fast and detailed parsers agree on it (so every case of these tests is also an agreement
/// case).
fn file(json: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json.as_bytes());
    out.extend_from_slice(data);
    assert_paths_agree(&out);
    out
}

fn err(json: &str, data: &[u8]) -> FormatError {
    parse_file_bytes(&file(json, data)).unwrap_err()
}

fn entry(name: &str, dtype: Dtype, shape: &[u64]) -> TensorEntry {
    TensorEntry {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
    }
}

#[test]
fn fast_and_detailed_paths_agree_on_edge_cases() {
    let u8_at = |b: u64| {
        format!(
            r#"{{"dtype":"U8","shape":[1],"data_offsets":[{b},{}]}}"#,
            b + 1
        )
    };
    let (a0, a1, a2) = (u8_at(0), u8_at(1), u8_at(2));
    let cases: Vec<(String, usize)> = vec![
        // Valid: JSON order unlike data order, escapes, whitespace, zero-size tensors.
        (format!(r#"{{"b":{a1},"a":{a0}}}"#), 2),
        (format!(r#"{{"\u0061\n":{a0},"\u00e9":{a1}}}"#), 2),
        (format!(" {{ \"a\" : {a0} , \"__metadata__\" : {{ \"k\" : \"\\u2028\" }} }}\t\n"), 1),
        (r#"{"z":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},"y":{"dtype":"BOOL","shape":[],"data_offsets":[0,1]}}"#.into(), 1),
        (r#"{"a":{"data_offsets":[0,4],"shape":[2],"dtype":"F16"}}"#.into(), 4),
        (r#"{"__metadata__":null}"#.into(), 0),
        // Duplicates: spelled alike or through escapes, adjacent or not, with an offsets error
        // after them (the duplicate is reported first).
        (format!(r#"{{"a":{a0},"b":{a1},"a":{a2}}}"#), 3),
        (format!(r#"{{"a":{a0},"\u0061":{a1}}}"#), 2),
        (format!(r#"{{"a":{a0},"b":{a2},"a":{a0}}}"#), 3),
        (r#"{"__metadata__":null,"__metadata__":null}"#.into(), 0),
        (r#"{"__metadata__":{"k":"1","\u006b":"1"}}"#.into(), 0),
        (r#"{"a":{"dtype":"U8","shape":[1],"d\u0074ype":"U8","data_offsets":[0,1]}}"#.into(), 1),
        (r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"shape":[1]}}"#.into(), 1),
        // Numbers the fast path must refuse as the detailed path does.
        (r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[-0,1]}}"#.into(), 1),
        (r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1e0]}}"#.into(), 1),
        (r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,18446744073709551616]}}"#.into(), 1),
        (r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,[[[[]]]]]}}"#.into(), 1),
        (r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}}"#.into(), 1),
        (r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[]}}"#.into(), 1),
        (r#"{"a":{"dtype":"U8","shape":[true],"data_offsets":[0,1]}}"#.into(), 1),
        (r#"{"a":{"dtype":"U8","shape":{},"data_offsets":[0,1]}}"#.into(), 1),
        // Entries and metadata of the wrong kind; an unknown field holding deep nesting.
        (r#"{"a":["U8",[1],[0,1]]}"#.into(), 1),
        (r#"{"a":null}"#.into(), 0),
        (r#"{"a":{}}"#.into(), 0),
        (r#"{"__metadata__":[]}"#.into(), 0),
        (r#"{"__metadata__":{"k":null}}"#.into(), 0),
        (format!(r#"{{"a":{{"dtype":"U8","x":{}{}}}}}"#, "[".repeat(300), "]".repeat(300)), 1),
        (r#"{"a":{"dtype":"U8 ","shape":[1],"data_offsets":[0,1]}}"#.into(), 1),
        (r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}} x"#.into(), 1),
        ("[]".into(), 0),
        ("".into(), 0),
    ];
    for (json, data) in &cases {
        file(json, &vec![0; *data]);
        // And with a data section one byte off (rule 14 after everything else).
        file(json, &vec![0; data + 1]);
    }
    let mut bad_utf8 = file(&format!(r#"{{"a\u0001":{a0}}}"#), &[0]);
    let at = bad_utf8.iter().position(|b| *b == b'a').unwrap();
    bad_utf8[at] = 0xff;
    assert_paths_agree(&bad_utf8);
}

#[test]
fn tensor_lookup_by_name_finds_every_tensor_whatever_the_data_order() {
    // JSON order, name order and data order all differ.
    let json = r#"{"m":{"dtype":"U8","shape":[1],"data_offsets":[2,3]},"z":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
    let h = parse_file_bytes(&file(json, &[0, 1, 2])).unwrap();
    let names: Vec<&str> = h.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["z", "a", "m"]);
    for (name, start) in [("a", 1), ("m", 2), ("z", 0)] {
        assert_eq!(h.tensor(name).map(|t| t.data_offsets[0]), Some(start));
    }
    assert!(h.tensor("b").is_none() && h.tensor("").is_none() && h.tensor("zz").is_none());
}

#[test]
fn accepts_unpadded_and_whitespace_padded_headers() {
    let h = parse_file_bytes(&file(
        r#"{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}"#,
        &[0; 16],
    ))
    .unwrap();
    assert_eq!(h.tensors[0].shape, vec![2, 2]);
    assert_eq!(h.header_len, 60);
    assert!(parse_file_bytes(&file("{}\r \t\n", &[])).is_ok());
    assert!(parse_file_bytes(&file("\t\n{}\r ", &[])).is_ok());
    assert!(parse_file_bytes(&file(
        r#"{"a":{"dtype":"F32","shape":[2,0],"data_offsets":[0, 0]}}"#,
        &[]
    ))
    .is_ok());
}

#[test]
fn prefix_rules() {
    assert!(matches!(
        parse_file_bytes(&[]),
        Err(FormatError::HeaderTooSmall { file_len: 0 })
    ));
    assert!(matches!(
        parse_file_bytes(&[0; 7]),
        Err(FormatError::HeaderTooSmall { .. })
    ));
    let mut big = (MAX_HEADER_SIZE + 1).to_le_bytes().to_vec();
    big.extend_from_slice(b"{}");
    assert!(matches!(
        parse_file_bytes(&big),
        Err(FormatError::HeaderTooLarge { .. })
    ));
    assert!(matches!(
        parse_file_bytes(&u64::MAX.to_le_bytes()),
        Err(FormatError::HeaderTooLarge { .. })
    ));
    let mut short = 1000u64.to_le_bytes().to_vec();
    short.extend_from_slice(b"{}");
    assert!(matches!(
        parse_file_bytes(&short),
        Err(FormatError::HeaderBeyondFile {
            header_len: 1000,
            file_len: 10
        })
    ));
    let mut zero = 0u64.to_le_bytes().to_vec();
    zero.extend_from_slice(b"");
    assert!(matches!(
        parse_file_bytes(&zero),
        Err(FormatError::InvalidJson { .. })
    ));
}

#[test]
fn header_of_exactly_the_cap_is_accepted() {
    let mut bytes = MAX_HEADER_SIZE.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    bytes.resize(8 + MAX_HEADER_SIZE as usize, b' ');
    assert!(parse_file_bytes(&bytes).is_ok());
}

#[test]
fn json_rules() {
    let mut bad_utf8 = 1u64.to_le_bytes().to_vec();
    bad_utf8.push(0xff);
    assert!(matches!(
        parse_file_bytes(&bad_utf8),
        Err(FormatError::HeaderNotUtf8 { .. })
    ));
    for bad in [
        "{",
        "{}\0\0",
        "{}x",
        "\u{feff}{}",
        "{\"a\":1,}",
        "{} // c",
        "[]",
    ] {
        let e = err(bad, &[]);
        assert!(
            matches!(
                e,
                FormatError::InvalidJson { .. } | FormatError::HeaderNotObject { .. }
            ),
            "{bad:?}: {e}"
        );
    }
    let deep = format!(
        "{{\"__metadata__\":{}{}}}",
        "[".repeat(200),
        "]".repeat(200)
    );
    assert!(matches!(err(&deep, &[]), FormatError::InvalidJson { .. }));
}

#[test]
fn rejects_duplicates_at_every_level() {
    let t = r#"{"dtype":"U8","shape":[1],"data_offsets":[0,1]}"#;
    let e = err(&format!(r#"{{"a":{t},"a":{t}}}"#), &[0]);
    assert!(
        matches!(e, FormatError::DuplicateKey { ref key, .. } if key == "a"),
        "{e}"
    );
    let e = err(
        r#"{"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
        &[0],
    );
    assert!(
        matches!(e, FormatError::DuplicateKey { ref key, .. } if key == "dtype"),
        "{e}"
    );
    let e = err(r#"{"__metadata__":{"k":"1","k":"2"}}"#, &[]);
    assert!(matches!(e, FormatError::DuplicateKey { .. }), "{e}");
    let e = err(r#"{"__metadata__":{},"__metadata__":{}}"#, &[]);
    assert!(matches!(e, FormatError::DuplicateKey { .. }), "{e}");
    // The first entry is bogus and the last valid: the reference keeps the last; we reject.
    let e = err(
        &format!(r#"{{"a":{{"dtype":"U8","shape":[999999999],"data_offsets":[5,7]}},"a":{t}}}"#),
        &[0],
    );
    assert!(matches!(e, FormatError::DuplicateKey { .. }), "{e}");
}

#[test]
fn rejects_lax_entry_forms() {
    let e = err(
        r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":[]}}"#,
        &[0],
    );
    assert!(matches!(e, FormatError::UnknownField { ref field, .. } if field == "extra"));
    let e = err(r#"{"a":["U8",[1],[0,1]]}"#, &[0]);
    assert!(matches!(e, FormatError::TensorNotObject { .. }));
    let e = err(
        r#"{"a":{"dtype":{"U8":null},"shape":[1],"data_offsets":[0,1]}}"#,
        &[0],
    );
    assert!(matches!(e, FormatError::DtypeNotString { .. }));
    let e = err(
        r#"{"a":{"dtype":"u8","shape":[1],"data_offsets":[0,1]}}"#,
        &[0],
    );
    assert!(matches!(e, FormatError::UnknownDtype { .. }));
    let e = err(r#"{"a":{"shape":[1],"data_offsets":[0,1]}}"#, &[0]);
    assert!(matches!(
        e,
        FormatError::MissingField { field: "dtype", .. }
    ));
    for offsets in ["[0]", "[0,1,1]", "{\"0\":1}", "[0,-1]", "[0,1.0]"] {
        let e = err(
            &format!(r#"{{"a":{{"dtype":"U8","shape":[1],"data_offsets":{offsets}}}}}"#),
            &[0],
        );
        assert!(
            matches!(e, FormatError::InvalidOffsets { .. }),
            "{offsets}: {e}"
        );
    }
    for shape in [
        "[2.0]",
        "[2e0]",
        "[-2]",
        "[-0]",
        "[\"2\"]",
        "[null]",
        "[18446744073709551616]",
        "2",
    ] {
        let e = err(
            &format!(r#"{{"a":{{"dtype":"U8","shape":{shape},"data_offsets":[0,2]}}}}"#),
            &[0, 0],
        );
        assert!(
            matches!(e, FormatError::InvalidShape { .. }),
            "{shape}: {e}"
        );
    }
    assert!(matches!(
        err("{\"a\":[]0", &[]),
        FormatError::InvalidJson { .. }
    ));
}

#[test]
fn metadata_rules() {
    let h = parse_file_bytes(&file(r#"{"__metadata__":null}"#, &[])).unwrap();
    assert_eq!(h.metadata, None);
    let h = parse_file_bytes(&file(r#"{"__metadata__":{}}"#, &[])).unwrap();
    assert_eq!(h.metadata, Some(BTreeMap::new()));
    assert!(matches!(
        err(r#"{"__metadata__":{"k":1}}"#, &[]),
        FormatError::MetadataValueNotString { .. }
    ));
    assert!(matches!(
        err(r#"{"__metadata__":{"k":{}}}"#, &[]),
        FormatError::MetadataValueNotString { .. }
    ));
    assert!(matches!(
        err(r#"{"__metadata__":"x"}"#, &[]),
        FormatError::MetadataNotObject { .. }
    ));
    // A "tensor" named __metadata__ is the metadata key and fails as metadata.
    let e = err(
        r#"{"__metadata__":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
        &[0],
    );
    assert!(
        matches!(e, FormatError::MetadataValueNotString { .. }),
        "{e}"
    );
}

#[test]
fn offset_rules() {
    let two = |a: &str, b: &str, data: usize| {
        err(
            &format!(
                r#"{{"a":{{"dtype":"F32","shape":[4],"data_offsets":{a}}},"b":{{"dtype":"F32","shape":[4],"data_offsets":{b}}}}}"#
            ),
            &vec![0; data],
        )
    };
    let e = two("[0,16]", "[32,48]", 48);
    assert!(
        matches!(e, FormatError::OffsetHole { ref name, begin: 32, expected: 16, .. } if name == "b"),
        "{e}"
    );
    let e = two("[0,16]", "[8,24]", 24);
    assert!(
        matches!(e, FormatError::OffsetOverlap { ref name, .. } if name == "b"),
        "{e}"
    );
    let e = two("[0,16]", "[0,16]", 16);
    assert!(matches!(e, FormatError::OffsetOverlap { .. }), "{e}");
    // Reversed offsets: begin is where the previous tensor ends (no hole, no overlap),
    // end lies before it.
    let e = two("[0,16]", "[16,8]", 16);
    assert!(
        matches!(e, FormatError::ReversedOffsets { ref name, begin: 16, end: 8 } if name == "b"),
        "{e}"
    );
    // A lone [4,0]: sorted first, so the gap before 4 is found first.
    let e = err(
        r#"{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}"#,
        &[],
    );
    assert!(
        matches!(
            e,
            FormatError::OffsetHole {
                begin: 4,
                expected: 0,
                ..
            }
        ),
        "{e}"
    );
    let e = err(
        r#"{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}"#,
        &[],
    );
    assert!(matches!(e, FormatError::OffsetHole { .. }), "{e}");
    let e = err(
        r#"{"a":{"dtype":"I32","shape":[2,2],"data_offsets":[0,4]}}"#,
        &[0; 4],
    );
    assert!(
        matches!(
            e,
            FormatError::SizeMismatch {
                expected: 16,
                actual: 4,
                ..
            }
        ),
        "{e}"
    );
    // JSON order differs from offset order: fine.
    let h = parse_file_bytes(&file(
        r#"{"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
        &[7, 9],
    ))
    .unwrap();
    assert_eq!(h.tensors[0].name, "a");
    // Zero-size tensors may share an offset with a real one.
    assert!(parse_file_bytes(&file(
        r#"{"z":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
        &[7],
    ))
    .is_ok());
}

#[test]
fn size_and_coverage_rules() {
    let e = err(
        r#"{"a":{"dtype":"I32","shape":[2,18446744073709551614],"data_offsets":[0,8]}}"#,
        &[0; 8],
    );
    assert!(matches!(e, FormatError::SizeOverflow { .. }), "{e}");
    let e = err(
        r#"{"a":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,18446744073709551615]}}"#,
        &[],
    );
    assert!(matches!(e, FormatError::SizeOverflow { .. }), "{e}");
    // Eight contiguous huge tensors whose end sums near 2^64: the reference panics in debug.
    let n = (1u64 << 61) - 1;
    let mut json = String::from("{");
    for i in 0..8u64 {
        if i > 0 {
            json.push(',');
        }
        json.push_str(&format!(
            r#""t{i}":{{"dtype":"U8","shape":[{n}],"data_offsets":[{},{}]}}"#,
            i * n,
            (i + 1) * n
        ));
    }
    json.push('}');
    assert!(matches!(
        err(&json, &[]),
        FormatError::FileLengthOverflow { .. }
    ));
    let e = err(
        r#"{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}"#,
        &[0],
    );
    assert!(
        matches!(e, FormatError::MisalignedSubByte { elements: 3, .. }),
        "{e}"
    );
    assert!(parse_file_bytes(&file(
        r#"{"a":{"dtype":"F4","shape":[2,3],"data_offsets":[0,3]}}"#,
        &[0; 3]
    ))
    .is_ok());
    assert!(parse_file_bytes(&file(
        r#"{"a":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}}"#,
        &[0; 3]
    ))
    .is_ok());
    let ok = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#;
    let e = err(ok, &[0; 3]);
    assert!(
        matches!(
            e,
            FormatError::FileLengthMismatch {
                data_len: 2,
                file_len: 64,
                ..
            }
        ),
        "{e}"
    );
    assert!(matches!(
        err(ok, &[0; 1]),
        FormatError::FileLengthMismatch { .. }
    ));
    assert!(matches!(
        err("{}", &[0]),
        FormatError::FileLengthMismatch { .. }
    ));
}

#[test]
fn serialisation_matches_reference_vectors() {
    // V3: I32 [2,2] zeros.
    let plan = plan_file(None, vec![entry("test", Dtype::I32, &[2, 2])]).unwrap();
    let mut expected = 64u64.to_le_bytes().to_vec();
    expected
        .extend_from_slice(br#"{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}    "#);
    assert_eq!(plan.header_bytes, expected);
    // V1 and V2.
    assert_eq!(
        plan_file(None, vec![]).unwrap().header_bytes,
        [&8u64.to_le_bytes()[..], b"{}      "].concat()
    );
    let meta = BTreeMap::from([("framework".to_string(), "pt".to_string())]);
    let v2 = plan_file(Some(&meta), vec![]).unwrap().header_bytes;
    assert_eq!(&v2[8..], br#"{"__metadata__":{"framework":"pt"}}     "#);
    // Ordering vector: dtype descending in declaration order, then name.
    let plan = plan_file(
        None,
        vec![
            entry("z", Dtype::U8, &[1]),
            entry("a", Dtype::U8, &[1]),
            entry("B", Dtype::F64, &[1]),
            entry("m", Dtype::F16, &[3]),
            entry("c", Dtype::C64, &[1]),
            entry("b", Dtype::Bool, &[2]),
            entry("i", Dtype::I32, &[1]),
            entry("u", Dtype::U32, &[1]),
            entry("f", Dtype::F32, &[1]),
            entry("I64", Dtype::I64, &[1]),
            entry("U64", Dtype::U64, &[1]),
        ],
    )
    .unwrap();
    let order: Vec<&str> = plan.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        order,
        ["U64", "I64", "B", "c", "f", "u", "i", "m", "a", "z", "b"]
    );
    let starts: Vec<u64> = plan.tensors.iter().map(|t| t.data_offsets[0]).collect();
    assert_eq!(starts, [0, 8, 16, 24, 32, 36, 40, 44, 50, 51, 52]);
    assert_eq!(plan.data_len, 54);
    assert_eq!(plan.header_bytes.len() - 8, 608);
}

#[test]
fn serialisation_escapes_like_serde_json_and_round_trips() {
    let meta = BTreeMap::from([("k\t".to_string(), "\u{2028}".to_string())]);
    let plan = plan_file(Some(&meta), vec![entry("é/\"\\\n\u{1}", Dtype::U8, &[1])]).unwrap();
    let text = std::str::from_utf8(&plan.header_bytes[8..]).unwrap();
    assert!(text.contains(r#""é/\"\\\n\u0001""#), "{text}");
    assert_eq!(plan.header_bytes.len() - 8, 96);
    let mut bytes = plan.header_bytes.clone();
    bytes.push(0);
    let h = parse_file_bytes(&bytes).unwrap();
    assert_eq!(h.metadata, Some(meta));
    assert_eq!(h.tensors, plan.tensors);
}

#[test]
fn writer_rejects_reserved_and_duplicate_names_and_oversize_headers() {
    assert!(matches!(
        plan_file(None, vec![entry("__metadata__", Dtype::U8, &[1])]),
        Err(FormatError::ReservedName)
    ));
    assert!(matches!(
        plan_file(
            None,
            vec![entry("a", Dtype::U8, &[1]), entry("a", Dtype::F32, &[1])]
        ),
        Err(FormatError::DuplicateTensorName { .. })
    ));
    let meta = BTreeMap::from([("k".to_string(), "x".repeat(MAX_HEADER_SIZE as usize))]);
    assert!(matches!(
        plan_file(Some(&meta), vec![]),
        Err(FormatError::HeaderTooLarge { .. })
    ));
    assert!(matches!(
        plan_file(None, vec![entry("a", Dtype::F4, &[3])]),
        Err(FormatError::MisalignedSubByte { .. })
    ));
}
