//! Property tests of the format core: random files round-trip; random damage never panics.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use safetensors_spark::dtype::DTYPES;
use safetensors_spark::file::{serialize, write_file, SafetensorsFile};
use safetensors_spark::header::{parse_file_bytes, TensorEntry};
use safetensors_spark::{Dtype, FormatError};
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_files_round_trip(
        tensors in prop::collection::vec(tensor(), 0..8).prop_map(unique),
        meta in prop::option::of(prop::collection::btree_map("[a-z\t\"]{0,6}", "[ -~\u{2028}]{0,10}", 0..4)),
    ) {
        let refs: Vec<(TensorEntry, &[u8])> = tensors.iter().map(|(e, d)| (e.clone(), d.as_slice())).collect();
        let bytes = serialize(meta.as_ref(), &refs).unwrap();
        let header = parse_file_bytes(&bytes).unwrap();
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
