//! One gather of a shuffled batch: the rows `rows[k]` of the shards `shards[k]` of every fixed
//! column copied, row after row, into the column's place in the output block (spec/python.md §3,
//! spec/performance.md §10.8). Bytes only: every dtype is its rows' bytes, so the result is the
//! bytes of numpy's `take` per shard and column, in one call instead of one per shard and column.

/// A column's rows in one shard: the whole column tensor, `rows` rows of the column's row bytes.
pub struct Source<'a> {
    pub data: &'a [u8],
    pub rows: u64,
}

/// A fixed column of the batch: where its `rows.len()` rows go and the shards they come from
/// (`sources[s]` for shard number `s` of the index list).
pub struct Column<'a> {
    pub name: &'a str,
    pub row_bytes: usize,
    pub out: &'a mut [u8],
    pub sources: Vec<Source<'a>>,
}

/// Why a gather was refused: `Index` for a shard or row out of range, `Invalid` for anything else.
#[derive(Debug, PartialEq, Eq)]
pub enum GatherError {
    Index(String),
    Invalid(String),
}

/// Copies row `rows[k]` of shard `shards[k]` of every column to row `k` of its output. Checks
/// everything before copying a byte: no index list (empty or of different lengths), a shard or
/// row out of range (naming the batch position, the shard and its row count), a source whose
/// bytes are not its rows, an output too small.
pub fn gather_rows(
    columns: &mut [Column<'_>],
    shards: &[i64],
    rows: &[i64],
) -> Result<(), GatherError> {
    let n = rows.len();
    if n == 0 {
        return Err(GatherError::Invalid(
            "gather: empty index list (a batch has at least one row)".into(),
        ));
    }
    if shards.len() != n {
        return Err(GatherError::Invalid(format!(
            "gather: {} shard indices for {n} row indices",
            shards.len()
        )));
    }
    for c in columns.iter() {
        let need = n.checked_mul(c.row_bytes);
        if need.is_none_or(|need| c.out.len() < need) {
            return Err(GatherError::Invalid(format!(
                "gather: column '{}': an output of {} bytes cannot hold {n} rows of {} bytes",
                c.name,
                c.out.len(),
                c.row_bytes
            )));
        }
        check_sources(c)?;
        for (k, (&s, &r)) in shards.iter().zip(rows).enumerate() {
            let src = usize::try_from(s).ok().and_then(|s| c.sources.get(s));
            let Some(src) = src else {
                return Err(GatherError::Index(format!(
                    "gather: batch row {k}: shard {s} is out of range ({} shards)",
                    c.sources.len()
                )));
            };
            if !u64::try_from(r).is_ok_and(|r| r < src.rows) {
                return Err(GatherError::Index(format!(
                    "gather: batch row {k}: row {r} is out of range for shard {s} ({} rows)",
                    src.rows
                )));
            }
        }
    }
    for c in columns.iter_mut() {
        let rb = c.row_bytes;
        if rb == 0 {
            continue;
        }
        for ((out, &s), &r) in c.out.chunks_exact_mut(rb).zip(shards).zip(rows) {
            // in range: checked above for every k
            let (s, r) = (s as usize, r as usize);
            out.copy_from_slice(&c.sources[s].data[r * rb..(r + 1) * rb]);
        }
    }
    Ok(())
}

/// Copies, for every batch row `k`, the elements `[starts[k], starts[k] + lengths[k])` of shard
/// `shards[k]` of a ragged column's values (`row_bytes`: bytes per element; a source's `rows`:
/// its elements) to the output one row after the other (row `k` at the sum of the lengths before
/// it). Checks everything before copying a byte, as [`gather_rows`] does.
pub fn gather_spans(
    column: &mut Column<'_>,
    shards: &[i64],
    starts: &[i64],
    lengths: &[i64],
) -> Result<(), GatherError> {
    let n = starts.len();
    if n == 0 {
        return Err(GatherError::Invalid(
            "gather: empty index list (a batch has at least one row)".into(),
        ));
    }
    if shards.len() != n || lengths.len() != n {
        return Err(GatherError::Invalid(format!(
            "gather: {} shard indices and {} lengths for {n} row starts",
            shards.len(),
            lengths.len()
        )));
    }
    let c = &*column;
    check_sources(c)?;
    let mut total: u64 = 0;
    for k in 0..n {
        let (s, b, l) = (shards[k], starts[k], lengths[k]);
        let Some(src) = usize::try_from(s).ok().and_then(|s| c.sources.get(s)) else {
            return Err(GatherError::Index(format!(
                "gather: column '{}', batch row {k}: shard {s} is out of range ({} shards)",
                c.name,
                c.sources.len()
            )));
        };
        let end = u64::try_from(b)
            .ok()
            .zip(u64::try_from(l).ok())
            .and_then(|(b, l)| b.checked_add(l));
        if end.is_none_or(|e| e > src.rows) {
            return Err(GatherError::Index(format!(
                "gather: column '{}', batch row {k}: elements [{b}, {b} + {l}) are out of range for \
                 shard {s} ({} elements)",
                c.name, src.rows
            )));
        }
        // l >= 0: checked above
        total = total.checked_add(l as u64).ok_or_else(|| {
            GatherError::Invalid(format!(
                "gather: column '{}': more than 2^64 elements",
                c.name
            ))
        })?;
    }
    let need = usize::try_from(total)
        .ok()
        .and_then(|t| t.checked_mul(c.row_bytes));
    if need.is_none_or(|need| c.out.len() < need) {
        return Err(GatherError::Invalid(format!(
            "gather: column '{}': an output of {} bytes cannot hold {total} elements of {} bytes",
            c.name,
            c.out.len(),
            c.row_bytes
        )));
    }
    let rb = column.row_bytes;
    let mut o = 0;
    for k in 0..n {
        // in range: checked above
        let (s, b, l) = (shards[k] as usize, starts[k] as usize, lengths[k] as usize);
        let bytes = &column.sources[s].data[b * rb..(b + l) * rb];
        column.out[o..o + bytes.len()].copy_from_slice(bytes);
        o += bytes.len();
    }
    Ok(())
}

/// Every source of `c` holds exactly its rows of `c.row_bytes`.
fn check_sources(c: &Column<'_>) -> Result<(), GatherError> {
    for (s, src) in c.sources.iter().enumerate() {
        let whole = usize::try_from(src.rows)
            .ok()
            .and_then(|r| r.checked_mul(c.row_bytes));
        if whole != Some(src.data.len()) {
            return Err(GatherError::Invalid(format!(
                "gather: column '{}', shard {s}: {} bytes are not {} rows of {} bytes",
                c.name,
                src.data.len(),
                src.rows,
                c.row_bytes
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(rows: u64, rb: usize, seed: u8) -> Vec<u8> {
        (0..rows as usize * rb)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn copies_the_rows_of_every_shard_and_column() {
        let (a0, a1) = (shard(5, 4, 1), shard(3, 4, 2));
        let (b0, b1) = (shard(5, 1, 3), shard(3, 1, 4));
        let (mut oa, mut ob) = (vec![0u8; 16], vec![0u8; 4]);
        let shards = [1, 0, 0, 1];
        let rows = [2, 4, 0, 0];
        let mut cols = vec![
            Column {
                name: "a",
                row_bytes: 4,
                out: &mut oa,
                sources: vec![Source { data: &a0, rows: 5 }, Source { data: &a1, rows: 3 }],
            },
            Column {
                name: "b",
                row_bytes: 1,
                out: &mut ob,
                sources: vec![Source { data: &b0, rows: 5 }, Source { data: &b1, rows: 3 }],
            },
        ];
        assert_eq!(gather_rows(&mut cols, &shards, &rows), Ok(()));
        drop(cols);
        let src_a = [&a0, &a1];
        let src_b = [&b0, &b1];
        for k in 0..4 {
            let (s, r) = (shards[k] as usize, rows[k] as usize);
            assert_eq!(oa[k * 4..k * 4 + 4], src_a[s][r * 4..r * 4 + 4]);
            assert_eq!(ob[k], src_b[s][r]);
        }
    }

    #[test]
    fn refuses_bad_index_lists_before_writing() {
        let a0 = shard(2, 2, 0);
        let mut out = vec![7u8; 4];
        let run = |shards: &[i64], rows: &[i64], out: &mut [u8]| {
            let mut cols = vec![Column {
                name: "a",
                row_bytes: 2,
                out,
                sources: vec![Source { data: &a0, rows: 2 }],
            }];
            gather_rows(&mut cols, shards, rows)
        };
        let e = run(&[], &[], &mut out);
        assert!(matches!(e, Err(GatherError::Invalid(m)) if m.contains("empty index list")));
        let e = run(&[0, 0], &[0, 2], &mut out);
        assert!(matches!(e, Err(GatherError::Index(m))
            if m.contains("batch row 1: row 2 is out of range for shard 0 (2 rows)")));
        let e = run(&[0, -1], &[0, 0], &mut out);
        assert!(matches!(e, Err(GatherError::Index(m)) if m.contains("shard -1 is out of range")));
        let e = run(&[0, 1], &[0, 0], &mut out);
        assert!(
            matches!(e, Err(GatherError::Index(m)) if m.contains("shard 1 is out of range (1 shards)"))
        );
        let e = run(&[0, 0], &[-1, 0], &mut out);
        assert!(matches!(e, Err(GatherError::Index(m)) if m.contains("row -1 is out of range")));
        let e = run(&[0], &[0, 1], &mut out);
        assert!(matches!(e, Err(GatherError::Invalid(m)) if m.contains("1 shard indices for 2")));
        let e = run(&[0, 0, 0], &[0, 1, 1], &mut out);
        assert!(matches!(e, Err(GatherError::Invalid(m)) if m.contains("cannot hold 3 rows")));
        assert_eq!(out, [7u8; 4], "nothing written by a refused gather");
        let mut cols = vec![Column {
            name: "a",
            row_bytes: 2,
            out: &mut out,
            sources: vec![Source { data: &a0, rows: 3 }],
        }];
        let e = gather_rows(&mut cols, &[0], &[0]);
        assert!(matches!(e, Err(GatherError::Invalid(m)) if m.contains("4 bytes are not 3 rows")));
    }

    #[test]
    fn copies_spans_of_ragged_values_one_row_after_the_other() {
        let (v0, v1) = (shard(6, 2, 5), shard(3, 2, 9));
        let mut out = vec![0u8; 16];
        let mut col = Column {
            name: "tokens",
            row_bytes: 2,
            out: &mut out,
            sources: vec![Source { data: &v0, rows: 6 }, Source { data: &v1, rows: 3 }],
        };
        let (shards, starts, lengths) = ([1, 0, 0, 1], [1, 4, 0, 0], [2, 0, 3, 1]);
        assert_eq!(gather_spans(&mut col, &shards, &starts, &lengths), Ok(()));
        let want: Vec<u8> = [&v1[2..6], &v0[8..8], &v0[0..6], &v1[0..2]].concat();
        assert_eq!(out[..12], want[..]);
        assert_eq!(out[12..], [0u8; 4], "nothing written past the rows");
        let mut col = Column {
            name: "tokens",
            row_bytes: 2,
            out: &mut out,
            sources: vec![Source { data: &v0, rows: 6 }],
        };
        let e = gather_spans(&mut col, &[0], &[5], &[2]);
        assert!(matches!(e, Err(GatherError::Index(m))
            if m.contains("column 'tokens', batch row 0: elements [5, 5 + 2) are out of range for shard 0 (6 elements)")));
        let e = gather_spans(&mut col, &[0], &[0], &[-1]);
        assert!(matches!(e, Err(GatherError::Index(_))));
        let e = gather_spans(&mut col, &[], &[], &[]);
        assert!(matches!(e, Err(GatherError::Invalid(m)) if m.contains("empty index list")));
        let e = gather_spans(&mut col, &[0, 0], &[0, 0], &[6, 6]);
        assert!(matches!(e, Err(GatherError::Invalid(m)) if m.contains("cannot hold 12 elements")));
    }
}
