//! KV shards (spec/dataset.md §3, §6.2) read through a parsed, validated header: splitting tensor
//! names into key and column, and checking an index row against the header it claims to
//! describe. Plain functions over [`Header`] (no arrow, no parquet), so the Python extension,
//! which reads index parts with pyarrow and leaves the `index` feature off, applies the same rules
//! as the engine.

use safetensors_spark_format::header::{Header, TensorInfo};

/// The key column of a KV write or table that names none (spec/dataset.md §5.2): the one column
/// among `string_columns` (the string columns, in order) that is not one of the dataset's
/// `tensor_columns` (string columns are never tensors). Otherwise the error says which columns
/// the dataset holds and which string columns `whose` ("the DataFrame", "the table") has (none,
/// or several); the caller adds the option that settles it (`name_col`).
pub fn find_key_column<'a>(
    string_columns: &[&'a str],
    tensor_columns: &[&str],
    whose: &str,
) -> Result<&'a str, String> {
    let candidates: Vec<&'a str> = string_columns
        .iter()
        .copied()
        .filter(|c| !tensor_columns.contains(c))
        .collect();
    if let [key] = candidates.as_slice() {
        return Ok(key);
    }
    let quoted = |names: &[&str]| {
        let names: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
        names.join(", ")
    };
    Err(format!(
        "the key column is {whose}'s one string column that is not one of the dataset's columns \
         ({}), but {whose} has {}",
        if tensor_columns.is_empty() {
            "none: it has no shards".to_string()
        } else {
            quoted(tensor_columns)
        },
        if candidates.is_empty() {
            "none".to_string()
        } else {
            quoted(&candidates)
        }
    ))
}

/// A column of a KV dataset's schema, as a shard's tensors must hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvColumn {
    pub name: String,
    /// The dtype name the schema gives (`F32`, ...).
    pub dtype: String,
    /// The shape the schema gives, when it gives one.
    pub shape: Option<Vec<u64>>,
}

/// A KV shard's tensors split into key and column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvSplit<'h> {
    /// Per tensor, in the header's tensor order: its key and the position of its column.
    pub tensors: Vec<(&'h str, usize)>,
    /// The number of distinct keys.
    pub keys: usize,
}

/// Splits every tensor name of a KV shard into `(key, column)`: the longest column that ends the
/// name after `separator` (so `a__b__x` with columns `x` and `b__x` is key `a`, column `b__x`).
/// Checks each tensor's dtype (and shape when the schema has one) against its column, and that
/// every key has every column; errors say which tensor or key breaks which rule (the caller
/// names the file). O(n log n) in the tensors, no allocation per key.
pub fn split_kv_header<'h>(
    header: &'h Header,
    columns: &[KvColumn],
    separator: &str,
) -> Result<KvSplit<'h>, String> {
    let mut by_len: Vec<usize> = (0..columns.len()).collect();
    by_len.sort_by_key(|&i| std::cmp::Reverse(columns[i].name.len()));
    let names: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
    let mut tensors = Vec::with_capacity(header.tensors.len());
    for t in &header.tensors {
        let name = t.name.as_str();
        let hit = by_len.iter().find_map(|&i| {
            let key = name
                .strip_suffix(columns[i].name.as_str())?
                .strip_suffix(separator)?;
            Some((key, i))
        });
        let Some((key, i)) = hit else {
            return Err(format!(
                "tensor '{name}' is not <key>{separator}<column> for any column of dataset_manifest.json schema {names:?}"
            ));
        };
        let c = &columns[i];
        if t.dtype.name() != c.dtype {
            return Err(format!(
                "tensor '{name}' has dtype {} but dataset_manifest.json schema says {} for column '{}'",
                t.dtype.name(),
                c.dtype,
                c.name
            ));
        }
        if let Some(want) = &c.shape {
            if &t.shape != want {
                return Err(format!(
                    "tensor '{name}' has shape {:?} but dataset_manifest.json schema says {want:?} for column '{}'",
                    t.shape, c.name
                ));
            }
        }
        tensors.push((key, i));
    }
    // Tensor names are unique, so a key has every column exactly when it has as many tensors as
    // there are columns.
    let mut sorted = tensors.clone();
    sorted.sort_unstable();
    let mut keys = 0;
    for group in sorted.chunk_by(|a, b| a.0 == b.0) {
        keys += 1;
        if group.len() != columns.len() {
            let missing: Vec<&str> = (0..columns.len())
                .filter(|i| !group.iter().any(|(_, c)| c == i))
                .map(|i| names[i])
                .collect();
            return Err(format!(
                "key '{}' has no tensor for column(s) {missing:?}",
                group[0].0
            ));
        }
    }
    Ok(KvSplit { tensors, keys })
}

