//! Ragged columns in batch shards (spec/dataset.md §2.1): a column `c` is stored as its values
//! (`c`: the rows concatenated along the first dimension, `[total_elements, *inner_shape]`) and
//! its row boundaries (`c.offsets`, [`ragged_offsets_name`]: I64 `[rows + 1]`, starting at 0,
//! non-decreasing, ending at `total_elements`). Every reader checks a shard against these rules
//! through this module.

use crate::manifest::{ragged_offsets_name, RaggedColumn};
use safetensors_spark_format::header::Header;
use safetensors_spark_format::Dtype;

/// Checks the two tensors of ragged column `column` (dtype `dtype`) in a batch shard of `rows`
/// rows (real + padding): the values tensor has the column's dtype and `[n, *inner_shape]`, the
/// offsets tensor is I64 `[rows + 1]`. Returns the values' first dimension (total elements).
pub fn check_ragged_tensors(
    header: &Header,
    column: &str,
    dtype: Dtype,
    ragged: &RaggedColumn,
    rows: u64,
) -> Result<u64, String> {
    let offsets_name = ragged_offsets_name(column);
    let values = header
        .tensor(column)
        .ok_or_else(|| format!("no tensor '{column}' (the values of ragged column '{column}')"))?;
    if values.dtype != dtype {
        return Err(format!(
            "tensor '{column}' has dtype {} but the schema says {} for ragged column '{column}'",
            values.dtype.name(),
            dtype.name()
        ));
    }
    match values.shape.split_first() {
        Some((n, inner)) if inner == ragged.inner_shape.as_slice() => {
            let offsets = header.tensor(&offsets_name).ok_or_else(|| {
                format!("no tensor '{offsets_name}' (the row offsets of ragged column '{column}')")
            })?;
            if offsets.dtype != Dtype::I64 || offsets.shape != [rows + 1] {
                return Err(format!(
                    "tensor '{offsets_name}' is {} {:?}; the offsets of ragged column '{column}' in a \
                     shard of {rows} rows are I64 [{}]",
                    offsets.dtype.name(),
                    offsets.shape,
                    rows + 1
                ));
            }
            Ok(*n)
        }
        _ => Err(format!(
            "tensor '{column}' has shape {:?}; ragged column '{column}' with inner shape {:?} \
             needs [elements, {}]",
            values.shape,
            ragged.inner_shape,
            ragged
                .inner_shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Checks the offsets of ragged column `column` against its values' first dimension `elements`:
/// `offsets[0] = 0`, non-decreasing, `offsets[rows] = elements`. The error names the column and
/// the first row that breaks a rule.
pub fn check_offsets(column: &str, offsets: &[i64], elements: u64) -> Result<(), String> {
    let name = ragged_offsets_name(column);
    let Some((&first, _)) = offsets.split_first() else {
        return Err(format!(
            "tensor '{name}' is empty; it needs rows + 1 entries"
        ));
    };
    if first != 0 {
        return Err(format!(
            "tensor '{name}' starts at {first}; offsets start at 0"
        ));
    }
    if let Some(row) = offsets.windows(2).position(|w| w[1] < w[0]) {
        return Err(format!(
            "tensor '{name}': row {row} of ragged column '{column}' ends at {} before it starts at {} \
             (offsets must not decrease)",
            offsets[row + 1],
            offsets[row]
        ));
    }
    let last = offsets[offsets.len() - 1];
    if u64::try_from(last).ok() != Some(elements) {
        return Err(format!(
            "tensor '{name}' ends at {last} but tensor '{column}' holds {elements} elements"
        ));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::manifest::RaggedElement;
    use safetensors_spark_format::header::parse_file_bytes;

    fn shard(tensors: &[(&str, &str, Vec<u64>)]) -> Header {
        let mut json = String::from("{");
        let mut at = 0u64;
        for (i, (name, dtype, shape)) in tensors.iter().enumerate() {
            let size = Dtype::from_name(dtype).unwrap().byte_size().unwrap() as u64;
            let len = shape.iter().product::<u64>() * size;
            if i > 0 {
                json.push(',');
            }
            json.push_str(&format!(
                "\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":{shape:?},\"data_offsets\":[{at},{}]}}",
                at + len
            ));
            at += len;
        }
        json.push('}');
        while json.len() % 8 != 0 {
            json.push(' ');
        }
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(json.as_bytes());
        bytes.resize(bytes.len() + at as usize, 0);
        parse_file_bytes(&bytes).unwrap()
    }

    fn col(inner: &[u64]) -> RaggedColumn {
        RaggedColumn {
            inner_shape: inner.to_vec(),
            element: RaggedElement::Array,
        }
    }

    #[test]
    fn a_ragged_column_is_values_and_i64_offsets_of_rows_plus_one() {
        let h = shard(&[("t", "I32", vec![7, 2]), ("t.offsets", "I64", vec![4])]);
        assert_eq!(
            check_ragged_tensors(&h, "t", Dtype::I32, &col(&[2]), 3),
            Ok(7)
        );
        let e = check_ragged_tensors(&h, "t", Dtype::I32, &col(&[2]), 4).unwrap_err();
        assert!(
            e.contains("'t.offsets' is I64 [4]") && e.contains("[5]"),
            "{e}"
        );
        let e = check_ragged_tensors(&h, "t", Dtype::I32, &col(&[3]), 3).unwrap_err();
        assert!(
            e.contains("shape [7, 2]") && e.contains("[elements, 3]"),
            "{e}"
        );
        let e = check_ragged_tensors(&h, "t", Dtype::F32, &col(&[2]), 3).unwrap_err();
        assert!(e.contains("dtype I32 but the schema says F32"), "{e}");
        let e = check_ragged_tensors(&h, "u", Dtype::I32, &col(&[]), 3).unwrap_err();
        assert!(e.contains("no tensor 'u'"), "{e}");
        let h = shard(&[("t", "I32", vec![7, 2])]);
        let e = check_ragged_tensors(&h, "t", Dtype::I32, &col(&[2]), 3).unwrap_err();
        assert!(e.contains("no tensor 't.offsets'"), "{e}");
        let h = shard(&[("t", "I32", vec![7]), ("t.offsets", "I32", vec![4])]);
        let e = check_ragged_tensors(&h, "t", Dtype::I32, &col(&[]), 3).unwrap_err();
        assert!(e.contains("is I32 [4]"), "{e}");
    }

    #[test]
    fn offsets_start_at_zero_never_decrease_and_end_at_the_values_length() {
        assert_eq!(check_offsets("t", &[0, 3, 3, 7], 7), Ok(()));
        assert_eq!(check_offsets("t", &[0], 0), Ok(()));
        let e = check_offsets("t", &[1, 3, 7], 7).unwrap_err();
        assert!(e.contains("starts at 1"), "{e}");
        let e = check_offsets("t", &[0, 3, 2, 7], 7).unwrap_err();
        assert!(
            e.contains("row 1 of ragged column 't' ends at 2 before it starts at 3"),
            "{e}"
        );
        let e = check_offsets("t", &[0, 3, 6], 7).unwrap_err();
        assert!(
            e.contains("ends at 6 but tensor 't' holds 7 elements"),
            "{e}"
        );
        let e = check_offsets("t", &[0, -1], 7).unwrap_err();
        assert!(e.contains("row 0"), "{e}");
        assert!(check_offsets("t", &[], 0).unwrap_err().contains("is empty"));
    }

    #[test]
    fn a_batch_manifest_takes_a_ragged_column_with_a_null_shape_only() {
        let manifest = |layout: &str, column: &str| {
            let (batch, tail, sep) = if layout == "batch" {
                ("4", "\"write\"", "null")
            } else {
                ("null", "null", "\"__\"")
            };
            format!(
                r#"{{"format_version":"1.0","safetensors_version":"1.0","total_samples":3,
                "total_bytes":100,"shards":[{{"shard_path":
                "part-00000-0000-0f8fad5b-d9cb-469f-a165-70867728950e.safetensors",
                "samples_count":3,"bytes":100,"partition":0,"padded_samples":0,"num_tensors":2}}],
                "schema":{{"tokens":{column}}},"format":"safetensors-spark-dataset",
                "created_by":"t","manifest_version":1,"layout":"{layout}","batch_size":{batch},
                "tail_strategy":{tail},"kv_separator":{sep},"padded_samples":0,
                "dropped_samples":0}}"#
            )
        };
        let ragged =
            r#"{"dtype":"I32","shape":null,"ragged":{"inner_shape":[],"element":"array"}}"#;
        let m = crate::parse_manifest(&manifest("batch", ragged)).unwrap();
        assert_eq!(m.schema.get("tokens").unwrap().ragged, Some(col(&[])));
        let with_shape =
            r#"{"dtype":"I32","shape":[4],"ragged":{"inner_shape":[],"element":"array"}}"#;
        let e = crate::parse_manifest(&manifest("batch", with_shape))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("column 'tokens' is ragged, so its schema.shape must be null"),
            "{e}"
        );
        let e = crate::parse_manifest(&manifest("kv", ragged))
            .unwrap_err()
            .to_string();
        assert!(e.contains("only the batch layout"), "{e}");
        // a fixed column keeps its rule
        let e = crate::parse_manifest(&manifest("batch", r#"{"dtype":"I32","shape":null}"#))
            .unwrap_err()
            .to_string();
        assert!(e.contains("schema.shape is [batch_size"), "{e}");
    }
}
