//! Numeric array and scalar columns: Arrow values to the dtype's little-endian bytes.

use super::*;

pub(super) fn extract_numeric(
    col: &mut ColumnState,
    array: &ArrayRef,
    element: SparkNumeric,
    depth: u32,
    rows: Range<usize>,
    row_base: u64,
    out: &mut Vec<u8>,
) -> Result<Vec<RowTensor>, WriteError> {
    let (levels, leaf_array, leaf) = list_levels(col, array, element, depth)?;
    let dtype = col.numeric_target();
    let mut ranges = Vec::with_capacity(rows.len());
    let mut shapes = Vec::with_capacity(rows.len());
    let mut numbers = Vec::with_capacity(rows.len());
    let mut pending: Option<WriteError> = None;
    'rows: for i in rows {
        let row = row_base + i as u64;
        let mut shape = vec![0u64; depth as usize];
        let (mut lo, mut hi) = (i, i + 1);
        for (d, list) in levels.iter().enumerate() {
            if list.null_count() > 0 {
                if let Some(j) = (lo..hi).find(|&j| list.is_null(j)) {
                    pending = Some(col.err(
                        row,
                        if d == 0 {
                            "null value".to_string()
                        } else {
                            format!("null inner array at index {} of dimension {d}", j - lo)
                        },
                    ));
                    break 'rows;
                }
            }
            let offsets = list.value_offsets();
            let (Some(&o_lo), Some(&o_hi)) = (offsets.get(lo), offsets.get(hi)) else {
                pending = Some(malformed(col, "list offsets out of bounds"));
                break 'rows;
            };
            if hi > lo {
                let len_of =
                    |j: usize| usize_of(offsets[j + 1]).saturating_sub(usize_of(offsets[j]));
                let first = len_of(lo);
                if let Some(other) = (lo + 1..hi).map(len_of).find(|&l| l != first) {
                    pending = Some(col.err(
                        row,
                        format!(
                            "ragged nested array: inner lengths {first} and {other}{}",
                            col.ragged_hint()
                        ),
                    ));
                    break 'rows;
                }
                shape[d] = first as u64;
            }
            lo = usize_of(o_lo);
            hi = usize_of(o_hi);
        }
        if hi > leaf.len() || lo > hi {
            pending = Some(malformed(col, "list offsets out of bounds"));
            break;
        }
        if leaf_array.null_count() > 0 {
            if let Some(j) = (lo..hi).find(|&j| leaf_array.is_null(j)) {
                pending = Some(col.err(row, format!("null element at index {}", j - lo)));
                break;
            }
        }
        if element == SparkNumeric::Boolean {
            if let Some((j, b)) = bad_bool(&leaf, lo..hi) {
                pending = Some(col.err(
                    row,
                    format!("boolean element at index {j} has byte value {b} (expected 0 or 1)"),
                ));
                break;
            }
        }
        let shape = match col.reshape(row, shape, (hi - lo) as u64) {
            Ok(s) => s,
            Err(e) => {
                pending = Some(e);
                break;
            }
        };
        if let Err(e) = col.accept(row, &shape, dtype) {
            pending = Some(e);
            break;
        }
        ranges.push(lo..hi);
        shapes.push(shape);
        numbers.push(row);
    }
    // Rows before the first failing one are converted first, so a conversion error in an
    // earlier row is the one reported.
    let tensors = convert_run(col, &leaf, &ranges, shapes, dtype, &numbers, out)?;
    match pending {
        Some(e) => Err(e),
        None => Ok(tensors),
    }
}

pub(super) fn extract_scalar(
    col: &mut ColumnState,
    array: &ArrayRef,
    element: SparkNumeric,
    rows: Range<usize>,
    row_base: u64,
    out: &mut Vec<u8>,
) -> Result<Vec<RowTensor>, WriteError> {
    let leaf = leaf_values(array.as_ref())
        .filter(|_| *array.data_type() == primitive_type(element))
        .ok_or_else(|| {
            malformed(
                col,
                format!(
                    "expected Arrow type {}, found {:?}",
                    expected_type(&col.plan.input),
                    array.data_type()
                ),
            )
        })?;
    let dtype = col.numeric_target();
    let mut ranges = Vec::with_capacity(rows.len());
    let mut shapes = Vec::with_capacity(rows.len());
    let mut numbers = Vec::with_capacity(rows.len());
    let mut pending = None;
    for i in rows {
        let row = row_base + i as u64;
        if array.is_null(i) {
            pending = Some(col.err(row, "null value"));
            break;
        }
        if element == SparkNumeric::Boolean {
            if let Some((_, b)) = bad_bool(&leaf, i..i + 1) {
                pending = Some(col.err(
                    row,
                    format!("boolean value has byte value {b} (expected 0 or 1)"),
                ));
                break;
            }
        }
        let shape = match col
            .reshape(row, Vec::new(), 1)
            .and_then(|s| col.accept(row, &s, dtype).map(|()| s))
        {
            Ok(s) => s,
            Err(e) => {
                pending = Some(e);
                break;
            }
        };
        ranges.push(i..i + 1);
        shapes.push(shape);
        numbers.push(row);
    }
    let tensors = convert_run(col, &leaf, &ranges, shapes, dtype, &numbers, out)?;
    match pending {
        Some(e) => Err(e),
        None => Ok(tensors),
    }
}
