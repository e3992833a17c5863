"""The torch datasets (spec/python.md §3-§5).

* :class:`SafetensorsDataset` — map-style; ``ds[i]`` → ``{column: tensor}``.
* :class:`SafetensorsIterableDataset` — batches in a global order that depends only on the
  manifest, ``seed`` and the epoch; split over ranks and DataLoader workers; exact resume
  (``state_dict()`` / ``load_state_dict()``).
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

from .._dataset import Dataset, offsets_name
from .._errors import StateError
from .._filter import Filter, FilteredOrder, Selection
from .._prefetch import batch_groups
from .._spool import Spool
from .._packing import Packing, PackedEpoch, document_lengths, stream_tokens
from .._sampling import EpochOrder, RankPlan
from ._follow import Follow, Segments, segment_dataset
from ._follow import generate as follow_generate
from ._follow import position as follow_position
from ._forms import Finish, resolve_forms
from ._handoff import block_messages, item_messages, messages
from ._provenance import Provenance, check_flag, check_names, refuse_pack
from ._reader import BatchReader, to_torch
from ._stats import timed
from ._stateful import LiveEpoch, from_loader_state, load_worker_state, worker_state

STATE_VERSION = 1


def _dist_rank_world():
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class SafetensorsDataset(torch.utils.data.Dataset):
    """Map-style: ``len(ds)`` samples (pad rows excluded), ``ds[i]`` → ``{column: tensor}``.
    With ``filter`` (a :class:`safetensors_spark.Filter`): ``len(ds)`` kept samples, ``ds[i]``
    the ``i``-th kept sample in dataset order.

    Local shards are memory-mapped (private, copy-on-write): the tensors are views of the map,
    no bytes are copied; remote shards are read by byte range into fresh tensors."""

    def __init__(self, path: str | os.PathLike[str] | Dataset, columns: str | Sequence[str] | None = None, *,
                 ragged: str | Mapping[str, str] | None = None, pad_value: float = 0,
                 transform: Callable[[dict[str, Any]], Any] | None = None, filter: Filter | None = None,
                 storage_options: Mapping[str, Any] | None = None, cache_dir: str | os.PathLike[str] | None = None,
                 version: int | None = None, timestamp: datetime.datetime | str | None = None,
                 provenance: bool = False) -> None:
        self.dataset = path if isinstance(path, Dataset) else Dataset(
            path, storage_options=storage_options, cache_dir=cache_dir, version=version,
            timestamp=timestamp)
        # each sample also gives _file, _row_index, _added_version (spec/python.md §2)
        self.provenance = check_flag(provenance)
        self._provenance: Provenance | None = None  # made on first use, in the process that reads
        self.columns = self.dataset._check_columns(columns)
        # the form of ragged columns and the transform of loader()'s batches (spec/python.md §3.2)
        self.finish = Finish(resolve_forms(self.dataset, self.columns, ragged), pad_value, transform)
        # the filter evaluated once over its column: indices count the kept samples (§3.4)
        self.selection = Selection(self.dataset, filter) if filter is not None else None
        self._reader: BatchReader | None = None  # BatchReader of __getitems__, made in the process that reads

    def __len__(self) -> int:
        return len(self.dataset) if self.selection is None else self.selection.total

    def _kept(self, indices):
        """Dataset sample indices of kept-sample indices ``indices`` (negative count from the end)."""
        n = self.selection.total
        v = np.asarray(indices)
        if v.dtype.kind not in "iu" or v.ndim > 1:
            raise TypeError(f"sample index must be an integer, got {indices!r}")
        v = v.astype(np.int64)
        bad = (v < -n) | (v >= n)
        if bad.any():
            raise IndexError(f"sample index {int(np.atleast_1d(v)[np.atleast_1d(bad)][0])} is out of range for the "
                             f"{n} samples filter {self.selection.description} keeps of dataset {self.dataset.path}")
        return self.selection.kept()[np.where(v < 0, v + n, v)]

    def _locate_many(self, indices):
        """``(shard indices, rows)`` of this dataset's samples ``indices`` (kept ones when filtered)."""
        if self.selection is not None and len(indices):
            indices = self._kept(indices)
        return self.dataset._locate_many(indices)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ds = self.dataset
        if self.selection is not None:
            if not isinstance(i, (int, np.integer)) or isinstance(i, bool):
                raise TypeError(f"sample index must be an integer, got {type(i).__name__}")
            i = int(self._kept(i))
        shard, row = ds._locate(i)
        sample = ds._sample(shard, row, self.columns)
        out = {c: to_torch(a, ds.schema[c]["dtype"]) for c, a in sample.items()}
        return self._with_provenance(out, shard.index, row)

    def _with_provenance(self, sample: dict[str, Any], shard_index: int, row: int) -> dict[str, Any]:
        """``sample`` with its provenance when asked for: the shard's name, the row in it, and the
        version that added the shard (-1 when the manifest does not record it: a batch of
        samples collates into tensors, which hold no None)."""
        if self.provenance:
            if self._provenance is None:
                self._provenance = Provenance(self.dataset)
            return self._provenance.single(sample, shard_index, row)
        return sample

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, torch.Tensor]]:
        """The samples of a DataLoader batch, ``[ds[i] for i in indices]`` in value: torch's
        fetcher calls this with the sampler's batch instead of ``ds[i]`` per index. Batch-layout
        rows are gathered in one pass (a slice for one run, else one Rust gather across the fixed
        columns and shards) and handed out as views of the
        gathered tensors, which the collate function stacks (spec/python.md §4)."""
        ds = self.dataset
        if ds.layout != "batch" or len(indices) == 0:
            return [self[i] for i in indices]
        shards, rows = self._locate_many(indices)
        if self._reader is None:
            self._reader = BatchReader(ds, self.columns, cache_shards=8)
        # private memory even in a worker: the collate function stacks the views into the
        # shared block it sends, so a shared block here would be a second fresh one per batch
        batch = self._reader.batch(shards, rows, shared=False)
        views = [_rows(batch, c) if c in ds.ragged else batch[c].unbind(0) for c in self.columns]
        return [self._with_provenance(dict(zip(self.columns, v)), int(s), int(r))
                for v, s, r in zip(zip(*views), shards, rows)]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_reader"] = None  # maps and arrays of this process stay here
        return state

    def get(self, key: str) -> dict[str, torch.Tensor]:
        """KV datasets: ``{column: tensor}`` of the row with this key."""
        ds = self.dataset
        if self.selection is not None:
            raise ValueError(f"get(key) looks a key up in all of dataset {ds.path}, but this SafetensorsDataset "
                             f"keeps only the samples filter {self.selection.description} keeps; look keys up "
                             f"in an unfiltered SafetensorsDataset")
        return {c: to_torch(a, ds.schema[c]["dtype"]) for c, a in ds.get(key, self.columns).items()}


