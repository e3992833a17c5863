//! Ragged columns: each row's elements appended to the values, its end to the offsets.

use super::*;

/// A ragged column (spec/dataset.md §2.1): validates rows `rows` of `array`, appends their
/// converted values to `out` (concatenated along the first dimension) and one offset per row to
/// `offsets` (which holds at least the shard's leading 0). Rows before the first bad one are
/// appended; the caller discards the shard on error.
pub(crate) fn extract_ragged(
    col: &mut ColumnState,
    array: &ArrayRef,
    rows: Range<usize>,
    row_base: u64,
    out: &mut Vec<u8>,
    offsets: &mut Vec<i64>,
) -> Result<(), WriteError> {
    if rows.end > array.len() || rows.start > rows.end {
        return Err(malformed(
            col,
            format!("rows {rows:?} out of an array of {} rows", array.len()),
        ));
    }
    if rows.is_empty() {
        return Ok(());
    }
    let Some(dtype) = col.plan.dtype else {
        return Err(malformed(col, "a ragged column needs a dtype"));
    };
    col.dtype = Some(dtype);
    match col.plan.input.clone() {
        InputKind::Binary => {
            let wrong = || format!("expected Arrow type Binary, found {:?}", array.data_type());
            let a = array
                .as_binary_opt::<i32>()
                .ok_or_else(|| malformed(col, wrong()))?;
            ragged_bytes(
                col,
                a,
                a.value_offsets(),
                a.value_data(),
                rows,
                row_base,
                out,
                offsets,
            )
        }
        InputKind::String => {
            let wrong = || format!("expected Arrow type Utf8, found {:?}", array.data_type());
            let a = array
                .as_string_opt::<i32>()
                .ok_or_else(|| malformed(col, wrong()))?;
            ragged_bytes(
                col,
                a,
                a.value_offsets(),
                a.value_data(),
                rows,
                row_base,
                out,
                offsets,
            )
        }
        InputKind::NumericArray { element, depth } => ragged_numeric(
            col, array, element, depth, dtype, rows, row_base, out, offsets,
        ),
        _ => Err(malformed(col, "this column type cannot be ragged")),
    }
}

/// Binary or string rows: their bytes, copied in one run.
#[allow(clippy::too_many_arguments)]
pub(super) fn ragged_bytes(
    col: &ColumnState,
    array: &dyn Array,
    value_offsets: &[i32],
    data: &[u8],
    rows: Range<usize>,
    row_base: u64,
    out: &mut Vec<u8>,
    offsets: &mut Vec<i64>,
) -> Result<(), WriteError> {
    let vo = value_offsets;
    let (Some(&lo), Some(&hi)) = (vo.get(rows.start), vo.get(rows.end)) else {
        return Err(malformed(col, "value offsets out of bounds"));
    };
    if array.null_count() > 0 {
        if let Some(i) = rows.clone().find(|&i| array.is_null(i)) {
            return Err(col.err(row_base + i as u64, "null value"));
        }
    }
    let bytes = data
        .get(usize_of(lo)..usize_of(hi))
        .ok_or_else(|| malformed(col, "values out of bounds"))?;
    reserve(col, row_base + rows.start as u64, out, bytes.len())?;
    offsets.reserve(rows.len());
    for i in rows {
        let len = usize_of(vo[i + 1]).saturating_sub(usize_of(vo[i]));
        push_offset(col, row_base + i as u64, offsets, len)?;
    }
    out.extend_from_slice(bytes);
    Ok(())
}

