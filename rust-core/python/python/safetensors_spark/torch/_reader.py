"""Batches cut out of shard memory as torch tensors: views of the map where the rows are one
contiguous run in this process, else gathered into fresh (or, in a DataLoader worker, shared)
memory, one buffer per batch for all columns."""

import math

import numpy as np
import torch
import torch.utils.data

from .. import _native
from .._dataset import Ragged, offsets_name
from ._handoff import new_shared_block


def _address(a):
    return a.__array_interface__["data"][0]


def gather_rows(columns, shards, rows):
    """Rows ``rows[k]`` of sources ``shards[k]`` of every column into row ``k`` of its output, in
    one call of the Rust gather (``_native.gather_rows``). ``columns``: ``[(name, output array,
    [source array per shard number])]``, arrays of the column's rows (first dimension); every
    dtype is copied as bytes. A shard or row out of range is an ``IndexError``, an empty index
    list a ``ValueError``."""
    specs, keep = _gather_specs(columns)
    _native.gather_rows(specs, _int64_bytes(shards), _int64_bytes(rows))
    del keep


def _gather_specs(columns):
    """``(specs, arrays to keep alive for the call)`` of ``[(name, output, sources)]``."""
    specs, keep = [], []
    for name, out, sources in columns:
        row_bytes = out.itemsize * math.prod(out.shape[1:])
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError(f"gather: column '{name}': the output is not a writable C-contiguous array")
        srcs = []
        for a in sources:
            a = np.ascontiguousarray(a)
            keep.append(a)
            if a.itemsize * math.prod(a.shape[1:]) != row_bytes:
                raise ValueError(f"gather: column '{name}': rows of {a.dtype}{list(a.shape[1:])} in a shard "
                                 f"where the batch has {out.dtype}{list(out.shape[1:])}")
            srcs.append((_address(a), a.nbytes, a.shape[0]))
        specs.append((name, row_bytes, (_address(out), out.nbytes), srcs))
    return specs, keep


def gather_ragged(name, out, sources, shards, starts, lengths):
    """Elements ``[starts[k], starts[k] + lengths[k])`` of ragged column ``name``'s values in
    source ``shards[k]``, row after row, into ``out`` (``[elements, *inner_shape]``), in one call
    of the Rust gather (``_native.gather_ragged``); errors as :func:`gather_rows`."""
    (spec,), keep = _gather_specs([(name, out, sources)])
    _native.gather_ragged(spec, _int64_bytes(shards), _int64_bytes(starts), _int64_bytes(lengths))
    del keep


def _int64_bytes(a):
    return np.ascontiguousarray(a, dtype=np.int64).tobytes()


def to_torch(array, dtype):
    """A torch tensor sharing ``array``'s memory. BF16 goes through its uint16 bits."""
    if dtype == "BF16":
        return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(array)


