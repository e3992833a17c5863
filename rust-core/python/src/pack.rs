//! Packed token blocks (spec/python.md §3.3): blocks `[b0, b1)` of an epoch's token stream
//! written in one call from the mapped shards' values and the epoch's permuted prefix sums —
//! the tokens, the optional position and document ids (int32 or int64) and `cu_seqlens`
//! (int32). Bytes only, as `gather`: the tokens are copied as their dtype's bytes.
//!
//! The stream: document position `p` of the epoch's order has `lengths[p]` tokens, followed by
//! the eos token when there is one, and ends at stream token `ends[p]` (the prefix sum of the
//! spans); its tokens are elements `[firsts[p], firsts[p] + lengths[p])` of the values of shard
//! number `shards[p]`; `documents[p]` is its document id. Block `b` is stream tokens
//! `[b·seq_len, (b+1)·seq_len)`; a piece is a document's part inside one block.

use crate::gather::{GatherError, Source};

/// One epoch's stream (see the module's comment). Every slice has one entry per position.
pub struct Stream<'a> {
    pub seq_len: u64,
    pub ends: &'a [i64],
    pub lengths: &'a [i64],
    pub shards: &'a [i64],
    pub firsts: &'a [i64],
    pub documents: &'a [i64],
    /// The eos token's bytes (one token of the values' dtype), if any.
    pub eos: Option<&'a [u8]>,
    /// Bytes per token.
    pub token_bytes: usize,
}

/// Where blocks `[b0, b1)` go, laid end to end: `tokens` (`(b1-b0)·seq_len` tokens), the ids
/// asked for (as many values of `ids_bytes`, 4 or 8), `cu_seqlens` (int32, at least pieces + 1).
pub struct Blocks<'a> {
    pub tokens: &'a mut [u8],
    pub position_ids: Option<&'a mut [u8]>,
    pub document_ids: Option<&'a mut [u8]>,
    pub ids_bytes: usize,
    pub cu_seqlens: &'a mut [u8],
}

/// A piece: stream tokens `[pos, end)` of position `p`; its first `take` tokens are elements
/// `[src, src + take)` of shard `shard`'s values, the rest (at most one) the eos.
struct Piece {
    p: usize,
    pos: u64,
    end: u64,
    take: u64,
    shard: usize,
    src: u64,
}

