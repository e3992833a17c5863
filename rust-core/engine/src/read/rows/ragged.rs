//! Ragged columns in the per-sample layout: each row's elements from the values tensor between
//! two entries of its offsets tensor, the offsets checked as they are read.

use super::*;

/// The ragged columns a shard's `__metadata__` names ([`RAGGED_METADATA_KEY`], a JSON array of column
/// names), in column order; empty when the key is absent.
pub fn ragged_columns(file: &str, header: &Header) -> Result<Vec<String>, ReadError> {
    let Some(v) = header
        .metadata
        .as_ref()
        .and_then(|m| m.get(RAGGED_METADATA_KEY))
    else {
        return Ok(Vec::new());
    };
    serde_json::from_str::<Vec<String>>(v).map_err(|_| {
        ReadErrorKind::ReservedMetadata {
            key: RAGGED_METADATA_KEY,
            value: v.clone(),
            problem: "not a JSON array of column names",
        }
        .in_file(file)
    })
}

/// One I64 entry of an offsets tensor.
pub(super) fn offset_entries(
    src: &dyn TensorSource,
    offsets: &TensorInfo,
    entries: Range<u64>,
) -> Result<Vec<i64>, ReadError> {
    let bytes = src.read(offsets, entries.start * 8..entries.end * 8)?;
    Ok(bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect())
}

/// Absolute byte ranges (relative to each tensor's first byte) of the offsets entries
/// [`ragged_offsets`] reads for `rows`: entries `rows.start ..= rows.end`, the first and the
/// last.
pub fn ragged_offsets_ranges(offsets: &TensorInfo, rows: &Range<u64>) -> [Range<u64>; 3] {
    let last = offsets
        .shape
        .first()
        .copied()
        .unwrap_or(1)
        .saturating_sub(1);
    [
        rows.start * 8..rows.end.saturating_add(1).saturating_mul(8),
        0..8,
        last * 8..last * 8 + 8,
    ]
}

/// The row boundaries of rows `rows` of ragged column `column` of `src`: `rows.len() + 1`
/// element offsets into the values tensor `column`, read from `column.offsets`. Reads only
/// the entries `rows.start ..= rows.end` plus the first and last entry, and validates them:
/// the first entry is 0, the last equals the values' first dimension, every entry read lies in
/// `[0, elements]` and none is smaller than the one before. Errors name the file and column.
pub fn ragged_offsets(
    src: &dyn TensorSource,
    column: &str,
    rows: Range<u64>,
) -> Result<Vec<u64>, ReadError> {
    let file = src.name();
    let bad = |m: String| ReadErrorKind::RaggedOffsets(m).at(&file, column);
    let h = src.header();
    let name = ragged_offsets_name(column);
    let values = h
        .tensor(column)
        .ok_or_else(|| ReadErrorKind::MissingTensor.at(&file, column))?;
    let offsets = h
        .tensor(&name)
        .ok_or_else(|| bad(format!("the offsets tensor `{name}` is missing")))?;
    let elements = values
        .shape
        .first()
        .copied()
        .ok_or_else(|| ReadErrorKind::NoRowDimension.at(&file, column))?;
    let entries = offsets.shape.first().copied().unwrap_or(0);
    if offsets.dtype != Dtype::I64 || offsets.shape.len() != 1 || entries == 0 {
        return Err(bad(format!(
            "`{name}` is {} {:?}; row boundaries are I64 [rows + 1]",
            offsets.dtype, offsets.shape
        )));
    }
    if rows.start > rows.end || rows.end >= entries {
        return Err(ReadErrorKind::RowRange {
            start: rows.start,
            end: rows.end,
            rows: entries - 1,
        }
        .at(&file, column));
    }
    let first = offset_entries(src, offsets, 0..1)?;
    if first.first() != Some(&0) {
        return Err(bad(format!(
            "`{name}` starts at {}, not 0",
            first.first().copied().unwrap_or_default()
        )));
    }
    let last = offset_entries(src, offsets, entries - 1..entries)?;
    if last.first().map(|&v| v as u64) != Some(elements) || last.first() < Some(&0) {
        return Err(bad(format!(
            "`{name}` ends at {} (entry {}), but `{column}` has {elements} elements",
            last.first().copied().unwrap_or_default(),
            entries - 1
        )));
    }
    let read = offset_entries(src, offsets, rows.start..rows.end + 1)?;
    let mut out = Vec::with_capacity(read.len());
    let mut before: Option<u64> = None;
    for (i, &v) in read.iter().enumerate() {
        let entry = rows.start + i as u64;
        if v < 0 || v as u64 > elements {
            return Err(bad(format!(
                "`{name}` entry {entry} is {v}, outside [0, {elements}] (`{column}` has {elements} elements)"
            )));
        }
        let v = v as u64;
        if let Some(p) = before.filter(|&p| v < p) {
            return Err(bad(format!(
                "`{name}` entry {entry} is {v}, smaller than entry {} ({p}): row {} would have a negative length",
                entry - 1,
                entry - 1
            )));
        }
        before = Some(v);
        out.push(v);
    }
    Ok(out)
}

