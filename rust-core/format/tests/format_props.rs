//! Property tests of the format core: random files round-trip; random damage never panics.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use safetensors_spark_format::dtype::DTYPES;
use safetensors_spark_format::file::{serialize, write_file, SafetensorsFile};
use safetensors_spark_format::header::{check_paths_agree, parse_file_bytes, TensorEntry};
use safetensors_spark_format::{Dtype, FormatError};
use std::collections::BTreeMap;

/// A random tensor of any of the 22 dtypes, with a shape whose size is valid for sub-byte types.
fn tensor() -> impl Strategy<Value = (TensorEntry, Vec<u8>)> {
    (
        0..DTYPES.len(),
        prop::collection::vec(0u64..5, 0..4),
        "[a-zA-Z0-9_.é]{0,12}",
    )
        .prop_flat_map(|(d, mut shape, name)| {
            let dtype = DTYPES[d].dtype;
            // Make sub-byte element counts end on a byte boundary.
            if !dtype.bits().is_multiple_of(8) {
                shape.push(8 / gcd(8, dtype.bits() as u64));
            }
            let elements: u64 = shape.iter().product();
            let len = dtype.checked_byte_len(elements).unwrap() as usize;
            prop::collection::vec(any::<u8>(), len).prop_map(move |data| {
                (
                    TensorEntry {
                        name: name.clone(),
                        dtype,
                        shape: shape.clone(),
                    },
                    data,
                )
            })
        })
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn unique(tensors: Vec<(TensorEntry, Vec<u8>)>) -> Vec<(TensorEntry, Vec<u8>)> {
    let mut seen = std::collections::HashSet::new();
    tensors
        .into_iter()
        .filter(|(e, _)| seen.insert(e.name.clone()))
        .collect()
}

/// The fast and detailed header parsers agree on a file: the same header, or the fast path
/// refuses exactly when the detailed one errs; `parse_header` gives the detailed result.
fn paths_agree(bytes: &[u8]) -> Result<(), TestCaseError> {
    check_paths_agree(bytes).map_err(TestCaseError::fail)
}

/// One damage to a tensor entry of an otherwise valid header, or none.
#[derive(Debug, Clone)]
enum Damage {
    None,
    /// A field's value replaced (0 dtype, 1 shape, 2 data_offsets).
    Value(usize, &'static str),
    /// A field left out.
    Missing(usize),
    /// A field given twice, or an unknown one added (by name, maybe escaped).
    Extra(&'static str),
    /// The entry replaced by another JSON value.
    NotObject(&'static str),
    /// The name of the entry before it (a duplicate), or an escaped spelling of it.
    SameName(bool),
}

fn damage() -> impl Strategy<Value = Damage> {
    let bad = prop::sample::select(vec![
        "\"u8\"",
        "\"\\u0055\\u0038\"",
        "\"F4\"",
        "\"I16\"",
        "null",
        "1",
        "-1",
        "[-0]",
        "[1.0]",
        "[1e0]",
        "[0,1,2]",
        "[0]",
        "[]",
        "{}",
        "[\"1\"]",
        "[18446744073709551616]",
        "true",
        "[[]]",
        "[0,0]",
        "[1,1]",
        "[2]",
        "[0,3]",
    ]);
    prop_oneof![
        40 => Just(Damage::None),
        3 => (0usize..3, bad).prop_map(|(f, v)| Damage::Value(f, v)),
        1 => (0usize..3).prop_map(Damage::Missing),
        1 => prop::sample::select(vec!["dtype", "shape", "data_offsets", "extra", "d\\u0074ype"]).prop_map(Damage::Extra),
        1 => prop::sample::select(vec!["null", "[]", "1", "\"x\"", "[\"U8\",[1],[0,1]]"]).prop_map(Damage::NotObject),
        1 => any::<bool>().prop_map(Damage::SameName),
    ]
}

/// A header JSON text and its data length: entries of U8 tensors of 0–2 bytes, contiguous, in
/// any JSON order and field order, `__metadata__` in one of its forms (mostly valid) or absent;
/// each entry possibly damaged once ([`Damage`]), the data section possibly one byte off. About a
/// third of them are valid.
fn header_json() -> impl Strategy<Value = (String, usize)> {
    let entry = (0u64..3, 0usize..6, damage());
    let metadata = prop::sample::select(vec![
        "",
        "",
        "",
        "null",
        "{}",
        "{\"k\":\"v\"}",
        "{\"k\":\"v\",\"k\":\"w\"}",
        "{\"k\":1}",
        "\"x\"",
        "[]",
    ]);
    (
        prop::collection::vec(entry, 0..6),
        metadata,
        any::<prop::sample::Index>(),
        prop::sample::select(vec![0i64, 0, 0, 0, 0, 0, 0, 0, 1, -1]),
    )
        .prop_map(|(entries, metadata, at, delta)| {
            let mut parts = Vec::new();
            let mut cursor = 0u64;
            for (i, (len, order, damage)) in entries.iter().enumerate() {
                let mut fields = vec![
                    format!("\"dtype\":\"U8\""),
                    format!("\"shape\":[{len}]"),
                    format!("\"data_offsets\":[{cursor},{}]", cursor + len),
                ];
                cursor += len;
                let mut name = format!("t{i}");
                let mut value = None;
                match damage {
                    Damage::None => {}
                    Damage::Value(f, v) => {
                        let key = ["dtype", "shape", "data_offsets"][*f];
                        fields[*f] = format!("\"{key}\":{v}");
                    }
                    Damage::Missing(f) => {
                        fields.remove(*f);
                    }
                    Damage::Extra(k) => fields.push(format!("\"{k}\":\"U8\"")),
                    Damage::NotObject(v) => value = Some(v.to_string()),
                    Damage::SameName(escaped) if i > 0 => {
                        name = format!("{}{}", if *escaped { "\\u0074" } else { "t" }, i - 1);
                    }
                    Damage::SameName(_) => {}
                }
                fields.rotate_left(order % 3);
                if *order >= 3 {
                    fields.reverse();
                }
                let value = value.unwrap_or_else(|| format!("{{{}}}", fields.join(",")));
                parts.push(format!("\"{name}\":{value}"));
            }
            if !metadata.is_empty() {
                let at = at.index(parts.len() + 1);
                parts.insert(at, format!("\"__metadata__\":{metadata}"));
            }
            let data = (cursor as i64 + delta).max(0) as usize;
            (format!("{{{}}}", parts.join(",")), data)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn fast_and_detailed_parsers_agree_on_generated_headers(
        (json, data_len) in header_json(),
    ) {
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(json.as_bytes());
        bytes.resize(bytes.len() + data_len, 0);
        paths_agree(&bytes)?;
    }

    #[test]
    fn random_files_round_trip(
        tensors in prop::collection::vec(tensor(), 0..8).prop_map(unique),
        meta in prop::option::of(prop::collection::btree_map("[a-z\t\"]{0,6}", "[ -~\u{2028}]{0,10}", 0..4)),
    ) {
        let refs: Vec<(TensorEntry, &[u8])> = tensors.iter().map(|(e, d)| (e.clone(), d.as_slice())).collect();
        let bytes = serialize(meta.as_ref(), &refs).unwrap();
        let header = parse_file_bytes(&bytes).unwrap();
        paths_agree(&bytes)?;
        prop_assert_eq!(header.header_len % 8, 0);
        prop_assert_eq!(&header.metadata, &meta);
        prop_assert_eq!(header.tensors.len(), tensors.len());
        for (entry, data) in &tensors {
            let t = header.tensor(&entry.name).unwrap();
            prop_assert_eq!(t.dtype, entry.dtype);
            prop_assert_eq!(&t.shape, &entry.shape);
            let start = (header.data_start() + t.data_offsets[0]) as usize;
            prop_assert_eq!(&bytes[start..start + data.len()], data.as_slice());
        }
    }

    #[test]
    fn damaged_files_never_panic(
        tensors in prop::collection::vec(tensor(), 1..5).prop_map(unique),
        cut in any::<prop::sample::Index>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        truncate in any::<bool>(),
    ) {
        let refs: Vec<(TensorEntry, &[u8])> = tensors.iter().map(|(e, d)| (e.clone(), d.as_slice())).collect();
        let mut bytes = serialize(None, &refs).unwrap();
        for (at, value) in flips {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        paths_agree(&bytes)?;
        match parse_file_bytes(&bytes) {
            Ok(header) => {
                // Whatever was accepted is self-consistent: every tensor lies inside the file.
                prop_assert_eq!(header.file_len(), bytes.len() as u64);
                for t in &header.tensors {
                    prop_assert!(header.data_start() + t.data_offsets[1] <= bytes.len() as u64);
                }
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}

#[test]
fn every_dtype_round_trips_through_a_mapped_file() {
    let dir = std::env::temp_dir().join(format!("st-props-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("all.safetensors");
    let tensors: Vec<(TensorEntry, Vec<u8>)> = DTYPES
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let shape = if d.bits.is_multiple_of(8) {
                vec![2, 3]
            } else {
                vec![2, 4]
            };
            let n = d.dtype.checked_byte_len(shape.iter().product()).unwrap() as usize;
            let data = (0..n).map(|j| (i * 31 + j) as u8).collect();
            (
                TensorEntry {
                    name: d.name.to_lowercase(),
                    dtype: d.dtype,
                    shape,
                },
                data,
            )
        })
        .chain([
            (
                TensorEntry {
                    name: "scalar".into(),
                    dtype: Dtype::F64,
                    shape: vec![],
                },
                1.5f64.to_le_bytes().to_vec(),
            ),
            (
                TensorEntry {
                    name: "zero".into(),
                    dtype: Dtype::F32,
                    shape: vec![2, 0],
                },
                vec![],
            ),
        ])
        .collect();
    let refs: Vec<(TensorEntry, &[u8])> = tensors
        .iter()
        .map(|(e, d)| (e.clone(), d.as_slice()))
        .collect();
    let meta = BTreeMap::from([("framework".to_string(), "pt".to_string())]);
    write_file(&path, Some(&meta), &refs).unwrap();
    let file = SafetensorsFile::open(&path).unwrap();
    for (entry, data) in &tensors {
        let (info, bytes) = file.tensor(&entry.name).unwrap();
        assert_eq!(info.dtype, entry.dtype);
        assert_eq!(bytes, data.as_slice());
    }
    assert!(matches!(
        file.tensor("missing"),
        Err(FormatError::TensorNotFound { .. })
    ));
    std::fs::remove_dir_all(dir).unwrap();
}
