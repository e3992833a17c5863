"""``SafetensorsMixture``: a weighted mixture of several datasets (spec/python.md §3.5).

The epoch's order is computed once, globally (``_mixture_order.MixtureOrder``: position → source and
draw; each source's own order: ``EpochOrder`` / ``FilteredOrder`` with a seed per source and
pass), then dealt to ranks and workers exactly as ``SafetensorsIterableDataset`` deals its
positions (``RankPlan``), so the rank counts, the worker split and resume are the same rules.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data

from .._dataset import Dataset
from .._errors import ColumnNotFoundError, StateError
from .._filter import Filter, FilteredOrder, Selection
from .._mixture_order import MixtureOrder, check_weights, quotas, source_seed
from .._packing import Packing, PackedEpoch, document_lengths, stream_tokens
from .._sampling import EpochOrder
from ._torch_datasets import STATE_VERSION, SafetensorsIterableDataset
from ._handoff import item_messages
from ._provenance import NAMES, SOURCE, Provenance, check_flag, check_names, refuse_pack
from ._stateful import LiveEpoch, from_loader_state, load_worker_state
from ._reader import BatchReader, to_torch
from ._stats import timed

MODES = ("sample", "exhaust")


class Source:
    """One dataset of a mixture. ``columns``: None (all), a list (select), or a dict
    ``{mixture column: this dataset's column}`` (select and rename, to map sources of different
    columns to one schema). ``filter``: a :class:`safetensors_spark.Filter` applied to this source."""

    def __init__(self, path: str | os.PathLike[str] | Dataset, columns: str | Sequence[str] | Mapping[str, str] | None = None,
                 *, filter: Filter | None = None, storage_options: Mapping[str, Any] | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, version: int | None = None,
                 timestamp: datetime.datetime | str | None = None) -> None:
        self.path, self.columns, self.filter = path, columns, filter
        self.open_kw = dict(storage_options=storage_options, cache_dir=cache_dir, version=version, timestamp=timestamp)


class _Opened:
    """A source, opened: its Dataset, the column mapping, its selection and length (samples; with
    ``pack``, the blocks of its own packed stream)."""

    def __init__(self, i, src, shuffle_block_size, pack=None):
        if not isinstance(src, Source):
            src = Source(src)
        ds = src.path if isinstance(src.path, Dataset) else Dataset(src.path, **src.open_kw)
        self.index, self.dataset = i, ds
        self.name = f"mixture source {i} ({ds.path})"
        cols = src.columns
        if cols is None:
            mapping = {pack.column: pack.column} if pack is not None else {c: c for c in ds.columns}
        elif isinstance(cols, dict):
            mapping = dict(cols)
        else:
            mapping = {c: c for c in ([cols] if isinstance(cols, str) else list(cols))}
        if not mapping:
            raise ValueError(f"{self.name}: columns is empty; choose from {ds.columns}")
        for out, c in mapping.items():
            if not isinstance(out, str) or not isinstance(c, str):
                raise ValueError(f"{self.name}: columns maps mixture column names to column names, got {out!r}: {c!r}")
            if c not in ds.schema:
                raise ColumnNotFoundError(f"{self.name}: column '{c}' is not in the dataset; its columns are "
                                          f"{ds.columns}")
        self.mapping = mapping
        self.selection = Selection(ds, src.filter) if src.filter is not None else None
        self.length = len(ds) if self.selection is None else self.selection.total
        self.counts = [s.samples for s in ds.shards] if self.selection is None else self.selection.counts.tolist()
        self.block = shuffle_block_size if shuffle_block_size is not None else 4 * max(self.counts, default=1)
        self.packing = None
        if pack is not None:
            if list(mapping) != [pack.column]:
                raise ValueError(f"{self.name}: a packed mixture yields blocks of mixture column '{pack.column}' "
                                 f"only, got columns {list(mapping)}; give each source's token column as "
                                 f"Source(path, columns={{'{pack.column}': <its column>}}) (or leave columns out "
                                 f"when it is named '{pack.column}')")
            # this source's own stream (spec/python.md §3.3, over its filter's kept documents)
            self.packing = Packing(mapping[pack.column], pack.seq_len, pack.eos, ids=pack.ids, ids_dtype=pack.ids_dtype)
            self.packing._check(ds)
            self.doc_lengths = document_lengths(ds, self.packing.column)
            kept = self.doc_lengths if self.selection is None else self.doc_lengths[self.selection.kept()]
            tokens = stream_tokens(kept, pack.eos)
            self.num_blocks = tokens // pack.seq_len
            self.dropped_tokens = tokens - self.num_blocks * pack.seq_len
            self.length = self.num_blocks  # the mixture's unit is a block

    def signature(self, out):
        """``(dtype, per-sample shape)`` of mixture column ``out`` in this source."""
        ds, c = self.dataset, self.mapping[out]
        if c in ds.ragged:
            raise ValueError(f"{self.name}: column '{c}' is ragged; a mixture stacks fixed-shape columns only "
                             f"(rows of several sources are not cut into one ragged batch). Token documents mix "
                             f"packed: SafetensorsMixture(..., pack=Packing(column, seq_len)); otherwise select "
                             f"the fixed-shape columns with Source(path, columns=[...])")
        shape = ds.schema[c].get("shape")
        if shape is None:
            raise ValueError(f"{self.name}: column '{c}' has rows of different shapes (KV schema shape null); a "
                             f"mixture stacks fixed-shape columns only; select the fixed-shape columns with "
                             f"Source(path, columns=[...])")
        return ds.schema[c]["dtype"], list(shape[1:] if ds.layout == "batch" else shape)

    def fingerprint(self):
        shards = [[s["shard_path"], s["samples_count"], s["bytes"]] for s in self.dataset.manifest["shards"]]
        return hashlib.sha256(json.dumps(shards).encode()).hexdigest()

    def state(self):
        return {"manifest_fingerprint": self.fingerprint(), "samples": self.length, "columns": self.mapping,
                "filter": self.selection.state() if self.selection is not None else None,
                **({"pack": self.packing._state(), "blocks": self.num_blocks} if self.packing is not None else {})}

    def order(self, shuffle, seed, epoch, rnd):
        """This source's order in pass ``rnd`` of epoch ``epoch``."""
        s = source_seed(seed, self.index, rnd)
        if self.selection is not None:
            order = FilteredOrder(self.dataset, self.selection, shuffle, s, epoch, self.block)
        else:
            order = EpochOrder(self.counts, shuffle, s, epoch, self.block)
        if self.packing is not None:  # pass rnd's stream: this source's documents in that order
            return PackedEpoch(self.dataset, self.packing, order, self.doc_lengths)
        return order