/// Bytes of `elements` elements of a ragged column's values tensor `values`.
pub(super) fn ragged_bytes(values: &TensorInfo, elements: u64) -> Option<u64> {
    checked_product(values.shape.get(1..).unwrap_or_default())
        .and_then(|p| p.checked_mul(elements))
        .and_then(|e| values.dtype.checked_byte_len(e))
}

/// Byte range (relative to the values tensor's first byte) of the elements
/// `offsets[0]..offsets[last]` of ragged column `values`.
pub fn ragged_values_range(values: &TensorInfo, offsets: &[u64]) -> Option<Range<u64>> {
    let (first, last) = (offsets.first()?, offsets.last()?);
    Some(ragged_bytes(values, *first)?..ragged_bytes(values, *last)?)
}

/// Rows `rows` of ragged column `column` of `src` (spec/dataset.md §2.1) as a per-sample column
/// of type [`sample_target_type`]`(target, sample_rank)`: each row is its slice of the values
/// tensor, `List`-nested once for the row and once per inner dimension
/// ([`SampleTarget::Values`], `sample_rank` = 1 + inner rank), or its bytes
/// ([`SampleTarget::Bytes`]) or UTF-8 text ([`SampleTarget::Text`], rank 0). All null rows
/// when the file has no such column. Reads only the offsets [`ragged_offsets`] needs and the
/// values those rows span.
pub fn ragged_column(
    src: &dyn TensorSource,
    column: &str,
    rows: Range<u64>,
    sample_rank: usize,
    target: &SampleTarget,
) -> Result<ArrayRef, ReadError> {
    let file = src.name();
    let n = rows.end.saturating_sub(rows.start);
    let Some(values) = src.header().tensor(column) else {
        return Ok(new_null_array(
            &sample_target_type(target, sample_rank),
            n as usize,
        ));
    };
    let at = |e: ReadErrorKind| e.at(&file, column);
    let off = ragged_offsets(src, column, rows.clone())?;
    let range = ragged_values_range(values, &off).ok_or_else(|| {
        at(ReadErrorKind::Invalid(format!(
            "rows of {} {:?} are not a whole number of bytes",
            values.dtype, values.shape
        )))
    })?;
    let first = off.first().copied().unwrap_or(0);
    let count = off.last().copied().unwrap_or(0) - first;
    match target {
        SampleTarget::Values(element) => {
            let inner = values.shape.get(1..).unwrap_or_default();
            if sample_rank != inner.len() + 1 {
                return Err(at(ReadErrorKind::Invalid(format!(
                    "expected rows of rank {sample_rank}, the values tensor has shape {:?}",
                    values.shape
                ))));
            }
            if count > MAX_OFFSET {
                return Err(at(too_large("list elements", count)));
            }
            let bytes = src.read(values, range)?;
            let items = sample_array(values.dtype, inner, count, &bytes).map_err(|e| {
                at(match e {
                    ReadErrorKind::U64Overflow { index, value } => ReadErrorKind::U64Overflow {
                        index: index + first * checked_product(inner).unwrap_or(0),
                        value,
                    },
                    e => e,
                })
            })?;
            // every offset is ≤ count ≤ i32::MAX
            let offsets: Vec<i32> = off.iter().map(|&o| (o - first) as i32).collect();
            let list = ListArray::try_new(
                element_field(items.data_type().clone()),
                OffsetBuffer::new(ScalarBuffer::from(offsets)),
                items,
                None,
            )
            .map_err(|e| at(e.into()))?;
            widen_nested(Arc::new(list), element).map_err(at)
        }
        SampleTarget::Bytes | SampleTarget::Text => {
            let total = range.end - range.start;
            if total > MAX_OFFSET {
                return Err(at(too_large("data bytes", total)));
            }
            let bytes = src.read(values, range)?;
            let mut offsets: Vec<i32> = Vec::with_capacity(off.len());
            for &o in &off {
                let b = ragged_bytes(values, o - first).unwrap_or(u64::MAX);
                if b > total {
                    return Err(at(ReadErrorKind::Invalid(format!(
                        "a row of {} elements of shape {:?} is not a whole number of bytes",
                        values.dtype,
                        values.shape.get(1..).unwrap_or_default()
                    ))));
                }
                offsets.push(b as i32);
            }
            if *target == SampleTarget::Text {
                for (i, w) in offsets.windows(2).enumerate() {
                    let row = bytes.get(w[0] as usize..w[1] as usize).unwrap_or_default();
                    if let Err(e) = std::str::from_utf8(row) {
                        return Err(at(ReadErrorKind::NotUtf8 {
                            row: rows.start + i as u64,
                            detail: e.to_string(),
                        }));
                    }
                }
                let array = StringArray::try_new(
                    OffsetBuffer::new(ScalarBuffer::from(offsets)),
                    arrow_buffer::Buffer::from_slice_ref(&bytes),
                    None,
                )
                .map_err(|e| at(e.into()))?;
                return Ok(Arc::new(array));
            }
            let array = BinaryArray::try_new(
                OffsetBuffer::new(ScalarBuffer::from(offsets)),
                arrow_buffer::Buffer::from_slice_ref(&bytes),
                None,
            )
            .map_err(|e| at(e.into()))?;
            Ok(Arc::new(array))
        }
    }
}
