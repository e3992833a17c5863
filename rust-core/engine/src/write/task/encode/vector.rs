//! Spark ML vector columns (dense and sparse) written as F64 (or the dtype asked for) samples.

use super::*;

pub(super) fn f64_list<'a>(
    col: &ColumnState,
    list: &'a ListArray,
    i: usize,
) -> Result<(&'a [f64], Range<usize>), WriteError> {
    let offsets = list.value_offsets();
    let (Some(&lo), Some(&hi)) = (offsets.get(i), offsets.get(i + 1)) else {
        return Err(malformed(col, "vector offsets out of bounds"));
    };
    let r = usize_of(lo)..usize_of(hi);
    let v = list
        .values()
        .as_primitive_opt::<Float64Type>()
        .and_then(|p| p.values().get(r.clone()))
        .ok_or_else(|| malformed(col, "vector values out of bounds or not Float64"))?;
    Ok((v, r))
}

pub(super) fn extract_vector(
    col: &mut ColumnState,
    array: &ArrayRef,
    rows: Range<usize>,
    row_base: u64,
    out: &mut Vec<u8>,
) -> Result<Vec<RowTensor>, WriteError> {
    let wrong = || {
        malformed(
            col,
            format!(
                "expected Arrow type {}, found {:?}",
                expected_type(&InputKind::MlVector),
                array.data_type()
            ),
        )
    };
    let s = array.as_struct_opt().ok_or_else(wrong)?;
    let kinds = field(s, "type")
        .and_then(|a| a.as_primitive_opt::<Int8Type>())
        .ok_or_else(wrong)?;
    let sizes = field(s, "size")
        .and_then(|a| a.as_primitive_opt::<Int32Type>())
        .ok_or_else(wrong)?;
    let indices = field(s, "indices")
        .and_then(|a| a.as_list_opt::<i32>())
        .ok_or_else(wrong)?;
    let values = field(s, "values")
        .and_then(|a| a.as_list_opt::<i32>())
        .ok_or_else(wrong)?;
    let index_values = indices
        .values()
        .as_primitive_opt::<Int32Type>()
        .ok_or_else(wrong)?;
    let dtype = col.numeric_target();
    let mut result = Vec::with_capacity(rows.len());
    for i in rows {
        let row = row_base + i as u64;
        if s.is_null(i) || kinds.is_null(i) {
            return Err(col.err(row, "null value"));
        }
        if values.is_null(i) {
            return Err(col.err(row, "null 'values' of the vector"));
        }
        let (vals, vr) = f64_list(col, values, i)?;
        let vnulls = values.values();
        if vnulls.null_count() > 0 {
            if let Some(j) = vr.clone().find(|&j| vnulls.is_null(j)) {
                return Err(col.err(row, format!("null element at index {}", j - vr.start)));
            }
        }
        let start = out.len();
        let n = match kinds.value(i) {
            1 => {
                let shape = col.reshape(row, vec![vals.len() as u64], vals.len() as u64)?;
                col.accept(row, &shape, dtype)?;
                convert::append_converted(Source::F64(vals), dtype, out)
                    .map_err(|e| col.conv_err(row, e))?;
                shape
            }
            0 => {
                if sizes.is_null(i) || indices.is_null(i) {
                    return Err(col.err(row, "sparse vector without size or indices"));
                }
                let size = sizes.value(i);
                let size = usize::try_from(size)
                    .map_err(|_| col.err(row, format!("sparse vector of negative size {size}")))?;
                let offsets = indices.value_offsets();
                let (Some(&lo), Some(&hi)) = (offsets.get(i), offsets.get(i + 1)) else {
                    return Err(malformed(col, "vector offsets out of bounds"));
                };
                let ir = usize_of(lo)..usize_of(hi);
                if index_values.null_count() > 0 {
                    if let Some(j) = ir.clone().find(|&j| index_values.is_null(j)) {
                        return Err(col.err(
                            row,
                            format!("null sparse index at position {}", j - ir.start),
                        ));
                    }
                }
                let idx = index_values
                    .values()
                    .get(ir)
                    .ok_or_else(|| malformed(col, "vector indices out of bounds"))?;
                if idx.len() != vals.len() {
                    return Err(col.err(
                        row,
                        format!(
                            "sparse vector has {} indices but {} values",
                            idx.len(),
                            vals.len()
                        ),
                    ));
                }
                let mut dense = vec![0f64; size];
                let mut prev: Option<i32> = None;
                for (k, (&ix, &v)) in idx.iter().zip(vals).enumerate() {
                    if prev.is_some_and(|p| ix <= p) {
                        return Err(col.err(
                            row,
                            format!(
                                "sparse indices are not strictly increasing: {ix} at position {k} follows {}",
                                prev.unwrap_or(0)
                            ),
                        ));
                    }
                    let slot = usize::try_from(ix)
                        .ok()
                        .and_then(|u| dense.get_mut(u))
                        .ok_or_else(|| {
                            col.err(
                                row,
                                format!("sparse index {ix} at position {k} is outside [0, {size})"),
                            )
                        })?;
                    *slot = v;
                    prev = Some(ix);
                }
                let shape = col.reshape(row, vec![size as u64], size as u64)?;
                col.accept(row, &shape, dtype)?;
                convert::append_converted(Source::F64(&dense), dtype, out)
                    .map_err(|e| col.conv_err(row, e))?;
                shape
            }
            other => {
                return Err(col.err(
                    row,
                    format!("vector type {other} is neither 0 (sparse) nor 1 (dense)"),
                ))
            }
        };
        result.push(RowTensor {
            shape: n,
            dtype,
            bytes: start..out.len(),
        });
    }
    Ok(result)
}
