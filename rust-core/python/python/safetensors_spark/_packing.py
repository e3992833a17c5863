"""Token packing (spec/python.md §3.3), in numpy only (no torch), so it is testable alone.

* :class:`Packing` — the option: which ragged column holds the tokens, ``seq_len``, ``eos``.
* :class:`PackedEpoch` — one epoch's token stream: the documents in the epoch's order
  (:class:`~safetensors_spark._sampling.EpochOrder`), each followed by ``eos`` when given; block
  ``b`` is stream tokens ``[b·seq_len, (b+1)·seq_len)``. Built with one prefix sum over the
  permuted document lengths; a block's tokens are copied out of the shards' values.
"""

import numpy as np

INTEGER_DTYPES = ("U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64")


class Packing:
    """``Packing(column, seq_len, eos=None)``: pack the documents of ragged integer column
    ``column`` into blocks of ``seq_len`` tokens, each document followed by token ``eos`` when
    given. Pass it as ``SafetensorsIterableDataset(..., pack=Packing(...))``."""

    def __init__(self, column, seq_len, eos=None):
        if not isinstance(column, str):
            raise ValueError(f"Packing: column must be a column name (str), got {column!r}")
        if not isinstance(seq_len, (int, np.integer)) or isinstance(seq_len, bool) or seq_len < 1:
            raise ValueError(f"Packing: seq_len must be an integer >= 1 (tokens per block), got {seq_len!r}")
        if eos is not None and (not isinstance(eos, (int, np.integer)) or isinstance(eos, bool)):
            raise ValueError(f"Packing: eos must be an integer token id or None, got {eos!r}")
        self.column, self.seq_len, self.eos = column, int(seq_len), None if eos is None else int(eos)

    def __repr__(self):
        return f"Packing(column={self.column!r}, seq_len={self.seq_len}, eos={self.eos})"

    def state(self):
        return {"column": self.column, "seq_len": self.seq_len, "eos": self.eos}

    def check(self, dataset):
        """Refuses a column that is not a ragged column of integer tokens of ``dataset``, or an
        ``eos`` its dtype cannot hold."""
        c = self.column
        if c not in dataset.schema:
            raise ValueError(f"Packing: column '{c}' is not in dataset {dataset.path}; its columns are {dataset.columns}")
        dtype = dataset.schema[c]["dtype"]
        if c not in dataset.ragged:
            raise ValueError(f"Packing: column '{c}' of dataset {dataset.path} is not ragged (schema shape "
                             f"{dataset.schema[c].get('shape')}); packing takes a ragged column of token ids "
                             f"(its ragged columns: {sorted(dataset.ragged)})")
        if dtype not in INTEGER_DTYPES or dataset.ragged[c]:
            raise ValueError(f"Packing: column '{c}' of dataset {dataset.path} holds {dtype} rows of inner shape "
                             f"{dataset.ragged[c]}; packing takes integer token ids ({', '.join(INTEGER_DTYPES)}) "
                             f"with inner shape []")
        if self.eos is not None:
            info = np.iinfo(dataset._dtypes[c])
            if not info.min <= self.eos <= info.max:
                raise ValueError(f"Packing: eos={self.eos} does not fit column '{c}' ({dtype}: {info.min}..{info.max})")


def document_lengths(dataset, column):
    """Every document's token count, in sample order (int64 [N]), from the shards' offsets."""
    parts = [np.diff(dataset.offsets(s, column))[: s.samples] for s in dataset.shards]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def stream_tokens(lengths, eos):
    return int(lengths.sum()) + (len(lengths) if eos is not None else 0)


class PackedEpoch:
    """The blocks of one epoch. ``order``: the epoch's EpochOrder over the documents;
    ``lengths``: :func:`document_lengths`."""

    def __init__(self, dataset, packing, order, lengths):
        self.ds, self.packing = dataset, packing
        n = len(lengths)
        shard_idx, rows = order.locate_all()
        firsts = np.asarray([s.offset for s in dataset.shards], dtype=np.int64)
        self.shard_of, self.row_of = shard_idx, rows
        self.doc = firsts[shard_idx] + rows  # global sample index of the document at each position
        self.doc_len = lengths[self.doc]
        span = self.doc_len + (1 if packing.eos is not None else 0)
        self.ends = np.cumsum(span)
        self.starts = self.ends - span
        total = int(self.ends[-1]) if n else 0
        self.num_blocks = total // packing.seq_len
        self.dropped_tokens = total - self.num_blocks * packing.seq_len
        self.dtype = dataset._dtypes[packing.column]
        self._values = {}  # shard index -> its values (local shards: a view of the map)

    def blocks(self, b0, b1):
        """Blocks ``[b0, b1)`` as numpy arrays: ``tokens``, ``position_ids`` (int64) and
        ``document_ids`` (int64) of shape ``[b1 - b0, seq_len]``, and ``cu_seqlens`` (int32): the
        boundaries of the pieces (a document's part inside one block) in the blocks laid end to
        end, from 0 to ``(b1 - b0) · seq_len``."""
        seq, eos = self.packing.seq_len, self.packing.eos
        lo, hi = b0 * seq, b1 * seq
        # documents overlapping [lo, hi): a piece starts at every block start and document start
        d0 = int(np.searchsorted(self.ends, lo, side="right"))
        d1 = int(np.searchsorted(self.ends, hi - 1, side="right")) if hi > lo else d0 - 1
        cuts = np.union1d(np.arange(lo, hi, seq, dtype=np.int64), self.starts[d0 + 1: d1 + 1])
        cuts = cuts[(cuts >= lo) & (cuts < hi)]
        piece_len = np.diff(np.append(cuts, hi))
        keep = piece_len > 0  # a document of no tokens and no eos is no piece
        cuts, piece_len = cuts[keep], piece_len[keep]
        docs = np.searchsorted(self.ends, cuts, side="right")
        within = cuts - self.starts[docs]
        out = np.empty(hi - lo, dtype=self.dtype)
        begin = cuts - lo
        take = np.minimum(piece_len, np.maximum(self.doc_len[docs] - within, 0))
        ds, column = self.ds, self.packing.column
        local = ds._store.is_local
        shards = [ds.shards[s] for s in np.unique(self.shard_of[docs]).tolist()]
        for shard in shards if local else ():
            ds.check_unchanged(shard)
        for p, d in enumerate(docs.tolist()):
            k = int(take[p])
            if k:
                s = int(self.shard_of[d])
                shard = ds.shards[s]
                e = int(ds.offsets(shard, column)[self.row_of[d]]) + int(within[p])
                if local:  # the shard's values, a view of its map, kept for the epoch
                    v = self._values.get(s)
                    if v is None:
                        v = self._values[s] = ds.ragged_values(shard, column, 0,
                                                               int(ds._header(shard)[column].shape[0]))
                    out[begin[p]: begin[p] + k] = v[e: e + k]
                else:  # one range read of the piece
                    out[begin[p]: begin[p] + k] = ds.ragged_values(shard, column, e, e + k)
            if k < piece_len[p]:  # the piece ends with its document's eos
                out[begin[p] + k] = eos
        for shard in shards if local else ():
            ds.check_unchanged(shard)
        start_of = np.repeat(begin, piece_len)
        position_ids = np.arange(hi - lo, dtype=np.int64) - start_of
        document_ids = np.repeat(self.doc[docs], piece_len)
        cu = np.append(begin, hi - lo).astype(np.int32)
        n = b1 - b0
        return {"tokens": out.reshape(n, seq), "position_ids": position_ids.reshape(n, seq),
                "document_ids": document_ids.reshape(n, seq), "cu_seqlens": cu}
