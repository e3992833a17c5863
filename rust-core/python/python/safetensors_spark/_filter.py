"""Load-time filters (spec/python.md §3.4), in numpy only (no torch), so they are testable alone.

* :class:`Filter` — what to keep: a boolean mask column (``Filter.mask``), a predicate on a
  scalar column (``Filter.where``: a comparison, or a vectorised function of the column), or
  the same on the row lengths of a ragged column (``Filter.length``: read from its offsets).
* :class:`Selection` — the filter evaluated once, up front, over that one column of every shard:
  the kept samples (a bit per sample), their count per shard, and a fingerprint for resume.
* :class:`FilteredOrder` — an epoch's global order over the kept samples only: the sampler of
  ``_sampling.EpochOrder`` run on the kept counts per shard, then mapped back to shard rows.

Why up front and not lazily per sample in the workers: the rank plan needs the epoch's length
before the first batch (equal batch counts on every rank, a resume position in a known order). A
predicate evaluated as samples stream by would only know how many samples pass at the end of the
epoch, so ranks would get different counts and a resume position would depend on how far each
worker had read. One pass over one scalar column (for a local dataset a view of the map; remote:
one range read of that column per shard) gives the exact filtered length.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._errors import ColumnNotFoundError
from ._sampling import EpochOrder, Located

if TYPE_CHECKING:
    from ._dataset import Dataset, Shard

_OPS: dict[str, Callable[[Any, Any], Any] | None] = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
        ">=": operator.ge, "in": None, "not in": None}


class Filter:
    """What a dataset keeps. Build with :meth:`mask` or :meth:`where`."""

    def __init__(self, column: str, kind: str, op: Any = None, value: Any = None, of: str = "values") -> None:
        # of: "values" (the column's values) or "length" (a ragged column's row lengths)
        self.column, self.kind, self.op, self.value, self.of = column, kind, op, value, of

    @classmethod
    def mask(cls, column: str) -> Filter:
        """Keep the samples whose BOOL column ``column`` is true (e.g. a mask Spark wrote)."""
        if not isinstance(column, str):
            raise ValueError(f"Filter.mask: column must be a column name, got {column!r}")
        return cls(column, "mask")

    @classmethod
    def where(cls, column: str, op: str | Callable[[Any], Any], value: Any = None) -> Filter:
        """Keep the samples whose scalar column ``column`` satisfies ``op``: one of
        ``== != < <= > >=`` with a number ``value``, ``in`` / ``not in`` with a list of numbers,
        or a function ``values (numpy array of one shard's rows) -> bool array of the same
        length`` (vectorised: it is called once per shard, never per sample)."""
        return cls._build(column, op, value, "Filter.where")

    @classmethod
    def _build(cls, column: str, op: str | Callable[[Any], Any], value: Any, who: str) -> Filter:
        if not isinstance(column, str):
            raise ValueError(f"{who}: column must be a column name, got {column!r}")
        if callable(op):
            if value is not None:
                raise ValueError(f"{who}: with a function, leave value out")
            return cls(column, "call", op)
        if op not in _OPS:
            raise ValueError(f"{who}: op must be one of {list(_OPS)} or a function, got {op!r}")
        if op in ("in", "not in"):
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                raise ValueError(f"{who}: op {op!r} takes a list of values, got {value!r}")
            value = list(value)
            bad = [v for v in value if not _is_number(v)]
        else:
            bad = [] if _is_number(value) else [value]
        if bad:
            raise ValueError(f"{who}: column '{column}' compares with numbers or booleans, got {bad[0]!r}")
        return cls(column, "op", op, value)

    @classmethod
    def length(cls, column: str, op: str | Callable[[Any], Any], value: Any = None) -> Filter:
        """Keep the samples whose row of ragged column ``column`` (e.g. a document's tokens) has
        a length (elements; bytes for binary and string) that satisfies ``op``, as in
        :meth:`where` (a comparison with a number, ``in``/``not in``, or a vectorised function of
        the lengths, int64). Read from the column's offsets only, never its values."""
        f = cls._build(column, op, value, "Filter.length")
        f.of = "length"
        return f

    def _describe(self) -> str:
        if self.kind == "mask":
            return f"mask {self.column}"
        name = f"len({self.column})" if self.of == "length" else self.column
        if self.kind == "call":
            return f"{name} where {getattr(self.op, '__qualname__', repr(self.op))}"
        return f"{name} {self.op} {self.value!r}"

    def __repr__(self) -> str:
        return f"Filter({self._describe()})"

    def _evaluate(self, values: NDArray[Any], where: str) -> NDArray[np.bool_]:
        """The kept rows (bool array) of one shard's ``values`` of the column."""
        if self.kind == "mask":
            return values
        if self.kind == "call":
            keep = self.op(values)
            keep = np.asarray(keep) if keep is not None else None
            if keep is None or keep.dtype != np.bool_ or keep.shape != values.shape:
                got = "None" if keep is None else f"{keep.dtype} {list(keep.shape)}"
                raise TypeError(f"filter on column '{self.column}': the function must return a bool array of "
                                f"shape {list(values.shape)} (one per row of {where}), got {got}")
            return keep
        if self.op == "in":
            return np.isin(values, self.value)
        if self.op == "not in":
            return ~np.isin(values, self.value)
        compare = cast("Callable[[Any, Any], Any]", _OPS[self.op])  # "in"/"not in" (None) answered above
        return np.asarray(compare(values, self.value), dtype=np.bool_)


def _is_number(v: object) -> bool:
    return isinstance(v, (bool, int, float, np.bool_, np.integer, np.floating))


class Selection:
    """A :class:`Filter` evaluated over a dataset: ``total`` kept samples, ``counts`` kept per
    shard, ``fingerprint`` (sha256 of the kept bits), ``kept()`` their sample indices (§2 order)."""

    def __init__(self, dataset: Dataset, flt: Filter) -> None:
        if not isinstance(flt, Filter):
            raise ValueError(f"filter must be a safetensors_spark.Filter (Filter.mask(column) or "
                             f"Filter.where(column, op, value)), got {flt!r}")
        # the description only: a filter's function need not pickle (DataLoader workers under spawn)
        self.description = flt._describe()
        ds = dataset
        c = flt.column
        if c not in ds.schema:
            raise ColumnNotFoundError(f"filter: column '{c}' is not in dataset {ds.path}; its columns are "
                                      f"{ds.columns}")
        dtype = ds.schema[c]["dtype"]
        if flt.of == "length":
            if c not in ds.ragged:
                raise ValueError(f"filter: Filter.length reads the row lengths of a ragged column; column '{c}' of "
                                 f"dataset {ds.path} is not ragged (its ragged columns: {sorted(ds.ragged)})")
        elif c in ds.ragged:
            raise ValueError(f"filter: column '{c}' of dataset {ds.path} is ragged (rows of different lengths); "
                             f"a filter reads a scalar column (one value per sample); filter its row lengths "
                             f"with Filter.length('{c}', op, value)")
        shape = ds.schema[c].get("shape")
        sample = None if shape is None else (shape[1:] if ds.layout == "batch" else shape)
        if flt.of != "length" and (sample is None or int(np.prod(sample, dtype=np.int64)) != 1):
            raise ValueError(f"filter: column '{c}' of dataset {ds.path} has per-sample shape {sample}; a filter "
                             f"reads a scalar column (shape [] or all 1s: one value per sample)")
        if flt.kind == "mask" and dtype != "BOOL":
            raise ValueError(f"filter: mask column '{c}' of dataset {ds.path} has dtype {dtype}; a mask must "
                             f"be BOOL (true keeps the sample)")
        if flt.kind == "op" and dtype == "BF16" and flt.of != "length":
            raise ValueError(f"filter: column '{c}' of dataset {ds.path} is BF16; compare it with a function "
                             f"(Filter.where(column, fn)) on its values")
        keep = np.zeros(len(ds), dtype=np.bool_)
        for shard in ds.shards:
            if shard.samples == 0:
                continue
            values = np.diff(ds._offsets(shard, c))[: shard.samples] if flt.of == "length" \
                else _column_values(ds, shard, c)
            keep[shard.offset: shard.offset + shard.samples] = flt._evaluate(values, ds._store.url(shard.name))
        self.n = len(ds)
        self.bits = np.packbits(keep)
        self.total = int(keep.sum())
        starts = np.asarray([s.offset for s in ds.shards], dtype=np.int64)
        before = np.concatenate([[0], np.cumsum(keep, dtype=np.int64)])
        self.counts = (before[starts + np.asarray([s.samples for s in ds.shards], dtype=np.int64)]
                       - before[starts]).astype(np.int64)
        self.fingerprint = hashlib.sha256(self.bits.tobytes() + str(self.n).encode()).hexdigest()
        self._kept: NDArray[np.int64] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_kept"] = None  # rebuilt from the bits in the process that reads
        return state

    def kept(self) -> NDArray[np.int64]:
        """Sample indices (int64, increasing) of the kept samples."""
        if self._kept is None:
            self._kept = np.flatnonzero(np.unpackbits(self.bits, count=self.n)).astype(np.int64)
        return self._kept

    def state(self) -> dict[str, Any]:
        return {"filter": self.description, "kept": self.total, "sha256": self.fingerprint}


def _column_values(ds: Dataset, shard: Shard, column: str) -> NDArray[Any]:
    """The column's value of each real row of ``shard``, as a 1-d array (one range per shard)."""
    if ds.layout == "batch":
        a = ds._rows(shard, column, 0, shard.samples)
    else:
        ds._kv_keys(shard)
        a = np.stack([ds._kv_tensor(shard, key, column) for key in shard.keys])
    return np.asarray(a).reshape(shard.samples)


class FilteredOrder:
    """Position → sample over the kept samples only: :class:`EpochOrder` of the kept counts per
    shard (the same shard permutation and block shuffle, over the filtered list), then the
    ``j``-th kept row of a shard is mapped to its row."""

    def __init__(self, dataset: Dataset, selection: Selection, shuffle: bool, seed: int, epoch: int,
                 block_size: int) -> None:
        self.order = EpochOrder(selection.counts, shuffle, seed, epoch, block_size)
        self.total = self.order.total
        kept = selection.kept()
        self._kept = kept
        self._first = np.concatenate([[0], np.cumsum(selection.counts)])[:-1]
        self._offsets = np.asarray([s.offset for s in dataset.shards], dtype=np.int64)

    def _rows(self, shards: NDArray[np.int64], j: NDArray[np.int64]) -> Located:
        return shards, self._kept[self._first[shards] + j] - self._offsets[shards]

    def locate(self, positions: ArrayLike) -> Located:
        return self._rows(*self.order.locate(positions))

    def locate_all(self) -> Located:
        return self._rows(*self.order.locate_all())