def _check_packed(opened):
    first = opened[0]
    dtype = first.dataset.schema[first.packing.column]["dtype"]
    for o in opened[1:]:
        other = o.dataset.schema[o.packing.column]["dtype"]
        if other != dtype:
            raise ValueError(f"packed mixture: token column '{o.packing.column}' of {o.name} is {other} but "
                             f"'{first.packing.column}' of {first.name} is {dtype}; the sources' tokens must have "
                             f"one dtype")


def _check_schemas(opened):
    first = opened[0]
    want = set(first.mapping)
    for o in opened[1:]:
        got = set(o.mapping)
        if got != want:
            missing, extra = sorted(want - got), sorted(got - want)
            raise ValueError(
                f"{o.name} has columns {sorted(got)} but {first.name} has {sorted(want)} (missing {missing}, "
                f"extra {extra}); map every source to one schema with Source(path, columns={{mixture column: "
                f"source column}})")
    for c in first.mapping:
        sig = first.signature(c)
        for o in opened[1:]:
            other = o.signature(c)
            if other != sig:
                raise ValueError(f"mixture column '{c}' is {sig[0]} {sig[1]} in {first.name} (column "
                                 f"'{first.mapping[c]}') but {other[0]} {other[1]} in {o.name} (column "
                                 f"'{o.mapping[c]}'); sources must agree on each column's dtype and per-sample shape")


