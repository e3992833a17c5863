//! Binary columns with a `shapes` entry: each value's bytes are one sample's elements.

use super::*;

pub(super) fn extract_binary(
    col: &mut ColumnState,
    array: &ArrayRef,
    rows: Range<usize>,
    row_base: u64,
    out: &mut Vec<u8>,
) -> Result<Vec<RowTensor>, WriteError> {
    let bin: &BinaryArray = array.as_binary_opt::<i32>().ok_or_else(|| {
        malformed(
            col,
            format!("expected Arrow type Binary, found {:?}", array.data_type()),
        )
    })?;
    let Some(dtype) = col.plan.dtype else {
        return Err(malformed(col, "a binary column needs the `dtype` option"));
    };
    let size = dtype.byte_size().unwrap_or(1) as u64;
    let mut result = Vec::with_capacity(rows.len());
    for i in rows {
        let row = row_base + i as u64;
        if bin.is_null(i) {
            return Err(col.err(row, "null value"));
        }
        let bytes = bin.value(i);
        let len = bytes.len() as u64;
        let shape = match &col.plan.sample_shape {
            Some(s) => s.clone(),
            None if len.is_multiple_of(size) => vec![len / size],
            None => {
                return Err(col.err(
                    row,
                    format!("binary value of {len} bytes is not a whole number of {dtype} elements ({size} bytes each)"),
                ))
            }
        };
        let needed = header::tensor_byte_len(&col.plan.name, dtype, &shape).ok();
        if needed != Some(len) {
            let needed =
                needed.map_or_else(|| "an overflowing number of".into(), |n| n.to_string());
            return Err(col.err(
                row,
                format!(
                    "binary value has {len} bytes but shape {} of {dtype} needs {needed} bytes",
                    fmt_shape(&shape)
                ),
            ));
        }
        col.accept(row, &shape, dtype)?;
        let start = out.len();
        out.extend_from_slice(bytes);
        result.push(RowTensor {
            shape,
            dtype,
            bytes: start..out.len(),
        });
    }
    Ok(result)
}