impl Stream<'_> {
    /// Every slice of one length, a token size, an eos of that size.
    pub fn check(&self) -> Result<(), GatherError> {
        let n = self.ends.len();
        let lens = [
            self.lengths.len(),
            self.shards.len(),
            self.firsts.len(),
            self.documents.len(),
        ];
        if lens.iter().any(|&l| l != n) {
            return Err(GatherError::Invalid(format!(
                "pack: the stream's arrays have {n} ends but {lens:?} lengths, shards, firsts and \
                 documents"
            )));
        }
        if self.seq_len == 0 || self.token_bytes == 0 {
            return Err(GatherError::Invalid(format!(
                "pack: seq_len {} and token bytes {} must be >= 1",
                self.seq_len, self.token_bytes
            )));
        }
        if self.eos.is_some_and(|e| e.len() != self.token_bytes) {
            return Err(GatherError::Invalid(format!(
                "pack: an eos of {} bytes for tokens of {}",
                self.eos.map_or(0, <[u8]>::len),
                self.token_bytes
            )));
        }
        Ok(())
    }

    /// Blocks in the stream: its tokens (the last end) over `seq_len`.
    pub fn num_blocks(&self) -> u64 {
        self.ends.last().map_or(0, |&e| e.max(0) as u64) / self.seq_len
    }

    /// The pieces of stream tokens `[lo, hi)` (`hi` a block boundary inside the stream), every
    /// source range checked.
    fn pieces(
        &self,
        sources: &[Option<Source<'_>>],
        lo: u64,
        hi: u64,
    ) -> Result<Vec<Piece>, GatherError> {
        let bad = |m: String| GatherError::Invalid(format!("pack: {m}"));
        let (seq, eos) = (self.seq_len, u64::from(self.eos.is_some()));
        let mut p = self.ends.partition_point(|&e| e <= lo as i64);
        let mut pos = lo;
        let mut out = Vec::new();
        while pos < hi {
            let (Some(&end), Some(&len)) = (self.ends.get(p), self.lengths.get(p)) else {
                return Err(bad(format!(
                    "the stream ends at position {p} before token {pos}"
                )));
            };
            let (Ok(end), Ok(len)) = (u64::try_from(end), u64::try_from(len)) else {
                return Err(bad(format!("position {p}: a negative end or length")));
            };
            let prev = if p == 0 { 0 } else { self.ends[p - 1] };
            let start = end
                .checked_sub(len + eos)
                .filter(|&s| s as i64 == prev && s <= pos);
            let Some(start) = start else {
                return Err(bad(format!(
                    "position {p}: its span of {len} tokens (+{eos} eos) ending at {end} does not \
                     hold token {pos}: the ends are not the prefix sum of the spans"
                )));
            };
            let stop = end.min((pos / seq + 1) * seq);
            let within = pos - start;
            let take = (stop - pos).min(len.saturating_sub(within));
            let (s, first) = (self.shards[p], self.firsts[p]);
            let src = usize::try_from(s).ok().and_then(|s| sources.get(s));
            let Some(src) = src else {
                return Err(GatherError::Index(format!(
                    "pack: position {p}: shard {s} is out of range ({} shards)",
                    sources.len()
                )));
            };
            let Some(src) = src else {
                return Err(bad(format!(
                    "position {p}: the values of shard {s} are not set"
                )));
            };
            let from = u64::try_from(first)
                .ok()
                .and_then(|f| f.checked_add(within));
            if from
                .and_then(|f| f.checked_add(take))
                .is_none_or(|e| e > src.rows)
            {
                return Err(GatherError::Index(format!(
                    "pack: position {p}: tokens [{first} + {within}, + {take}) are out of range for \
                     shard {s} ({} elements)",
                    src.rows
                )));
            }
            out.push(Piece {
                p,
                pos,
                end: stop,
                take,
                shard: s as usize,
                src: from.unwrap_or(0),
            });
            pos = stop;
            while self.ends.get(p).is_some_and(|&e| e <= pos as i64) {
                p += 1;
            }
        }
        Ok(out)
    }
}