class SafetensorsMixture(SafetensorsIterableDataset):
    """Batches drawn from several datasets (``sources``: paths, ``Dataset``s or :class:`Source`),
    in an order that depends only on ``seed``, the epoch, the weights and the sources' lengths.

    * ``mode="sample"`` (default): an epoch of ``num_samples`` (default: the sources' total)
      positions; source ``i`` gets ``num_samples · w_i / Σw`` of them (largest remainder), drawn
      from its own order, passing through it again when it runs out. ``weights`` default to the
      sources' lengths.
    * ``mode="exhaust"``: every sample of every source once per epoch, the sources interleaved in
      proportion to their lengths (``weights`` and ``num_samples`` are refused).

    ``pack``: a :class:`Packing` of a mixture token column: each source is packed on its own
    (its kept documents, its order) and the mixture's positions are blocks, mixed by weight.

    ``source_column``: a name under which every batch carries each sample's source index (int64).
    ``provenance=True``: every batch also gives ``_source`` (the source index, int64; its path is
    ``source_paths[i]``), ``_file``, ``_row_index`` and ``_added_version`` (spec/python.md §3.7).
    Ranks, workers, ``drop_last``, ``loader()`` and resume (``state_dict`` / ``load_state_dict``)
    work as for :class:`SafetensorsIterableDataset`; ``source_counts`` are the samples each source
    gives the epoch (all ranks), ``state_dict()["consumed_per_source"]`` those consumed so far."""

    def __init__(self, sources: Sequence[str | os.PathLike[str] | Dataset | Source],
                 weights: Sequence[float] | None = None, batch_size: int | None = None, *, mode: str = "sample",
                 num_samples: int | None = None, shuffle: bool = True, seed: int = 0, rank: int | None = None,
                 world_size: int | None = None, drop_last: bool = False, shuffle_block_size: int | None = None,
                 source_column: str | None = None, transform: Callable[[dict[str, Any]], Any] | None = None,
                 cache_shards: int = 8, pack: Packing | None = None, provenance: bool = False) -> None:
        self.provenance = check_flag(provenance)
        if provenance and pack is not None:
            refuse_pack("SafetensorsMixture")
        if isinstance(sources, (str, bytes, Source, Dataset)) or not hasattr(sources, "__len__") or not sources:
            raise ValueError(f"mixture: sources must be a non-empty list of paths, Datasets or Sources, "
                             f"got {sources!r}")
        if mode not in MODES:
            raise ValueError(f"mixture: mode must be one of {list(MODES)}, got {mode!r}")
        if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool)
                                       or batch_size < 1):
            raise ValueError(f"batch_size must be an integer >= 1 or None (single samples), got {batch_size!r}")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        if shuffle_block_size is not None and (not isinstance(shuffle_block_size, int) or shuffle_block_size < 1):
            raise ValueError(f"shuffle_block_size must be an integer >= 1, got {shuffle_block_size!r}")
        if pack is not None and not isinstance(pack, Packing):
            raise ValueError(f"pack must be a safetensors_spark.torch.Packing, got {pack!r}")
        self.sources = [_Opened(i, s, shuffle_block_size, pack) for i, s in enumerate(sources)]
        if pack is not None:
            _check_packed(self.sources)
        else:
            _check_schemas(self.sources)
        self.columns = list(self.sources[0].mapping)
        if source_column is not None and (not isinstance(source_column, str) or source_column in self.columns):
            raise ValueError(f"mixture: source_column must be a name that is not a column {self.columns}, "
                             f"got {source_column!r}")
        if provenance:
            check_names(self.columns + ([source_column] if source_column is not None else []),
                        "the mixture's columns (or source_column) have", (SOURCE,))
        lengths = [o.length for o in self.sources]
        if mode == "exhaust":
            if weights is not None or num_samples is not None:
                raise ValueError("mixture: mode='exhaust' takes every sample of every source once (in proportion "
                                 "to their lengths); weights and num_samples are for mode='sample'")
            self.weights = np.asarray(lengths, dtype=np.float64)
            counts = np.asarray(lengths, dtype=np.int64)
        else:
            self.weights = check_weights(lengths if weights is None else weights, len(self.sources))
            if num_samples is None:
                num_samples = sum(lengths)
            if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 0:
                raise ValueError(f"mixture: num_samples must be an integer >= 0, got {num_samples!r}")
            counts = quotas(self.weights, num_samples)
            for o, w, c in zip(self.sources, self.weights, counts):
                if c > 0 and o.length == 0:
                    raise ValueError(f"{o.name} has weight {w} but no {'blocks' if pack is not None else 'samples'}"
                                     f"{' its filter keeps' if o.selection is not None else ''}; give it weight 0")
        self.mode = mode
        self.counts = counts
        self.num_samples = int(counts.sum())
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.drop_last = bool(drop_last)
        self.source_column = source_column
        self.transform = transform
        self.cache_shards = cache_shards
        # packed: positions are blocks, cut to a multiple of world_size as for one packed dataset
        self.pack = pack
        self.selection = None
        self._explicit_rank = (rank, world_size)
        self.rank, self.world_size = self._resolve_rank(rank, world_size)
        self._epoch = 0
        self._resume = None
        self._progress = None
        self._handoff = (0, None)  # (0: not a loader()'s worker, see SafetensorsIterableDataset)
        self._worker_counters = None  # loader().stats() (_stats.py)
        # live workers and StatefulDataLoader's worker states, as the single-dataset iterator
        # (_stateful.py; spec/python.md §5.1)
        self._live = LiveEpoch()
        self._worker_resume = None
        self._worker_progress = None
        self._mix = None  # (epoch, MixtureOrder) of this process

    @property
    def source_counts(self) -> list[int]:
        """Samples each source gives an epoch (all ranks together; the same every epoch)."""
        return self.counts.tolist()

    @property
    def source_paths(self) -> list[str]:
        """The sources' dataset paths, by source index (provenance's ``_source``)."""
        return [o.dataset.path for o in self.sources]

    @property
    def _sample_bytes(self):
        """Bytes of one sample of a batch (loader()'s message size)."""
        o = self.sources[0]
        if self.pack is not None:  # tokens, position_ids and document_ids of a block
            return self.pack.seq_len * (o.dataset._dtypes[o.packing.column].itemsize + 16) + \
                (8 if self.source_column is not None else 0)
        total = sum(int(np.prod(o.signature(c)[1], dtype=np.int64)) * o.dataset._dtypes[o.mapping[c]].itemsize
                    for c in self.columns)
        return total + (8 if self.source_column is not None else 0) + (8 * 3 if self.provenance else 0)

    def __getstate__(self):
        state = super().__getstate__()
        state["_mix"] = None
        return state

    def _units(self):
        return self.num_samples

    def _mixture(self):
        if self._mix is None or self._mix[0] != self._epoch:
            self._mix = (self._epoch, MixtureOrder(self.counts, self.shuffle, self.seed, self._epoch))
        return self._mix[1]

    # -- resume ------------------------------------------------------------------------------

    def _settings(self):
        # sources first: a changed source (its shards, columns, filter) explains the fields after it
        return {"kind": "mixture", "sources": [o.state() for o in self.sources], "mode": self.mode,
                "num_samples": self.num_samples, "weights": self.weights.tolist(),
                "source_counts": self.source_counts, "shuffle": self.shuffle, "seed": self.seed,
                "shuffle_block_size": [o.block for o in self.sources],
                **({"pack": self.pack._state()} if self.pack is not None else {})}

    def state_dict(self, batches_consumed: int | None = None) -> dict[str, Any]:
        """``{version, kind: "mixture", epoch, position, consumed_per_source, ...}``: ``position``
        = positions of the epoch's mixture order consumed by all ranks together (as
        :meth:`SafetensorsIterableDataset.state_dict`)."""
        state = super().state_dict(batches_consumed)  # a worker's state (§5.1), or the position
        if "worker" not in state:
            state["consumed_per_source"] = self._mixture().consumed(state["position"]).tolist()
        return state

    def _common_state(self):
        return {"version": STATE_VERSION, **self._settings()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes at ``state['position']`` of ``state['epoch']``'s mixture order; any world size,
        worker count or ``batch_size``; the sources, weights and order settings must be the same.
        Takes a whole ``StatefulDataLoader.state_dict()`` and worker states too, as
        :meth:`SafetensorsIterableDataset.load_state_dict`."""
        if isinstance(state, dict) and ("_snapshot" in state or "dataset_state" in state):
            state = from_loader_state(self, state)
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION or state.get("kind") != "mixture":
            raise StateError(f"not a SafetensorsMixture state (version {STATE_VERSION}, kind 'mixture'): {state!r}")
        for field, mine in self._settings().items():
            if state.get(field) != mine:
                raise StateError(f"cannot resume: state has {field}={state.get(field)!r}, this mixture has "
                                 f"{mine!r} (the mixture order would differ)")
        if "worker" in state:
            self._worker_resume = load_worker_state(self, state)
            self._epoch = self._worker_resume[0]
            return
        self._resume_at(state)

    def _beyond(self, total):
        return f"the epoch's num_samples={total}" + (" blocks" if self.pack is not None else "")

    # -- iteration ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        start, progress, skip = self._iterator_start(info)
        items = self._generate_mixture(self._plan(start), worker, workers, progress, skip)
        if info is not None and self._worker_counters is not None:
            return timed(items, self._worker_counters, worker, [o.dataset for o in self.sources])
        return items

    def _generate_mixture(self, plan, worker, workers, progress, skip=0):
        mix, epoch, total = self._mixture(), self._epoch, self.num_samples
        readers = [BatchReader(o.dataset, list(dict.fromkeys(o.mapping.values())), self.cache_shards)
                   for o in self.sources] if self.pack is None else None
        # each source's shard names and versions (spec/python.md §3.7; None: off, no cost)
        provs = [Provenance(o.dataset) for o in self.sources] if self.provenance else None
        orders = {}  # (source, pass) -> its order (a few live at a time)

        def order_of(i, rnd):
            o = orders.get((i, rnd))
            if o is None:
                if len(orders) >= 16:
                    orders.pop(next(iter(orders)))
                o = orders[(i, rnd)] = self.sources[i].order(self.shuffle, self.seed, epoch, rnd)
            return o

        def packed_batch(j):
            """Blocks of the sources' own packed streams, in position order (spec/python.md §3.5)."""
            first, n = plan.batch(j)
            pos = np.arange(first, first + n, dtype=np.int64) % total
            labels, draws = mix.labels[pos], mix.draws[pos]
            seq = self.pack.seq_len
            arrays, starts = {}, []
            # A source's draws in a batch are consecutive blocks of its stream, cut where a pass
            # ends: each run of consecutive blocks of one pass is built in one call and scattered
            # to its positions (one call per block made the epoch 1.5x slower).
            for i in np.unique(labels).tolist():
                at = np.flatnonzero(labels == i)
                rnd, q = np.divmod(draws[at], self.sources[i].length)
                cuts = np.flatnonzero((np.diff(q) != 1) | (np.diff(rnd) != 0)) + 1
                for where, qs, r in zip(np.split(at, cuts), np.split(q, cuts), np.split(rnd, cuts)):
                    part = order_of(i, int(r[0])).blocks(int(qs[0]), int(qs[0]) + len(qs))
                    for name in ("tokens",) + tuple(self.pack.ids):
                        if name not in arrays:
                            arrays[name] = np.empty((n, seq), part[name].dtype)
                        arrays[name][where] = part[name]
                    c = part["cu_seqlens"][:-1].astype(np.int64)  # piece starts in the run's blocks
                    starts.append(where[c // seq] * seq + c % seq)  # ... in the batch's
            dtype = self.sources[0].dataset.schema[self.sources[0].packing.column]["dtype"]
            out = {"tokens": to_torch(arrays["tokens"], dtype)}
            for name in self.pack.ids:
                out[name] = torch.from_numpy(arrays[name])
            out["cu_seqlens"] = torch.from_numpy(np.append(np.sort(np.concatenate(starts)), n * seq).astype(np.int32))
            if self.source_column is not None:
                out[self.source_column] = torch.from_numpy(labels.astype(np.int64))
            if self.batch_size is None:
                out = {c: t if c == "cu_seqlens" else t[0] for c, t in out.items()}
            return self.transform(out) if self.transform is not None else out

        def batch(j):
            if self.pack is not None:
                return packed_batch(j)
            first, n = plan.batch(j)
            pos = np.arange(first, first + n, dtype=np.int64) % total
            labels, draws = mix.labels[pos], mix.draws[pos]
            out = {}
            prov = ([""] * n, np.empty(n, np.int64), np.empty(n, np.int64)) if provs is not None else None
            for i in np.unique(labels).tolist():
                src = self.sources[i]
                at = np.flatnonzero(labels == i)
                rnd, q = np.divmod(draws[at], src.length)
                shards, rows = np.empty(len(at), np.int64), np.empty(len(at), np.int64)
                for r in np.unique(rnd).tolist():
                    m = rnd == r
                    shards[m], rows[m] = order_of(i, r).locate(q[m])
                part = readers[i].batch(shards, rows, shared=False)
                if prov is not None:  # the rows just read, at their positions in the batch
                    got = provs[i].arrays(shards, rows)
                    for a, f in zip(at.tolist(), got["_file"]):
                        prov[0][a] = f
                    prov[1][at], prov[2][at] = got["_row_index"], got["_added_version"]
                idx = torch.from_numpy(at)
                for c, sc in src.mapping.items():
                    t = part[sc]
                    if c not in out:
                        out[c] = torch.empty((n, *t.shape[1:]), dtype=t.dtype)
                    out[c][idx] = t
            out = {c: out[c] for c in self.columns}
            if self.source_column is not None:
                out[self.source_column] = torch.from_numpy(labels.astype(np.int64))
            if prov is not None:
                out[SOURCE] = torch.from_numpy(labels.astype(np.int64))
                out.update(zip(NAMES, (prov[0], torch.from_numpy(prov[1]), torch.from_numpy(prov[2]))))
            if self.batch_size is None:
                out = {c: t[0] for c, t in out.items()}
            return self.transform(out) if self.transform is not None else out

        k, release_flags = self._handoff
        if k >= 1 and torch.utils.data.get_worker_info() is not None:
            yield from item_messages(lambda j0, j1: [batch(j) for j in range(j0, j1)], plan.num_batches,
                                     worker, workers, k, release_flags)
            return
        for j in range(worker + skip * workers, plan.num_batches, workers):
            out = batch(j)
            if progress is not None:
                progress["consumed"] += 1
            yield out