/// Numeric array rows: every row's inner shape is checked against the column's, then the leaf
/// values of all the rows (contiguous in the leaf array) are converted in one call.
#[allow(clippy::too_many_arguments)]
pub(super) fn ragged_numeric(
    col: &mut ColumnState,
    array: &ArrayRef,
    element: SparkNumeric,
    depth: u32,
    dtype: Dtype,
    rows: Range<usize>,
    row_base: u64,
    out: &mut Vec<u8>,
    offsets: &mut Vec<i64>,
) -> Result<(), WriteError> {
    let (levels, leaf_array, leaf) = list_levels(col, array, element, depth)?;
    let mut inner = col.inner.take().unwrap_or_default();
    let result = ragged_rows(
        col, &levels, &leaf, leaf_array, element, &mut inner, rows, row_base, offsets,
    );
    col.inner = Some(inner);
    let (done, leaf_starts, pending) = result?;
    // Convert the rows before the first bad one (a conversion error in an earlier row is the
    // one reported).
    if let (Some(&first), Some(&end)) = (leaf_starts.first(), leaf_starts.last()) {
        let src = leaf
            .slice(first..end)
            .ok_or_else(|| malformed(col, format!("leaf values {first}..{end} out of bounds")))?;
        let row0 = row_base + done.start as u64;
        if let Err(e) = convert::append_converted(src, dtype, out) {
            let at = error_index(&e).map(|i| i + first);
            let r = at.map(|at| leaf_starts.partition_point(|&s| s <= at).saturating_sub(1));
            return Err(match (r, at) {
                (Some(r), Some(at)) => {
                    col.conv_err(row0 + r as u64, reindex(e, at - leaf_starts[r]))
                }
                _ => col.conv_err(row0, e),
            });
        }
    }
    match pending {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Checks rows of a ragged numeric column and pushes their offsets. Returns the rows checked
/// (those before the first bad one), their leaf starts plus the end of the last, and the error
/// of the bad row if any.
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
pub(super) fn ragged_rows(
    col: &ColumnState,
    levels: &[&ListArray],
    leaf: &Source<'_>,
    leaf_array: &dyn Array,
    element: SparkNumeric,
    inner: &mut [Option<u64>],
    rows: Range<usize>,
    row_base: u64,
    offsets: &mut Vec<i64>,
) -> Result<(Range<usize>, Vec<usize>, Option<WriteError>), WriteError> {
    let mut leaf_starts = Vec::with_capacity(rows.len() + 1);
    let mut row_inner: Vec<Option<u64>> = vec![None; inner.len()];
    let start = rows.start;
    let mut end = start;
    let mut pending = None;
    let mut leaf_end = 0usize;
    'rows: for i in rows {
        let row = row_base + i as u64;
        let Some(outer) = levels.first() else { break };
        if outer.is_null(i) {
            pending = Some(col.err(row, "null value"));
            break;
        }
        let o = outer.value_offsets();
        let (Some(&a), Some(&b)) = (o.get(i), o.get(i + 1)) else {
            return Err(malformed(col, "list offsets out of bounds"));
        };
        let first_dim = usize_of(b).saturating_sub(usize_of(a));
        let (mut lo, mut hi) = (usize_of(a), usize_of(b));
        row_inner.iter_mut().for_each(|d| *d = None);
        for (k, list) in levels.iter().enumerate().skip(1) {
            if hi == lo {
                // no list at this level: the row shows no more dimensions
                let Some(&x) = list.value_offsets().get(lo) else {
                    return Err(malformed(col, "list offsets out of bounds"));
                };
                lo = usize_of(x);
                hi = lo;
                continue;
            }
            if list.null_count() > 0 {
                if let Some(j) = (lo..hi).find(|&j| list.is_null(j)) {
                    pending = Some(col.err(
                        row,
                        format!("null inner array at index {} of dimension {k}", j - lo),
                    ));
                    break 'rows;
                }
            }
            let lo_ = list.value_offsets();
            let (Some(&x), Some(&y)) = (lo_.get(lo), lo_.get(hi)) else {
                return Err(malformed(col, "list offsets out of bounds"));
            };
            let len_of = |j: usize| usize_of(lo_[j + 1]).saturating_sub(usize_of(lo_[j]));
            let first = len_of(lo);
            if let Some(j) = (lo + 1..hi).find(|&j| len_of(j) != first) {
                let mut a_shape = row_inner[..k - 1].to_vec();
                a_shape.push(Some(first as u64));
                let mut b_shape = row_inner[..k - 1].to_vec();
                b_shape.push(Some(len_of(j) as u64));
                pending = Some(col.err(
                    row,
                    format!(
                        "inner shape differs within the row: dimension {k} has length {first} and {} ({}… and {}…); only the first dimension of a ragged column may vary",
                        len_of(j),
                        fmt_inner(&a_shape),
                        fmt_inner(&b_shape)
                    ),
                ));
                break 'rows;
            }
            row_inner[k - 1] = Some(first as u64);
            lo = usize_of(x);
            hi = usize_of(y);
        }
        // the row's inner shape against the column's
        let clash = inner
            .iter()
            .zip(&row_inner)
            .any(|(c, r)| matches!((c, r), (Some(c), Some(r)) if c != r));
        if clash {
            pending = Some(col.err(
                row,
                format!(
                    "inner shape {} differs from the column's inner shape {} (of earlier rows{}); only the first dimension of a ragged column may vary",
                    fmt_inner(&row_inner),
                    fmt_inner(inner),
                    if col.plan.ragged.as_ref().is_some_and(|r| r.inner_shape.is_some()) {
                        " or the dataset"
                    } else {
                        ""
                    }
                ),
            ));
            break;
        }
        if hi > leaf.len() || lo > hi {
            return Err(malformed(col, "list offsets out of bounds"));
        }
        if leaf_array.null_count() > 0 {
            if let Some(j) = (lo..hi).find(|&j| leaf_array.is_null(j)) {
                pending = Some(col.err(row, format!("null element at index {}", j - lo)));
                break;
            }
        }
        if element == SparkNumeric::Boolean {
            if let Some((j, b)) = bad_bool(leaf, lo..hi) {
                pending = Some(col.err(
                    row,
                    format!("boolean element at index {j} has byte value {b} (expected 0 or 1)"),
                ));
                break;
            }
        }
        for (c, r) in inner.iter_mut().zip(&row_inner) {
            if c.is_none() {
                *c = *r;
            }
        }
        push_offset(col, row, offsets, first_dim)?;
        leaf_starts.push(lo);
        leaf_end = hi;
        end = i + 1;
    }
    if !leaf_starts.is_empty() {
        leaf_starts.push(leaf_end);
    }
    Ok((start..end, leaf_starts, pending))
}