/// Writes blocks `[b0, b1)` of `stream` into `out` from `sources` (shard number → its values:
/// `rows` = elements); returns the number of `cu_seqlens` entries written (pieces + 1). Checks
/// everything before writing a byte: the block range, every piece's source range, each output's
/// size, a document id that does not fit 4-byte ids.
pub fn build_blocks(
    stream: &Stream<'_>,
    sources: &[Option<Source<'_>>],
    b0: u64,
    b1: u64,
    out: &mut Blocks<'_>,
) -> Result<usize, GatherError> {
    stream.check()?;
    let blocks = stream.num_blocks();
    if b0 >= b1 || b1 > blocks {
        return Err(GatherError::Index(format!(
            "pack: blocks [{b0}, {b1}) are not a non-empty range of the stream's {blocks} blocks"
        )));
    }
    let seq = stream.seq_len;
    let (lo, hi) = (b0 * seq, b1 * seq); // <= the last end: no overflow
    let tokens = hi - lo;
    if tokens > i32::MAX as u64 {
        return Err(GatherError::Invalid(format!(
            "pack: {tokens} tokens in one call: cu_seqlens (int32) cannot count them"
        )));
    }
    let tokens = tokens as usize;
    if !matches!(out.ids_bytes, 4 | 8) {
        return Err(GatherError::Invalid(format!(
            "pack: ids of {} bytes (4 or 8)",
            out.ids_bytes
        )));
    }
    let pieces = stream.pieces(sources, lo, hi)?;
    let small = |what: &str, have: usize, need: usize| {
        GatherError::Invalid(format!(
            "pack: an output of {have} bytes for {what} cannot hold {need} bytes"
        ))
    };
    let tb = stream.token_bytes;
    if out.tokens.len() < tokens * tb {
        return Err(small("tokens", out.tokens.len(), tokens * tb));
    }
    let ib = out.ids_bytes;
    for (what, ids) in [
        ("position_ids", &out.position_ids),
        ("document_ids", &out.document_ids),
    ] {
        if let Some(ids) = ids {
            if ids.len() < tokens * ib {
                return Err(small(what, ids.len(), tokens * ib));
            }
        }
    }
    if out.cu_seqlens.len() < (pieces.len() + 1) * 4 {
        return Err(small(
            "cu_seqlens",
            out.cu_seqlens.len(),
            (pieces.len() + 1) * 4,
        ));
    }
    if ib == 4 && out.document_ids.is_some() {
        if let Some(pc) = pieces
            .iter()
            .find(|pc| i32::try_from(stream.documents[pc.p]).is_err())
        {
            return Err(GatherError::Invalid(format!(
                "pack: document id {} does not fit int32 ids",
                stream.documents[pc.p]
            )));
        }
    }
    for (k, pc) in pieces.iter().enumerate() {
        let (b, n, t) = (
            (pc.pos - lo) as usize,
            (pc.end - pc.pos) as usize,
            pc.take as usize,
        );
        // in range: checked by pieces() and above
        let src = sources[pc.shard].as_ref().map_or(&[][..], |s| s.data);
        let from = pc.src as usize * tb;
        out.tokens[b * tb..(b + t) * tb].copy_from_slice(&src[from..from + t * tb]);
        if let (true, Some(eos)) = (t < n, stream.eos) {
            out.tokens[(b + t) * tb..(b + t + 1) * tb].copy_from_slice(eos);
        }
        if let Some(ids) = out.position_ids.as_deref_mut() {
            write_ids(&mut ids[b * ib..(b + n) * ib], ib, |i| i as i64);
        }
        if let Some(ids) = out.document_ids.as_deref_mut() {
            let d = stream.documents[pc.p];
            write_ids(&mut ids[b * ib..(b + n) * ib], ib, |_| d);
        }
        out.cu_seqlens[k * 4..k * 4 + 4].copy_from_slice(&(b as i32).to_ne_bytes());
    }
    let k = pieces.len();
    out.cu_seqlens[k * 4..k * 4 + 4].copy_from_slice(&(tokens as i32).to_ne_bytes());
    Ok(k + 1)
}

/// `value(i)` for the i-th id of `out`, native `ib`-byte integers (values checked to fit).
fn write_ids(out: &mut [u8], ib: usize, value: impl Fn(usize) -> i64) {
    if ib == 4 {
        for (i, o) in out.chunks_exact_mut(4).enumerate() {
            o.copy_from_slice(&(value(i) as i32).to_ne_bytes());
        }
    } else {
        for (i, o) in out.chunks_exact_mut(8).enumerate() {
            o.copy_from_slice(&value(i).to_ne_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A brute-force stream: documents of `lens` (their tokens 100·doc + i, i16 in shard
    /// `doc % 2`), order `order`, then per block its tokens, positions, documents and cuts.
    fn reference(
        lens: &[i64],
        order: &[usize],
        eos: Option<i16>,
        seq: usize,
    ) -> (Vec<i16>, Vec<i64>, Vec<i64>, Vec<Vec<i32>>) {
        let mut toks = Vec::new();
        let mut owner = Vec::new();
        for &d in order {
            for i in 0..lens[d] {
                toks.push((100 * d as i64 + i) as i16);
                owner.push(d as i64);
            }
            if let Some(e) = eos {
                toks.push(e);
                owner.push(d as i64);
            }
        }
        let n = toks.len() / seq * seq;
        let (mut pos, mut cus) = (Vec::new(), Vec::new());
        for b in 0..n / seq {
            let mut cu = Vec::new();
            for i in b * seq..(b + 1) * seq {
                let new = i == b * seq || owner[i] != owner[i - 1];
                if new {
                    cu.push((i - b * seq) as i32);
                }
                pos.push(if new { 0 } else { pos[i - 1] + 1 });
            }
            cu.push(seq as i32);
            cus.push(cu);
        }
        (toks[..n].to_vec(), pos, owner[..n].to_vec(), cus)
    }

    fn ne16(v: &[i16]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    #[test]
    fn blocks_equal_the_brute_force_stream() {
        let lens: Vec<i64> = vec![3, 0, 9, 1, 0, 14, 2, 5, 0, 7];
        let order = [4, 2, 9, 0, 1, 7, 5, 3, 8, 6];
        // shard s holds the documents d with d % 2 == s, in d order
        let mut values = [Vec::new(), Vec::new()];
        let mut firsts = vec![0i64; lens.len()];
        for d in 0..lens.len() {
            let v = &mut values[d % 2];
            firsts[d] = v.len() as i64;
            v.extend((0..lens[d]).map(|i| (100 * d as i64 + i) as i16));
        }
        let bytes = [ne16(&values[0]), ne16(&values[1])];
        let sources = [0, 1].map(|s| {
            Some(Source {
                data: &bytes[s][..],
                rows: values[s].len() as u64,
            })
        });
        for (eos, seq) in [(None, 4usize), (Some(-1i16), 5), (Some(7), 1), (None, 41)] {
            let eos_bytes = eos.map(i16::to_ne_bytes);
            let span = |d: usize| lens[d] + i64::from(eos.is_some());
            let ends: Vec<i64> = order
                .iter()
                .scan(0, |a, &d| {
                    *a += span(d);
                    Some(*a)
                })
                .collect();
            let per = |f: &dyn Fn(usize) -> i64| order.iter().map(|&d| f(d)).collect::<Vec<_>>();
            let (ls, ss, fs, ds) = (
                per(&|d| lens[d]),
                per(&|d| (d % 2) as i64),
                per(&|d| firsts[d]),
                per(&|d| d as i64),
            );
            let stream = Stream {
                seq_len: seq as u64,
                ends: &ends,
                lengths: &ls,
                shards: &ss,
                firsts: &fs,
                documents: &ds,
                eos: eos_bytes.as_ref().map(|e| &e[..]),
                token_bytes: 2,
            };
            let (toks, pos, docs, cus) = reference(&lens, &order, eos, seq);
            let nb = stream.num_blocks() as usize;
            assert_eq!(nb, toks.len() / seq);
            for ib in [4, 8] {
                for (b0, b1) in [(0, nb), (1, nb.min(3)), (nb - 1, nb)] {
                    if b0 >= b1 {
                        continue;
                    }
                    let n = (b1 - b0) * seq;
                    let (mut t, mut p, mut d, mut c) = (
                        vec![0u8; n * 2],
                        vec![0u8; n * ib],
                        vec![0u8; n * ib],
                        vec![0u8; 4 * (n + 1)],
                    );
                    let mut out = Blocks {
                        tokens: &mut t,
                        position_ids: Some(&mut p),
                        document_ids: Some(&mut d),
                        ids_bytes: ib,
                        cu_seqlens: &mut c,
                    };
                    let k = build_blocks(&stream, &sources, b0 as u64, b1 as u64, &mut out);
                    assert!(k.is_ok(), "{k:?}");
                    let k = k.unwrap_or(0);
                    let range = b0 * seq..b1 * seq;
                    assert_eq!(
                        t,
                        ne16(&toks[range.clone()]),
                        "eos {eos:?} seq {seq} [{b0}, {b1})"
                    );
                    let ids = |v: &[i64]| -> Vec<u8> {
                        v.iter()
                            .flat_map(|&x| {
                                if ib == 4 {
                                    (x as i32).to_ne_bytes().to_vec()
                                } else {
                                    x.to_ne_bytes().to_vec()
                                }
                            })
                            .collect()
                    };
                    assert_eq!(p, ids(&pos[range.clone()]));
                    assert_eq!(d, ids(&docs[range]));
                    let mut want = vec![0i32];
                    for (j, cu) in cus[b0..b1].iter().enumerate() {
                        want.extend(cu[1..].iter().map(|&x| x + (j * seq) as i32));
                    }
                    let got: Vec<i32> = c[..4 * k]
                        .chunks_exact(4)
                        .map(|x| i32::from_ne_bytes([x[0], x[1], x[2], x[3]]))
                        .collect();
                    assert_eq!(got, want);
                }
            }
        }
    }

    #[test]
    fn refuses_what_it_cannot_write_before_writing() {
        let vals = ne16(&[1, 2, 3, 4, 5, 6]);
        let src = [
            Some(Source {
                data: &vals,
                rows: 6,
            }),
            None,
        ];
        let ends = [4i64, 6];
        let stream =
            |shards: &'static [i64], firsts: &'static [i64], docs: &'static [i64]| Stream {
                seq_len: 2,
                ends: &ends,
                lengths: &[4, 2],
                shards,
                firsts,
                documents: docs,
                eos: None,
                token_bytes: 2,
            };
        let run = |s: &Stream<'_>, b0, b1, ib, cu: usize| {
            let (mut t, mut d, mut c) = (vec![9u8; 12], vec![9u8; 48], vec![9u8; cu]);
            let r = build_blocks(
                s,
                &src,
                b0,
                b1,
                &mut Blocks {
                    tokens: &mut t,
                    position_ids: None,
                    document_ids: Some(&mut d),
                    ids_bytes: ib,
                    cu_seqlens: &mut c,
                },
            );
            if r.is_err() {
                assert!(
                    t.iter().chain(&d).chain(&c).all(|&x| x == 9),
                    "nothing written"
                );
            }
            r
        };
        let ok = stream(&[0, 0], &[0, 4], &[0, 1]);
        assert_eq!(run(&ok, 0, 3, 8, 16), Ok(4));
        let e = run(&ok, 0, 4, 8, 16);
        assert!(
            matches!(e, Err(GatherError::Index(m)) if m.contains("[0, 4) are not a non-empty range of the stream's 3 blocks"))
        );
        assert!(matches!(run(&ok, 1, 1, 8, 16), Err(GatherError::Index(_))));
        let e = run(&ok, 0, 3, 8, 12);
        assert!(
            matches!(e, Err(GatherError::Invalid(m)) if m.contains("cu_seqlens cannot hold 16 bytes"))
        );
        let e = run(&ok, 0, 3, 2, 16);
        assert!(matches!(e, Err(GatherError::Invalid(m)) if m.contains("ids of 2 bytes")));
        let e = run(&stream(&[0, 1], &[0, 0], &[0, 1]), 0, 3, 8, 16);
        assert!(
            matches!(e, Err(GatherError::Invalid(m)) if m.contains("values of shard 1 are not set"))
        );
        let e = run(&stream(&[0, 2], &[0, 0], &[0, 1]), 0, 3, 8, 16);
        assert!(
            matches!(e, Err(GatherError::Index(m)) if m.contains("shard 2 is out of range (2 shards)"))
        );
        let e = run(&stream(&[0, 0], &[0, 5], &[0, 1]), 0, 3, 8, 16);
        assert!(
            matches!(e, Err(GatherError::Index(m)) if m.contains("position 1: tokens [5 + 0, + 2) are out of range for shard 0 (6 elements)"))
        );
        let e = run(&stream(&[0, 0], &[0, 4], &[0, 1 << 40]), 0, 3, 4, 16);
        assert!(
            matches!(e, Err(GatherError::Invalid(m)) if m.contains("document id 1099511627776 does not fit int32"))
        );
        let bad_ends = [4i64, 7];
        let s = Stream {
            ends: &bad_ends,
            ..stream(&[0, 0], &[0, 4], &[0, 1])
        };
        let e = run(&s, 0, 3, 8, 16);
        assert!(matches!(e, Err(GatherError::Invalid(m)) if m.contains("not the prefix sum")));
    }
}