class BatchReader:
    """Cuts batches out of shard memory: a contiguous run of rows is a view (local) or one range
    read (remote); scattered rows are one Rust gather over every fixed column and shard
    (:func:`gather_rows`); KV rows are stacked."""

    def __init__(self, dataset, columns, cache_shards):
        self.ds = dataset
        self.columns = columns
        self.dtypes = {c: dataset.schema[c]["dtype"] for c in columns}
        self.cache_shards = max(1, int(cache_shards))
        self._full = {}  # (shard index, column) -> whole column array (remote: LRU)
        self.pool = None  # a worker's BlockPool (loader() with several batches per message)
        self.slot = None  # the pooled block the last batch went into: (worker, slot, block|None, specs)

    def _column(self, shard, column):
        key = (shard.index, column)
        a = self._full.get(key)
        if a is None:
            # only gathered from (never handed out): remote, a read-only view of the read-ahead's
            # buffer, no copy of its own (spec/performance.md §13.7)
            a = self.ds._tensor_array(shard, self.ds._header(shard)[column], view=True)
            # local: a view of the process's map of the shard, kept (costs no memory of its own);
            # remote: kept for the last `cache_shards` shards
            if not self.ds._store.is_local and len(self._full) >= self.cache_shards * len(self.columns):
                self._full.pop(next(iter(self._full)))
            self._full[key] = a
        return a

    def _torch(self, arrays):
        return {c: to_torch(a, self.dtypes.get(c, "I64")) for c, a in arrays.items()}

    def single(self, shard_index, row):
        shard = self.ds.shards[int(shard_index)]
        return self._torch(self.ds._sample(shard, int(row), self.columns))

    def batch(self, shards, rows, shared=None):
        """``{column: tensor}`` of the rows ``rows`` of the shards ``shards``; in shared memory
        when ``shared`` (default: in a DataLoader worker). Local shards are checked before the
        batch touches their maps and after it was copied out: a shard truncated meanwhile is a
        ``ShardError`` naming it, never a batch with bytes that are gone (spec/python.md §4)."""
        touched = [self.ds.shards[s] for s in np.unique(shards).tolist()] if self.ds._store.is_local else []
        for shard in touched:
            self.ds._check_unchanged(shard)
        out = self._batch(shards, rows, shared)
        for shard in touched:
            self.ds._check_unchanged(shard)
        return out

    def _batch(self, shards, rows, shared):
        ds = self.ds
        if ds.layout == "kv":
            out = {}
            for c in self.columns:
                parts = []
                for s, r in zip(shards.tolist(), rows.tolist()):
                    shard = ds.shards[s]
                    ds._kv_keys(shard)
                    parts.append(ds._kv_tensor(shard, shard.keys[r], c))
                out[c] = np.stack(parts)
            return self._torch(out)
        n = len(rows)
        cut = np.flatnonzero((np.diff(shards) != 0) | (np.diff(rows) != 1)) + 1
        bounds = [0, *cut.tolist(), n]
        if shared is None:
            shared = torch.utils.data.get_worker_info() is not None
        fixed = [c for c in self.columns if c not in ds.ragged]
        ragged = [c for c in self.columns if c in ds.ragged]
        if len(bounds) - 1 <= 4:  # a few contiguous runs: slices
            runs = []
            # copied into the batch's buffers unless one run is handed out as it is: then views
            # of the read-ahead's buffer would do (no copy of their own)
            copied = shared or len(bounds) > 2
            for a, b in zip(bounds[:-1], bounds[1:]):
                shard = ds.shards[int(shards[a])]
                r0 = int(rows[a])
                cols = {c: ds._rows(shard, c, r0, r0 + (b - a), copied) for c in fixed}
                cols.update({c: ds.ragged_rows(shard, c, r0, r0 + (b - a)) for c in ragged})
                runs.append((a, b, cols))
            if len(runs) == 1 and not shared:
                # one run, in this process: zero-copy views of the map (ragged offsets rebased)
                cols = runs[0][2]
                out = {c: cols[c] for c in fixed}
                for c in ragged:
                    out[c], out[offsets_name(c)] = cols[c].values, cols[c].offsets
                return self._torch(out)
            first = runs[0][2]
            starts = {c: np.concatenate([[0], np.cumsum([len(run[c].values) for _, _, run in runs])])
                      for c in ragged}
            arrays, tensors = self._alloc(self._specs(n, first, {c: int(starts[c][-1]) for c in ragged}), shared)
            for i, (a, b, run) in enumerate(runs):
                for c in fixed:
                    arrays[c][a:b] = run[c]
                for c in ragged:
                    e0 = starts[c][i]
                    arrays[c][e0: e0 + len(run[c].values)] = run[c].values
                    arrays[offsets_name(c)][a: b + 1] = run[c].offsets + e0
            return tensors
        uniq = np.unique(shards).tolist()
        cols = {c: {s: self._column(ds.shards[s], c) for s in uniq} for c in self.columns}
        spans = {}  # ragged column -> (element starts in their shards, lengths) per row
        for c in ragged:
            begin, length = np.empty(n, np.int64), np.empty(n, np.int64)
            for s in uniq:
                m = shards == s
                o = ds._offsets(ds.shards[s], c)
                begin[m] = o[rows[m]]
                length[m] = o[rows[m] + 1] - begin[m]
            spans[c] = (begin, length)
        first = {c: cols[c][uniq[0]] for c in fixed}
        first.update({c: Ragged(cols[c][uniq[0]], None) for c in ragged})
        arrays, tensors = self._alloc(self._specs(n, first, {c: int(spans[c][1].sum()) for c in ragged}), shared)
        local = np.searchsorted(uniq, shards)  # each row's shard as a position in `uniq`
        for c in ragged:
            begin, length = spans[c]
            out_off = arrays[offsets_name(c)]
            out_off[0] = 0
            np.cumsum(length, out=out_off[1:])
            # every row's run of elements, one after the other, in one native call
            gather_ragged(c, arrays[c], [cols[c][s] for s in uniq], local, begin, length)
        if fixed:
            # every fixed column's rows from every shard in one native call (the GIL released):
            # the bytes numpy's take per shard and column gave, without a call per shard and column
            gather_rows([(c, arrays[c], [cols[c][s] for s in uniq]) for c in fixed], local, rows)
        return tensors

    def _specs(self, n, like, elements):
        """``[(name, numpy dtype, shape)]`` of a batch of ``n`` rows: a fixed column shaped like
        the rows ``like[c]``; a ragged column's values (``elements[c]`` elements) and offsets."""
        specs = []
        for c in self.columns:
            a = like[c]
            if isinstance(a, Ragged):
                specs.append((c, a.values.dtype, (elements[c], *a.values.shape[1:])))
                specs.append((offsets_name(c), np.dtype(np.int64), (n + 1,)))
            else:
                specs.append((c, a.dtype, (n, *a.shape[1:])))
        return specs

    def _alloc(self, specs, shared):
        """Output buffers for ``specs`` (:meth:`_specs`): ``(name → numpy array to fill, name →
        tensor of the same memory)``.

        In a DataLoader worker all columns share one block of shared memory (what torch's own
        collate does for its stacked batches): sending the batch to the training process then
        passes one handle instead of copying every tensor into shared memory of its own."""
        total = 0
        placed = []
        for c, dt, shape in specs:
            nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            placed.append((c, dt, shape, total, nbytes))
            total += -(-nbytes // 64) * 64  # each column 64-byte aligned
        if not shared:
            arrays = {c: np.empty(shape, dtype=dt) for c, dt, shape, _, _ in placed}
            return arrays, self._torch(arrays)
        if self.pool is not None:
            slot, block, new = self.pool.get(total)
        else:
            slot, block, new = None, new_shared_block(total), True
        arrays, tensors, layout = {}, {}, []
        for c, dt, shape, off, nbytes in placed:
            t = self._torch({c: np.empty((0,), dtype=dt)})[c]  # the column's torch dtype
            tensors[c] = block[off: off + nbytes].view(t.dtype).view(shape)
            arrays[c] = tensors[c].view(torch.uint8).numpy().view(dt).reshape(shape) if nbytes else np.empty(shape, dt)
            layout.append((c, t.dtype, shape, off, nbytes))
        if slot is not None:
            self.slot = (self.pool.worker, slot, block if new else None, layout)
        return arrays, tensors
