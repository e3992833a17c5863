"""Token packing (spec/python.md §3.3), in numpy only (no torch), so it is testable alone.

* :class:`Packing` — the option: which ragged column holds the tokens, ``seq_len``, ``eos``,
  which per-token ids each block carries and their dtype.
* :class:`PackedEpoch` — one epoch's token stream: the documents in the epoch's order
  (:class:`~safetensors_spark._sampling.EpochOrder`), each followed by ``eos`` when given; block
  ``b`` is stream tokens ``[b·seq_len, (b+1)·seq_len)``. Built with one prefix sum over the
  permuted document lengths; a batch's blocks are written by one call of the Rust block builder
  (``_native.Packer``) straight out of the mapped shards' values (local shards), or with numpy
  from range reads (remote shards; also the reference the tests hold the builder to).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import _native

if TYPE_CHECKING:
    from ._dataset import Dataset
    from ._filter import FilteredOrder
    from ._sampling import EpochOrder

INTEGER_DTYPES = ("U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64")


IDS = ("position_ids", "document_ids")
IDS_DTYPES = ("int32", "int64")


def _ids_dtype(value: Any) -> np.dtype[Any]:
    """``"int32"``/``"int64"``, a numpy or a torch dtype of those → the numpy dtype."""
    name = str(value).removeprefix("torch.") if type(value).__module__ == "torch" else None
    if name is None:
        try:
            name = np.dtype(value).name if not isinstance(value, bool) and value is not None else None
        except TypeError:
            name = None
    if name not in IDS_DTYPES:
        raise ValueError(f"Packing: ids_dtype must be int32 or int64 (a name, a numpy or a torch dtype), "
                         f"got {value!r}")
    return np.dtype(name)


class Packing:
    """``Packing(column, seq_len, eos=None, *, ids=("position_ids", "document_ids"),
    ids_dtype="int64")``: pack the documents of ragged integer column ``column`` into blocks of
    ``seq_len`` tokens, each document followed by token ``eos`` when given. Each block carries
    ``tokens``, ``cu_seqlens`` and the per-token ids named in ``ids`` (any of
    ``"position_ids"``, ``"document_ids"``; ``()`` for none) as ``ids_dtype`` (``"int32"`` or
    ``"int64"``, or ``torch.int32``/``torch.int64``). Pass it as
    ``SafetensorsIterableDataset(..., pack=Packing(...))``."""

    def __init__(self, column: str, seq_len: int, eos: int | None = None, *, ids: Sequence[str] = IDS,
                 ids_dtype: str = "int64") -> None:
        if not isinstance(column, str):
            raise ValueError(f"Packing: column must be a column name (str), got {column!r}")
        if not isinstance(seq_len, (int, np.integer)) or isinstance(seq_len, bool) or seq_len < 1:
            raise ValueError(f"Packing: seq_len must be an integer >= 1 (tokens per block), got {seq_len!r}")
        if eos is not None and (not isinstance(eos, (int, np.integer)) or isinstance(eos, bool)):
            raise ValueError(f"Packing: eos must be an integer token id or None, got {eos!r}")
        if isinstance(ids, str) or not isinstance(ids, (list, tuple, set, frozenset)) \
                or any(i not in IDS for i in ids) or len(set(ids)) != len(ids):
            raise ValueError(f"Packing: ids must be a list of distinct names out of {list(IDS)} (the per-token "
                             f"ids each block carries; () for none), got {ids!r}")
        self.column, self.seq_len, self.eos = column, int(seq_len), None if eos is None else int(eos)
        self.ids = tuple(i for i in IDS if i in ids)
        self.ids_dtype = _ids_dtype(ids_dtype)
        if self.ids_dtype == np.int32 and "position_ids" in self.ids and self.seq_len > 2 ** 31:
            raise ValueError(f"Packing: seq_len={self.seq_len} has positions beyond int32; "
                             f"use ids_dtype='int64'")

    def __repr__(self) -> str:
        return (f"Packing(column={self.column!r}, seq_len={self.seq_len}, eos={self.eos}, ids={self.ids!r}, "
                f"ids_dtype='{self.ids_dtype.name}')")

    def _state(self) -> dict[str, Any]:
        """What decides the blocks (the ids carried do not: a state resumes with any)."""
        return {"column": self.column, "seq_len": self.seq_len, "eos": self.eos}

    def _check(self, dataset: Dataset) -> None:
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
        if self.ids_dtype == np.int32 and "document_ids" in self.ids and len(dataset) > 2 ** 31:
            raise ValueError(f"Packing: dataset {dataset.path} has {len(dataset)} documents: their ids do not fit "
                             f"int32 document_ids; use ids_dtype='int64' or leave document_ids out of ids")


def document_lengths(dataset: Dataset, column: str) -> NDArray[np.int64]:
    """Every document's token count, in sample order (int64 [N]), from the shards' offsets."""
    parts = [np.diff(dataset._offsets(s, column))[: s.samples] for s in dataset.shards]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def stream_tokens(lengths: NDArray[np.int64], eos: int | None) -> int:
    return int(lengths.sum()) + (len(lengths) if eos is not None else 0)


class PackedEpoch:
    """The blocks of one epoch. ``order``: the epoch's EpochOrder over the documents;
    ``lengths``: :func:`document_lengths`."""

    def __init__(self, dataset: Dataset, packing: Packing, order: EpochOrder | FilteredOrder,
                 lengths: NDArray[np.int64]) -> None:
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
        self._values: dict[int, NDArray[Any]] = {}  # shard index -> its values (local shards: a view of the map)
        self._packer: _native.Packer | None = None  # the Rust block builder over this epoch's stream (local shards)

    def layout(self, firsts: ArrayLike, counts: ArrayLike) -> tuple[list[tuple[str, np.dtype[Any]]], NDArray[np.int64],
                                                                   NDArray[np.int64], int]:
        """Where :meth:`fill` writes batches of blocks ``[firsts[i], firsts[i] + counts[i])``
        laid one after the other in one buffer: ``(parts, offsets, nbytes, total)`` — ``parts``
        ``[(name, numpy dtype)]`` (``tokens``, the ids asked for, ``cu_seqlens``), ``offsets``
        and ``nbytes`` int64 ``[batches, parts]`` (each part 64-byte aligned; ``cu_seqlens`` at
        its most entries: a piece starts at every block start and at every document start
        inside), ``total`` the buffer's bytes."""
        seq = self.packing.seq_len
        firsts, counts = np.asarray(firsts, np.int64), np.asarray(counts, np.int64)
        d0 = self.ends.searchsorted(firsts * seq, side="right")
        d1 = self.ends.searchsorted((firsts + counts) * seq - 1, side="right")
        parts = ([("tokens", self.dtype)] + [(i, self.packing.ids_dtype) for i in self.packing.ids]
                 + [("cu_seqlens", np.dtype(np.int32))])
        nbytes = np.empty((len(firsts), len(parts)), np.int64)
        nbytes[:, :-1] = (counts * seq)[:, None] * np.array([d.itemsize for _, d in parts[:-1]], np.int64)
        nbytes[:, -1] = (counts + d1 - d0 + 1) * 4
        padded = -(-nbytes // 64) * 64
        ends = np.cumsum(padded.reshape(-1)).reshape(padded.shape)
        return parts, ends - padded, nbytes, int(ends[-1, -1]) if len(firsts) else 0

    def blocks(self, b0: int, b1: int) -> dict[str, NDArray[Any]]:
        """Blocks ``[b0, b1)`` as numpy arrays: ``tokens`` and the ids the packing asks for
        (``position_ids``, ``document_ids``: ``ids_dtype``) of shape ``[b1 - b0, seq_len]``, and
        ``cu_seqlens`` (int32): the boundaries of the pieces (a document's part inside one block)
        in the blocks laid end to end, from 0 to ``(b1 - b0) · seq_len``."""
        if not self.ds._store.is_local:
            ids = self.packing.ids_dtype
            return {name: a if name in ("tokens", "cu_seqlens") else a.astype(ids, copy=False)
                    for name, a in self.reference_blocks(b0, b1).items()
                    if name in ("tokens", "cu_seqlens") or name in self.packing.ids}
        parts, offsets, nbytes, total = self.layout([b0], [b1 - b0])
        memory = np.empty(total, np.uint8)
        (n,) = self.fill(memory.__array_interface__["data"][0], total, [b0], [b1 - b0], offsets, nbytes)
        shape = (b1 - b0, self.packing.seq_len)
        return {name: memory[o: o + (n * 4 if name == "cu_seqlens" else k)].view(dtype).reshape(
                    (n,) if name == "cu_seqlens" else shape)
                for (name, dtype), o, k in zip(parts, offsets[0].tolist(), nbytes[0].tolist())}

    def fill(self, address: int, size: int, firsts: Sequence[int] | NDArray[np.int64],
             counts: Sequence[int] | NDArray[np.int64], offsets: NDArray[np.int64],
             nbytes: NDArray[np.int64]) -> list[int]:
        """Writes batches of blocks ``[firsts[i], firsts[i] + counts[i])`` into the writable
        buffer of ``size`` bytes at ``address`` that the caller holds (e.g. a shared-memory
        block), where :meth:`layout` placed them (``offsets``, ``nbytes``), one call of the Rust
        builder per batch; returns each batch's number of ``cu_seqlens`` entries. Local shards
        only: the shards the batches read are checked (``Dataset._check_unchanged``) once before and once
        after."""
        ds, column, seq = self.ds, self.packing.column, self.packing.seq_len
        packer = self._packer or self._new_packer()
        if len(firsts) == 0:
            return []
        if int((offsets + nbytes).max()) > size or int(offsets.min()) < 0:
            raise ValueError(f"pack: a buffer of {size} bytes cannot hold the layout's parts")
        firsts, counts = np.asarray(firsts, np.int64), np.asarray(counts, np.int64)
        d0 = int(self.ends.searchsorted(int(firsts.min()) * seq, side="right"))
        d1 = int(self.ends.searchsorted(int((firsts + counts).max()) * seq - 1, side="right"))
        shards = [ds.shards[s] for s in np.unique(self.shard_of[d0: d1 + 1]).tolist()]
        for shard in shards:
            if not packer.has_values(shard.index):
                t = ds._header(shard)[column]
                v = np.ascontiguousarray(ds._ragged_values(shard, column, 0, int(t.shape[0])))
                packer.set_values(shard.index, v, v.__array_interface__["data"][0], v.nbytes, len(v))
            ds._check_unchanged(shard)
        width = self.packing.ids_dtype.itemsize
        where = (address + offsets).tolist()
        nb = nbytes.tolist()
        ids = self.packing.ids
        pos = 1 + ids.index("position_ids") if "position_ids" in ids else None
        doc = 1 + ids.index("document_ids") if "document_ids" in ids else None
        build = packer.build
        out = []
        for b0, n, w, k in zip(firsts.tolist(), counts.tolist(), where, nb):
            out.append(build(b0, b0 + n, (w[0], k[0]), None if pos is None else (w[pos], k[pos]),
                             None if doc is None else (w[doc], k[doc]), width, (w[-1], k[-1])))
        for shard in shards:
            ds._check_unchanged(shard)
        return out

    def _new_packer(self) -> _native.Packer:
        ds, column = self.ds, self.packing.column
        # every document's first element in its shard's values, in sample order, then permuted
        starts = [ds._offsets(s, column)[: s.samples] for s in ds.shards]
        firsts = (np.concatenate(starts).astype(np.int64) if starts else np.zeros(0, np.int64))[self.doc]
        eos = None if self.packing.eos is None else np.array(self.packing.eos, dtype=self.dtype).tobytes()

        def b(a: ArrayLike) -> bytes:
            return np.ascontiguousarray(a, dtype=np.int64).tobytes()

        self._packer = _native.Packer(self.packing.seq_len, self.dtype.itemsize, eos, b(self.ends),
                                      b(self.doc_len), b(self.shard_of), b(firsts), b(self.doc), len(ds.shards))
        return self._packer

    def reference_blocks(self, b0: int, b1: int) -> dict[str, NDArray[Any]]:
        """Blocks ``[b0, b1)`` with numpy (every id, int64), one range read per piece on remote
        shards: the reference the Rust builder is tested against."""
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
        shard_of = self.shard_of[docs]
        shards = [ds.shards[s] for s in np.unique(shard_of).tolist()]
        for shard in shards if local else ():
            ds._check_unchanged(shard)
        if local:  # each piece one slice copy out of its shard's values (a view of the map)
            src = np.zeros(len(docs), dtype=np.int64)
            values = self._values
            for shard in shards:
                sel = shard_of == shard.index
                src[sel] = ds._offsets(shard, column)[self.row_of[docs[sel]]] + within[sel]
                if shard.index not in values:  # kept for the epoch
                    values[shard.index] = ds._ragged_values(shard, column, 0,
                                                           int(ds._header(shard)[column].shape[0]))
            for s, b, e, k in zip(shard_of.tolist(), begin.tolist(), src.tolist(), take.tolist()):
                if k:
                    out[b: b + k] = values[s][e: e + k]
        else:  # one range read per piece
            for p, d in enumerate(docs.tolist()):
                k = int(take[p])
                if k:
                    shard = ds.shards[int(self.shard_of[d])]
                    e = int(ds._offsets(shard, column)[self.row_of[d]]) + int(within[p])
                    out[begin[p]: begin[p] + k] = ds._ragged_values(shard, column, e, e + k)
        if eos is not None:  # a piece longer than its tokens ends with its document's eos
            out[(begin + take)[take < piece_len]] = eos
        for shard in shards if local else ():
            ds._check_unchanged(shard)
        start_of = np.repeat(begin, piece_len)
        position_ids = np.arange(hi - lo, dtype=np.int64) - start_of
        document_ids = np.repeat(self.doc[docs], piece_len)
        cu = np.append(begin, hi - lo).astype(np.int32)
        n = b1 - b0
        return {"tokens": out.reshape(n, seq), "position_ids": position_ids.reshape(n, seq),
                "document_ids": document_ids.reshape(n, seq), "cu_seqlens": cu}