def _rows(batch, column):
    """The rows of ragged column ``column`` of a read batch, each a view of its values."""
    values, o = batch[column], batch[offsets_name(column)].tolist()
    return [values[a:b] for a, b in zip(o[:-1], o[1:])]


class SafetensorsIterableDataset(torch.utils.data.IterableDataset):
    """Batches of ``batch_size`` samples (``{column: stacked tensor}``), or single samples when
    ``batch_size`` is None. Use with ``DataLoader(ds, batch_size=None, ...)`` or :func:`loader`.

    The global order of an epoch depends only on the manifest's shard sizes, ``shuffle``,
    ``seed``, ``shuffle_block_size`` and the epoch, never on the number of ranks or workers.
    ``rank``/``world_size`` default to ``torch.distributed``'s when it is initialised (else 0/1).
    Every rank gets the same number of batches: without ``drop_last`` the epoch is padded to a
    multiple of ``world_size`` with samples from the start of its order; with ``drop_last`` it is
    cut to whole rounds of ``world_size × batch_size``. See spec/python.md §3.

    ``follow`` (True or a :class:`Follow`): after the epoch, the rows of newer versions as they
    are committed (spec/python.md §3.6).

    ``provenance=True``: every batch also gives where its samples are stored — ``_file`` (a list
    of shard names), ``_row_index`` and ``_added_version`` (int64 tensors, -1 when not recorded);
    single samples a str and 0-d tensors — for ``delete_rows`` (spec/python.md §3.7)."""

    _follow: Follow | None = None  # (a mixture does not follow)
    _resume_segment = 0

    def __init__(self, path: str | os.PathLike[str] | Dataset, columns: str | Sequence[str] | None = None,
                 batch_size: int | None = None, shuffle: bool = False, seed: int = 0, rank: int | None = None,
                 world_size: int | None = None, drop_last: bool = False, *,
                 ragged: str | Mapping[str, str] | None = None, pad_value: float = 0,
                 transform: Callable[[dict[str, Any]], Any] | None = None, pack: Packing | None = None,
                 filter: Filter | None = None, shuffle_block_size: int | None = None,
                 storage_options: Mapping[str, Any] | None = None, cache_dir: str | os.PathLike[str] | None = None,
                 cache_shards: int = 8, version: int | None = None, timestamp: datetime.datetime | str | None = None,
                 follow: Follow | bool | None = None, provenance: bool = False) -> None:
        # each sample's _file, _row_index, _added_version travel with its batch (spec/python.md §3.7)
        self.provenance = check_flag(provenance)
        if provenance and pack is not None:
            refuse_pack("SafetensorsIterableDataset")
        self.dataset = path if isinstance(path, Dataset) else Dataset(
            path, storage_options=storage_options, cache_dir=cache_dir, version=version,
            timestamp=timestamp)
        ds = self.dataset
        # after the epoch, the shards of newer versions (spec/python.md §3.6): the settings each
        # version's segment is read with are this dataset's
        self._follow = Follow._resolve(follow)
        self._segments = Segments(ds, self._follow) if self._follow is not None else None
        # (kept only when following: a filter's function, like transform, then pickles to spawned workers)
        self._user_args = {"ragged": ragged, "pad_value": pad_value, "transform": transform, "pack": pack,
                           "filter": filter, "shuffle_block_size": shuffle_block_size} if self._follow else None
        if pack is not None:
            if not isinstance(pack, Packing):
                raise ValueError(f"pack must be a safetensors_spark.torch.Packing, got {pack!r}")
            pack._check(ds)
            if columns is not None and ds._check_columns(columns) != [pack.column]:
                raise ValueError(f"pack: a packed dataset yields blocks of column '{pack.column}' only; "
                                 f"leave columns out (got {columns!r})")
            if ragged is not None:
                raise ValueError("pack: packed blocks have no ragged form; leave ragged out")
            columns = [pack.column]
        self.columns = ds._check_columns(columns)
        if provenance:
            check_names(self.columns, f"dataset {ds.path} has column(s)")
        self.pack = pack
        # the filter evaluated once over its column: the epoch's order is over the kept samples
        # (spec/python.md §3.4); packed, the stream is made of the kept documents only (§3.3)
        self.selection = Selection(ds, filter) if filter is not None else None
        if pack is not None:
            lengths = document_lengths(ds, pack.column)
            kept = lengths if self.selection is None else lengths[self.selection.kept()]
            tokens = stream_tokens(kept, pack.eos)
            # blocks of an epoch (the same every epoch: the kept documents' token count does not
            # depend on the order)
            self.num_blocks = tokens // pack.seq_len
            self.dropped_tokens = tokens - self.num_blocks * pack.seq_len
            self._lengths = lengths
        self.finish = Finish(resolve_forms(ds, self.columns, ragged) if pack is None else {}, pad_value, transform)
        if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool)
                                       or batch_size < 1):
            raise ValueError(f"batch_size must be an integer >= 1 or None (single samples), got {batch_size!r}")
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        if ds.layout == "kv" and batch_size is not None:
            varying = [c for c in self.columns if ds.schema[c].get("shape") is None]
            if varying:
                raise ValueError(f"column(s) {varying} of KV dataset {ds.path} have rows of different shapes "
                                 f"(schema shape null), so they cannot be stacked: use batch_size=None")
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.drop_last = bool(drop_last)
        self._explicit_rank = (rank, world_size)
        self.rank, self.world_size = self._resolve_rank(rank, world_size)
        counts = [s.samples for s in ds.shards] if self.selection is None else self.selection.counts.tolist()
        if shuffle_block_size is None:
            # (at least 4: a filter that keeps nothing makes an empty epoch, not an error)
            shuffle_block_size = 4 * max(max(counts, default=1), 1)
        if not isinstance(shuffle_block_size, int) or shuffle_block_size < 1:
            raise ValueError(f"shuffle_block_size must be an integer >= 1, got {shuffle_block_size!r}")
        self.shuffle_block_size = shuffle_block_size
        self.cache_shards = cache_shards
        self._epoch = 0
        self._resume = None  # (epoch, position) for the next iterator of that epoch
        self._resume_segment = 0  # follow: the segment (0: the opened version) the next iterator starts in
        self._progress: dict[str, int] | None = None  # {"epoch", "start", "consumed"} counted in the training process
        # the next iterator's (epoch, start) for workers that outlive an iterator (_stateful.py)
        self._live = LiveEpoch()
        self._worker_resume: tuple[int, int, int] | None = None  # (epoch, start, yielded) loaded into a worker by StatefulDataLoader
        self._worker_progress = None  # in a worker: {"epoch", "start", "consumed"} of its iterator
        # batches per worker message and the block pool's release flags (workers × slots);
        # set by loader() while its workers start
        self._handoff = (0, None)  # (0: not a loader()'s worker: one batch per item, torch's handoff)
        self._worker_counters = None  # loader().stats(): the workers' shared counters (_stats.py)
        self._spool: Spool | None = None  # loader(): the spool its workers share remote shards through

    @staticmethod
    def _resolve_rank(rank, world_size):
        d_rank, d_world = _dist_rank_world()
        world_size = d_world if world_size is None else world_size
        rank = d_rank if rank is None else rank
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"rank must be an integer in [0, world_size={world_size}), got {rank!r}")
        return rank, world_size

    def __getstate__(self):
        # Resolved in the training process, where torch.distributed is initialised; DataLoader
        # workers (spawn or forkserver) only see this copy.
        self._refresh_rank()
        state = dict(self.__dict__)
        state["_progress"] = state["_worker_progress"] = None
        return state

    def _refresh_rank(self):
        if torch.utils.data.get_worker_info() is None:
            self.rank, self.world_size = self._resolve_rank(*self._explicit_rank)

    # -- epochs and resume -------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch whose order the next iterator yields. Clears a loaded resume state
        of another epoch."""
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        if self._resume is not None and self._resume[0] != epoch:
            self._resume = None
        self._epoch = epoch
        self._publish()

    def _publish(self):
        """The next iterator's epoch and start, for the workers (read when their iterator starts)."""
        self._live.publish(self._epoch, self._start_position(), self._start_segment())

    def _worker_start(self, peek=False):
        """In a worker: ``(epoch, start, batches of this worker to skip)`` of the iterator that
        starts now: a worker state StatefulDataLoader loaded (once), else the training process's
        latest epoch and start (LiveEpoch)."""
        if self._worker_resume is not None:
            resume = self._worker_resume
            if not peek:
                self._worker_resume = None
            return resume
        return (*self._live.read(), 0)

    @property
    def epoch(self) -> int:
        return self._epoch

    def _start_position(self):
        if self._resume is not None and self._resume[0] == self._epoch:
            return self._resume[1]
        return 0

    def _start_segment(self):
        """follow: the segment the next iterator starts in (0: the opened version)."""
        if self._resume is not None and self._resume[0] == self._epoch:
            return self._resume_segment
        return 0

    def _segment_args(self):
        """The settings a follow segment's dataset is made with (_follow.segment_dataset)."""
        # (an empty version has no columns: a segment then reads all of its own)
        return {"columns": self.columns or None, "batch_size": self.batch_size, "shuffle": self.shuffle, "seed": self.seed,
                "rank": self.rank, "world_size": self.world_size, "drop_last": self.drop_last,
                "cache_shards": self.cache_shards, "provenance": self.provenance, **self._user_args}

    def _units(self):
        """The positions of an epoch: samples (those a filter keeps), or blocks when packing."""
        if self.pack is not None:
            return self.num_blocks
        return len(self.dataset) if self.selection is None else self.selection.total

    def _plan(self, start, *, world_size=None, batch_size=0, drop_last=None):
        """This rank's plan from ``start``; another run's split (world size, batch size,
        drop_last) when given (rank 0 of it: the position after k batches is every rank's)."""
        total = self._units()
        world, rank = (self.world_size, self.rank) if world_size is None else (world_size, 0)
        batch_size = self.batch_size if batch_size == 0 else batch_size
        drop_last = self.drop_last if drop_last is None else drop_last
        if self.pack is not None:
            # blocks beyond a multiple of world_size are dropped: every rank the same count
            total = start + max(total - start, 0) // world * world
        return RankPlan(total, batch_size or 1, world, rank, drop_last, start)

    def __len__(self) -> int:
        """Batches (or samples, without ``batch_size``) this rank yields in the next iterator."""
        if self._follow is not None:
            raise TypeError("len() of a following SafetensorsIterableDataset (follow=...): it yields its epoch and "
                            "then the rows of new versions as they come, so it has no length")
        self._refresh_rank()
        return self._plan(self._start_position()).num_batches

    def _fingerprint(self):
        shards = [[s["shard_path"], s["samples_count"], s["bytes"]] for s in self.dataset.manifest["shards"]]
        return hashlib.sha256(json.dumps(shards).encode()).hexdigest()

    def state_dict(self, batches_consumed: int | None = None) -> dict[str, Any]:
        """Where the training loop stands: ``{epoch, position, ...}``, ``position`` = samples of
        the epoch's global order consumed by all ranks together.

        Without arguments it counts the batches the training loop took from the current
        iterator: exact when the iterator runs in this process (``num_workers=0``) or comes from
        :func:`loader`. With a plain ``DataLoader`` and workers, pass ``batches_consumed`` (the
        batches this rank took from the current iterator)."""
        if torch.utils.data.get_worker_info() is not None:
            # StatefulDataLoader asks each worker: where this worker's iterator stands (§5.1)
            if batches_consumed is not None:
                raise StateError("state_dict(batches_consumed=…) was called inside a DataLoader worker, which "
                                 "cannot know what the training loop has consumed (workers prefetch); call it "
                                 "in the training process (spec/python.md §5)")
            return worker_state(self, self._common_state(), self._worker_progress)
        self._refresh_rank()
        progress = self._progress if (self._progress or {}).get("epoch") == self._epoch else None
        start = progress["start"] if progress is not None else self._start_position()
        if batches_consumed is None:
            batches_consumed = progress["consumed"] if progress is not None else 0
        elif not isinstance(batches_consumed, int) or batches_consumed < 0:
            raise ValueError(f"batches_consumed must be an integer >= 0, got {batches_consumed!r}")
        if self._follow is not None:
            segment = progress.get("segment", 0) if progress is not None else self._start_segment()
            segment, at = follow_position(self, segment, start, batches_consumed)
            return {
                **self._common_state(),
                "epoch": self._epoch,
                "position": at,
                "follow": {"version": self._segment_version(segment)},
            }
        plan = self._plan(start)
        if batches_consumed > plan.num_batches:
            raise StateError(f"batches_consumed={batches_consumed} but rank {self.rank} has only "
                             f"{plan.num_batches} batches in epoch {self._epoch} from position {start}")
        return {
            **self._common_state(),
            "epoch": self._epoch,
            # a position inside the padding (>= N) ends the epoch for every world size: N says so
            "position": min(plan.position_after(batches_consumed), self._units()),
        }

    def _common_state(self):
        """The fields of every state that say which dataset and which order."""
        return {
            "version": STATE_VERSION,
            "total_samples": len(self.dataset),
            "shuffle": self.shuffle,
            "seed": self.seed,
            "shuffle_block_size": self.shuffle_block_size,
            "manifest_fingerprint": self._fingerprint(),
            **({"pack": self.pack._state(), "blocks": self.num_blocks} if self.pack is not None else {}),
            **({"filter": self.selection.state()} if self.selection is not None else {}),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes: the next iterator of ``state['epoch']`` starts at ``state['position']`` of
        its global order. Valid with any world size, worker count or ``batch_size``; the order
        settings (shuffle, seed, shuffle_block_size) and the dataset must be the same.

        Also takes a whole ``torchdata`` ``StatefulDataLoader.state_dict()`` (its iterator's
        batches taken, dealt from the iterator's start: then any worker count and world size
        resume from it too) and, inside a worker, that worker's own state (spec/python.md §5.1)."""
        if isinstance(state, dict) and ("_snapshot" in state or "dataset_state" in state):
            if self._follow is not None:
                raise StateError("a following dataset (follow=...) resumes from its own state_dict() (or loader()'s), "
                                 "which records the version reached; a StatefulDataLoader state does not")
            state = from_loader_state(self, state)
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise StateError(f"not a SafetensorsIterableDataset state (version {STATE_VERSION}): {state!r}")
        # (the filter before shuffle_block_size, whose default follows the kept counts)
        for field, mine in (("manifest_fingerprint", self._fingerprint()), ("shuffle", self.shuffle),
                            ("seed", self.seed),
                            ("filter", self.selection.state() if self.selection is not None else None),
                            ("shuffle_block_size", self.shuffle_block_size),
                            ("total_samples", len(self.dataset)),
                            ("pack", self.pack._state() if self.pack is not None else None)):
            if state.get(field) != mine:
                what = "the dataset's shards changed" if field in ("manifest_fingerprint", "total_samples") \
                    else "the filter keeps other samples" if field == "filter" else "the global order would differ"
                raise StateError(f"cannot resume: state has {field}={state.get(field)!r}, this dataset "
                                 f"iterator has {mine!r} ({what})")
        if self._follow is not None and "worker" in state:
            raise StateError("a following dataset (follow=...) resumes from its own state_dict() (or loader()'s) in "
                             "the training process, not from a DataLoader worker's state")
        if (self._follow is None) != ("follow" not in state):
            raise StateError("cannot resume: " + ("the state was taken of a following dataset (follow=...); "
                                                  "this one does not follow" if self._follow is None else
                                                  "this dataset follows new versions (follow=...); the state was "
                                                  "taken without follow"))
        if "worker" in state:
            self._worker_resume = load_worker_state(self, state)
            self._epoch = self._worker_resume[0]
            return
        self._resume_at(state)

    def _beyond(self, total):
        """What a resume position past ``total`` is beyond (the error's words)."""
        what = f"the epoch's {total} blocks" if self.pack is not None else f"total_samples={total}" \
            if self.selection is None else f"the {total} samples the filter keeps"
        unit = "blocks" if self.pack is not None else "samples"
        return f"{what} (a position is at most the epoch's {total} {unit})"

    def _resume_at(self, state):
        """The next iterator of ``state['epoch']`` starts at ``state['position']`` (both checked)."""
        epoch, position = state.get("epoch"), state.get("position")

        def whole(v):
            return isinstance(v, int) and not isinstance(v, bool) and v >= 0
        if not whole(epoch) or not whole(position):
            raise StateError(f"state epoch/position must be integers >= 0, got {epoch!r}/{position!r}")
        segment = 0
        if self._follow is not None:
            version = (state.get("follow") or {}).get("version") if isinstance(state.get("follow"), dict) else None
            if not whole(version):
                raise StateError(f"state follow.version must be an integer >= 0, got {state.get('follow')!r}")
            segment = self._segments.index_of(version, self.dataset.version, self.dataset)
        total = segment_dataset(self, self._segments, segment)._units() if segment else self._units()
        if position > total:
            raise StateError(f"cannot resume: state has position={position}, beyond {self._beyond(total)}")
        self._epoch = epoch
        self._resume = (epoch, position)
        self._resume_segment = segment
        self._progress = None
        self._publish()

    # -- iteration ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        spool = getattr(self, "_spool", None)  # (None in a dataset pickled before it existed)
        if info is not None and spool is not None:
            spool.attach(self.dataset)  # this worker's copy reads shards through the spool
        start, progress, skip = self._iterator_start(info)
        if self._follow is not None:
            segment = progress["segment"] if progress is not None else 0
            items = follow_generate(self, worker, workers, segment, start, progress, info is not None)
        else:
            items = self._generate(self._plan(start), self._order(), worker, workers, progress, skip)
        if info is not None and self._worker_counters is not None:
            return timed(items, self._worker_counters, worker, [self.dataset])
        return items

    def _iterator_start(self, info):
        """``(start position, progress, batches to skip)`` of an iterator starting now. The
        training process counts what it takes; a worker reads the training process's epoch and
        start now (live workers see ``set_epoch()``) and counts what it yields (its state for
        StatefulDataLoader)."""
        self._refresh_rank()
        if info is None:
            start = self._start_position()
            return start, self._count_from(start), 0
        self._epoch, start, skip = self._worker_start()
        progress = self._worker_progress = {"epoch": self._epoch, "start": start, "consumed": skip,
                                            "segment": self._live.segment()}
        return start, progress, skip

    def _order(self):
        """The epoch's global order (position → shard, row), over the kept samples when filtered."""
        if self.selection is not None:
            return FilteredOrder(self.dataset, self.selection, self.shuffle, self.seed, self._epoch,
                                 self.shuffle_block_size)
        return EpochOrder([s.samples for s in self.dataset.shards], self.shuffle, self.seed,
                          self._epoch, self.shuffle_block_size)

    def _count_from(self, start):
        """A new count, read by state_dict(), of the batches the training loop takes from an
        iterator that starts at position ``start``; a pending resume state is used up. Called
        by this iterator, or by loader() once its workers have started."""
        progress = {"epoch": self._epoch, "start": start, "consumed": 0, "segment": self._start_segment()}
        self._progress = progress
        self._resume = None
        self._resume_segment = 0
        return progress

    def _segment_version(self, segment):
        """The version a follow segment reads (0: the opened one)."""
        return self.dataset.version if segment == 0 else self._segments.versions[segment - 1]

    def _generate(self, plan, order, worker, workers, progress, skip=0, phase=0, pool=None):
        """This worker's batches of ``plan``: the messages (or batches) ``b ≡ worker − phase (mod
        workers)`` — ``phase``: items of the rank's sequence dealt before this plan (a follow's
        earlier segments); ``pool``: the worker's shared-memory blocks kept across plans."""
        if self.pack is not None:
            yield from self._generate_packed(plan, order, worker, workers, progress, skip, phase, pool)
            return
        reader = BatchReader(self.dataset, self.columns, self.cache_shards)
        total = self._units()
        finish = self.finish
        # the rows' provenance, from the (shards, rows) each batch is read with (None: off, no cost)
        prov = Provenance(self.dataset) if self.provenance else None

        def read(shards, rows, shared):
            out = reader.batch(shards, rows, shared=shared)
            return prov.batch(out, shards, rows) if prov is not None else out
        k, release_flags = self._handoff
        in_worker = torch.utils.data.get_worker_info() is not None
        # the store reads ahead in this worker's order (spec/python.md §2.1)
        # (its own instance of the epoch's order, filtered or not; from the batch this worker resumes at)
        first = (worker - phase) % workers  # this worker's first item of the plan
        self.dataset.prefetch(batch_groups(plan, self._order(), first, workers,
                                           max(k, 1) if in_worker and self.batch_size is not None else 1, skip),
                              self.columns)

        def rows_of(j0, j1):
            spans = [plan.batch(j) for j in range(j0, j1)]
            positions = np.concatenate([np.arange(f, f + n, dtype=np.int64) for f, n in spans]) % total
            return (*order.locate(positions), [n for _, n in spans])

        if k >= 1 and self.batch_size is not None and in_worker:
            # loader()'s workers: the batches [b·k, (b+1)·k) of the rank's sequence go to worker
            # b mod workers as one message, so the loader's in-order round robin over workers
            # yields them in the same order as batch by batch; _loader._count splits them again
            if finish.in_worker:  # padding or a transform: finished here, then packed in one block
                def batches_of(j0, j1):
                    return [finish(read(*rows_of(j, j + 1)[:2], shared=False)) for j in range(j0, j1)]

                yield from item_messages(batches_of, plan.num_batches, worker, workers, k, release_flags,
                                         first, pool)
                return
            nested = tuple(c for c, f in finish.forms.items() if f == "nested")
            yield from messages(reader, rows_of, plan.num_batches, worker, workers, k, release_flags, nested,
                                first, pool, prov)
            return
        for j in range(first + skip * workers, plan.num_batches, workers):
            shards, rows, _ = rows_of(j, j + 1)
            if self.batch_size is None:
                out = reader.single(shards[0], rows[0])
                if prov is not None:
                    out = prov.single(out, shards[0], rows[0])
                out = finish.transform(out) if finish.transform is not None else out
            else:
                # a batch the worker pads or transforms is read into private memory: what it
                # sends is the finished batch
                out = finish(read(shards, rows, shared=False if finish.in_worker else None))
            if progress is not None:
                progress["consumed"] += 1
            yield out

    def _generate_packed(self, plan, order, worker, workers, progress, skip=0, phase=0, pool=None):
        if plan.num_batches == 0:  # (a filter may keep no document: no stream to build)
            return
        first = (worker - phase) % workers  # this worker's first item of the plan
        epoch = PackedEpoch(self.dataset, self.pack, order, self._lengths)
        transform = self.finish.transform
        single = self.batch_size is None

        def block_batch(j):
            first, n = plan.batch(j)
            arrays = epoch.blocks(first, first + n)
            out = {name: to_torch(a, self.dataset.schema[self.pack.column]["dtype"]) if name == "tokens"
                   else torch.from_numpy(a) for name, a in arrays.items()}
            if single:
                out = {name: t if name == "cu_seqlens" else t[0] for name, t in out.items()}
            return transform(out) if transform is not None else out

        k, release_flags = self._handoff
        if k >= 1 and torch.utils.data.get_worker_info() is not None:
            if transform is None and self.dataset._store.is_local:  # built into the pooled blocks
                yield from block_messages(epoch, plan.batch, plan.num_batches, worker, workers, k, release_flags,
                                          first, pool)
                return
            yield from item_messages(lambda j0, j1: [block_batch(j) for j in range(j0, j1)], plan.num_batches,
                                     worker, workers, k, release_flags, first, pool)
            return
        for j in range(first + skip * workers, plan.num_batches, workers):
            out = block_batch(j)
            if progress is not None:
                progress["consumed"] += 1
            yield out