/// One row of an index part (spec/dataset.md §6.2), as a reader met it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexRowFields<'a> {
    pub tensor_key: &'a str,
    pub dtype: &'a str,
    pub shape: &'a [u64],
    pub data_start: u64,
    pub data_end: u64,
    /// KV: the row's `sample_key` and `column`, which must make up `tensor_key` with the
    /// dataset's separator; `None` for a batch index row.
    pub kv: Option<(&'a str, &'a str)>,
}

/// Checks an index row against the validated header of the shard it names: the header has a
/// tensor `tensor_key` of the same dtype, shape and absolute byte range `[data_start,
/// data_end)`, and a KV row's `sample_key` and `column` make up `tensor_key`. Returns the
/// header's tensor, which readers then read (never the row's range alone), or what disagrees,
/// row against header (the caller names the dataset, the part and the key).
pub fn check_index_row<'h>(
    header: &'h Header,
    entry: &IndexRowFields<'_>,
    separator: &str,
) -> Result<&'h TensorInfo, String> {
    let name = entry.tensor_key;
    if let Some((key, column)) = entry.kv {
        let joined = name
            .strip_suffix(column)
            .and_then(|k| k.strip_suffix(separator));
        if joined != Some(key) {
            return Err(format!(
                "the row for tensor '{name}' has sample_key '{key}' and column '{column}', which make \
                 tensor '{key}{separator}{column}'"
            ));
        }
    }
    let Some(t) = header.tensor(name) else {
        return Err(format!(
            "the index has tensor '{name}' but the shard's header has no such tensor"
        ));
    };
    let start = header.data_start() + t.data_offsets[0];
    let end = header.data_start() + t.data_offsets[1];
    let mut diffs = Vec::new();
    if t.dtype.name() != entry.dtype {
        diffs.push(format!(
            "dtype {} (header: {})",
            entry.dtype,
            t.dtype.name()
        ));
    }
    if t.shape.as_slice() != entry.shape {
        diffs.push(format!("shape {:?} (header: {:?})", entry.shape, t.shape));
    }
    if (entry.data_start, entry.data_end) != (start, end) {
        diffs.push(format!(
            "byte range [{}, {}) (header: [{start}, {end}))",
            entry.data_start, entry.data_end
        ));
    }
    if diffs.is_empty() {
        Ok(t)
    } else {
        Err(format!(
            "tensor '{name}': the index says {}",
            diffs.join(", ")
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use safetensors_spark_format::header::parse_file_bytes;

    #[test]
    fn the_key_column_is_the_one_string_column_that_is_no_tensor_column() {
        assert_eq!(
            find_key_column(&["emb", "id"], &["emb"], "the table"),
            Ok("id")
        );
        let none = find_key_column(&["emb"], &["emb", "label"], "the table").unwrap_err();
        assert_eq!(
            none,
            "the key column is the table's one string column that is not one of the dataset's \
             columns ('emb', 'label'), but the table has none"
        );
        let two = find_key_column(&["other", "id"], &["emb"], "the DataFrame").unwrap_err();
        assert!(
            two.ends_with("but the DataFrame has 'other', 'id'"),
            "{two}"
        );
        let empty = find_key_column(&["a", "b"], &[], "the table").unwrap_err();
        assert!(empty.contains("(none: it has no shards)"), "{empty}");
    }

    /// A KV shard of keys `a`, `b` with columns `x` (F32 [2]) and `y` (I64 []).
    fn shard() -> Header {
        let json = r#"{"__metadata__":{"m":"1"},"a__x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a__y":{"dtype":"I64","shape":[],"data_offsets":[8,16]},"b__x":{"dtype":"F32","shape":[2],"data_offsets":[16,24]},"b__y":{"dtype":"I64","shape":[],"data_offsets":[24,32]}}"#;
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(json.as_bytes());
        bytes.extend_from_slice(&[0u8; 32]);
        parse_file_bytes(&bytes).unwrap()
    }

    fn columns() -> Vec<KvColumn> {
        vec![
            KvColumn {
                name: "x".into(),
                dtype: "F32".into(),
                shape: Some(vec![2]),
            },
            KvColumn {
                name: "y".into(),
                dtype: "I64".into(),
                shape: None,
            },
        ]
    }

    /// The absolute byte range of tensor `name`.
    fn range(h: &Header, name: &str) -> (u64, u64) {
        let t = h.tensor(name).unwrap();
        (
            h.data_start() + t.data_offsets[0],
            h.data_start() + t.data_offsets[1],
        )
    }

    #[test]
    fn kv_names_split_into_key_and_column() {
        let h = shard();
        let split = split_kv_header(&h, &columns(), "__").unwrap();
        assert_eq!(split.tensors, vec![("a", 0), ("a", 1), ("b", 0), ("b", 1)]);
        assert_eq!(split.keys, 2);
        let mut cols = columns();
        cols[0].dtype = "F64".into();
        let e = split_kv_header(&h, &cols, "__").unwrap_err();
        assert!(e.contains("tensor 'a__x' has dtype F32 but"), "{e}");
        let mut cols = columns();
        cols[0].shape = Some(vec![3]);
        let e = split_kv_header(&h, &cols, "__").unwrap_err();
        assert!(e.contains("tensor 'a__x' has shape [2] but"), "{e}");
        let mut cols = columns();
        cols.push(KvColumn {
            name: "z".into(),
            dtype: "F32".into(),
            shape: None,
        });
        let e = split_kv_header(&h, &cols, "__").unwrap_err();
        assert!(
            e.contains("key 'a' has no tensor for column(s) [\"z\"]"),
            "{e}"
        );
        let e = split_kv_header(&h, &columns()[..1], "__").unwrap_err();
        assert!(e.contains("tensor 'a__y' is not <key>__<column>"), "{e}");
    }

    #[test]
    fn an_index_row_must_agree_with_the_header() {
        let h = shard();
        let (s, e) = range(&h, "b__x");
        let good = IndexRowFields {
            tensor_key: "b__x",
            dtype: "F32",
            shape: &[2],
            data_start: s,
            data_end: e,
            kv: Some(("b", "x")),
        };
        assert_eq!(check_index_row(&h, &good, "__").unwrap().name, "b__x");
        // another key's range, the header's bytes, past the end
        let (as_, ae) = range(&h, "a__x");
        for (start, end) in [(as_, ae), (0, 8), (e, e + 8)] {
            let bad = IndexRowFields {
                data_start: start,
                data_end: end,
                ..good.clone()
            };
            let msg = check_index_row(&h, &bad, "__").unwrap_err();
            assert!(
                msg.contains(&format!(
                    "tensor 'b__x': the index says byte range [{start}, {end}) (header: [{s}, {e}))"
                )),
                "{msg}"
            );
        }
        let bad = IndexRowFields {
            dtype: "I32",
            shape: &[1, 2],
            ..good.clone()
        };
        let msg = check_index_row(&h, &bad, "__").unwrap_err();
        assert!(
            msg.contains("dtype I32 (header: F32), shape [1, 2] (header: [2])"),
            "{msg}"
        );
        let bad = IndexRowFields {
            kv: Some(("a", "x")),
            ..good.clone()
        };
        let msg = check_index_row(&h, &bad, "__").unwrap_err();
        assert!(msg.contains("sample_key 'a' and column 'x'"), "{msg}");
        let bad = IndexRowFields {
            tensor_key: "c__x",
            kv: Some(("c", "x")),
            ..good.clone()
        };
        let msg = check_index_row(&h, &bad, "__").unwrap_err();
        assert!(
            msg.contains("the shard's header has no such tensor"),
            "{msg}"
        );
        let batch = IndexRowFields { kv: None, ..good };
        assert!(check_index_row(&h, &batch, "__").is_ok());
    }
}
