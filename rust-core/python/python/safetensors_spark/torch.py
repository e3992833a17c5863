"""PyTorch datasets over a safetensors-spark dataset (spec/python.md §3-§5).

* :class:`SafetensorsDataset` — map-style; ``ds[i]`` → ``{column: tensor}``.
* :class:`SafetensorsIterableDataset` — batches in a global order that depends only on the
  manifest, ``seed`` and the epoch; split over ranks and DataLoader workers; exact resume.
* :func:`loader` — a ``torch.utils.data.DataLoader`` over an iterable dataset that counts, in the
  training process, the batches the loop has taken, so ``dataset.state_dict()`` is exact with any
  ``num_workers``.
"""

import hashlib
import json

import numpy as np
import torch
import torch.utils.data

from ._dataset import Dataset
from ._errors import StateError
from ._sampling import EpochOrder, RankPlan

STATE_VERSION = 1


def _to_torch(array, dtype):
    """A torch tensor sharing ``array``'s memory. BF16 goes through its uint16 bits."""
    if dtype == "BF16":
        return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _dist_rank_world():
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class SafetensorsDataset(torch.utils.data.Dataset):
    """Map-style: ``len(ds)`` samples (pad rows excluded), ``ds[i]`` → ``{column: tensor}``.

    Local shards are memory-mapped (private, copy-on-write): the tensors are views of the map,
    no bytes are copied; remote shards are read by byte range into fresh tensors."""

    def __init__(self, path, columns=None, *, storage_options=None, cache_dir=None):
        self.dataset = path if isinstance(path, Dataset) else Dataset(
            path, storage_options=storage_options, cache_dir=cache_dir)
        self.columns = self.dataset.check_columns(columns)
        self._reader = None  # _BatchReader of __getitems__, made in the process that reads

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        ds = self.dataset
        shard, row = ds.locate(i)
        sample = ds.sample(shard, row, self.columns)
        return {c: _to_torch(a, ds.schema[c]["dtype"]) for c, a in sample.items()}

    def __getitems__(self, indices):
        """The samples of a DataLoader batch, ``[ds[i] for i in indices]`` in value: torch's
        fetcher calls this with the sampler's batch instead of ``ds[i]`` per index. Batch-layout
        rows are gathered per column in one pass (a slice or ``take`` per shard run, or a row copy
        per sample when the rows are scattered over many shards) and handed out as views of the
        gathered tensors, which the collate function stacks (spec/python.md §4)."""
        ds = self.dataset
        if ds.layout != "batch" or len(indices) == 0:
            return [self[i] for i in indices]
        shards, rows = ds.locate_many(indices)
        if self._reader is None:
            self._reader = _BatchReader(ds, self.columns, cache_shards=8)
        batch = self._reader.batch(shards, rows)
        views = [batch[c].unbind(0) for c in self.columns]
        return [dict(zip(self.columns, v)) for v in zip(*views)]

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_reader"] = None  # maps and arrays of this process stay here
        return state

    def get(self, key):
        """KV datasets: ``{column: tensor}`` of the row with this key."""
        ds = self.dataset
        return {c: _to_torch(a, ds.schema[c]["dtype"]) for c, a in ds.get(key, self.columns).items()}


class SafetensorsIterableDataset(torch.utils.data.IterableDataset):
    """Batches of ``batch_size`` samples (``{column: stacked tensor}``), or single samples when
    ``batch_size`` is None. Use with ``DataLoader(ds, batch_size=None, ...)`` or :func:`loader`.

    The global order of an epoch depends only on the manifest's shard sizes, ``shuffle``,
    ``seed``, ``shuffle_block_size`` and the epoch, never on the number of ranks or workers.
    ``rank``/``world_size`` default to ``torch.distributed``'s when it is initialised (else 0/1).
    Every rank gets the same number of batches: without ``drop_last`` the epoch is padded to a
    multiple of ``world_size`` with samples from the start of its order; with ``drop_last`` it is
    cut to whole rounds of ``world_size × batch_size``. See spec/python.md §3."""

    def __init__(self, path, columns=None, batch_size=None, shuffle=False, seed=0, rank=None,
                 world_size=None, drop_last=False, *, shuffle_block_size=None, storage_options=None,
                 cache_dir=None, cache_shards=8):
        self.dataset = path if isinstance(path, Dataset) else Dataset(
            path, storage_options=storage_options, cache_dir=cache_dir)
        ds = self.dataset
        self.columns = ds.check_columns(columns)
        if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool)
                                       or batch_size < 1):
            raise ValueError(f"batch_size must be an integer >= 1 or None (single samples), got {batch_size!r}")
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        if ds.layout == "kv" and batch_size is not None:
            ragged = [c for c in self.columns if ds.schema[c].get("shape") is None]
            if ragged:
                raise ValueError(f"column(s) {ragged} of KV dataset {ds.path} have rows of different shapes "
                                 f"(schema shape null), so they cannot be stacked: use batch_size=None")
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.drop_last = bool(drop_last)
        self._explicit_rank = (rank, world_size)
        self.rank, self.world_size = self._resolve_rank(rank, world_size)
        counts = [s.samples for s in ds.shards]
        if shuffle_block_size is None:
            shuffle_block_size = 4 * max(counts, default=1)
        if not isinstance(shuffle_block_size, int) or shuffle_block_size < 1:
            raise ValueError(f"shuffle_block_size must be an integer >= 1, got {shuffle_block_size!r}")
        self.shuffle_block_size = shuffle_block_size
        self.cache_shards = cache_shards
        self._epoch = 0
        self._resume = None  # (epoch, position) for the next iterator of that epoch
        self._progress = None  # {"epoch", "start", "consumed"} counted in the training process

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
        state["_progress"] = None
        return state

    def _refresh_rank(self):
        if torch.utils.data.get_worker_info() is None:
            self.rank, self.world_size = self._resolve_rank(*self._explicit_rank)

    # -- epochs and resume -------------------------------------------------------------------

    def set_epoch(self, epoch):
        """Selects the epoch whose order the next iterator yields. Clears a loaded resume state
        of another epoch."""
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        if self._resume is not None and self._resume[0] != epoch:
            self._resume = None
        self._epoch = epoch

    @property
    def epoch(self):
        return self._epoch

    def _start_position(self):
        if self._resume is not None and self._resume[0] == self._epoch:
            return self._resume[1]
        return 0

    def _plan(self, start):
        return RankPlan(len(self.dataset), self.batch_size or 1, self.world_size, self.rank,
                        self.drop_last, start)

    def __len__(self):
        """Batches (or samples, without ``batch_size``) this rank yields in the next iterator."""
        self._refresh_rank()
        return self._plan(self._start_position()).num_batches

    def _fingerprint(self):
        shards = [[s["shard_path"], s["samples_count"], s["bytes"]] for s in self.dataset.manifest["shards"]]
        return hashlib.sha256(json.dumps(shards).encode()).hexdigest()

    def state_dict(self, batches_consumed=None):
        """Where the training loop stands: ``{epoch, position, ...}``, ``position`` = samples of
        the epoch's global order consumed by all ranks together.

        Without arguments it counts the batches the training loop took from the current
        iterator: exact when the iterator runs in this process (``num_workers=0``) or comes from
        :func:`loader`. With a plain ``DataLoader`` and workers, pass ``batches_consumed`` (the
        batches this rank took from the current iterator)."""
        if torch.utils.data.get_worker_info() is not None:
            raise StateError("state_dict() was called inside a DataLoader worker, which cannot know what the "
                             "training loop has consumed (workers prefetch); call it in the training process "
                             "(spec/python.md §5)")
        self._refresh_rank()
        progress = self._progress if (self._progress or {}).get("epoch") == self._epoch else None
        start = progress["start"] if progress is not None else self._start_position()
        if batches_consumed is None:
            batches_consumed = progress["consumed"] if progress is not None else 0
        elif not isinstance(batches_consumed, int) or batches_consumed < 0:
            raise ValueError(f"batches_consumed must be an integer >= 0, got {batches_consumed!r}")
        plan = self._plan(start)
        if batches_consumed > plan.num_batches:
            raise StateError(f"batches_consumed={batches_consumed} but rank {self.rank} has only "
                             f"{plan.num_batches} batches in epoch {self._epoch} from position {start}")
        return {
            "version": STATE_VERSION,
            "epoch": self._epoch,
            "position": plan.position_after(batches_consumed),
            "total_samples": len(self.dataset),
            "shuffle": self.shuffle,
            "seed": self.seed,
            "shuffle_block_size": self.shuffle_block_size,
            "manifest_fingerprint": self._fingerprint(),
        }

    def load_state_dict(self, state):
        """Resumes: the next iterator of ``state['epoch']`` starts at ``state['position']`` of
        its global order. Valid with any world size, worker count or ``batch_size``; the order
        settings (shuffle, seed, shuffle_block_size) and the dataset must be the same."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise StateError(f"not a SafetensorsIterableDataset state (version {STATE_VERSION}): {state!r}")
        for field, mine in (("manifest_fingerprint", self._fingerprint()), ("shuffle", self.shuffle),
                            ("seed", self.seed), ("shuffle_block_size", self.shuffle_block_size),
                            ("total_samples", len(self.dataset))):
            if state.get(field) != mine:
                what = "the dataset's shards changed" if field in ("manifest_fingerprint", "total_samples") \
                    else "the global order would differ"
                raise StateError(f"cannot resume: state has {field}={state.get(field)!r}, this dataset "
                                 f"iterator has {mine!r} ({what})")
        epoch, position = state.get("epoch"), state.get("position")
        if not isinstance(epoch, int) or epoch < 0 or not isinstance(position, int) or position < 0:
            raise StateError(f"state epoch/position must be integers >= 0, got {epoch!r}/{position!r}")
        self._epoch = epoch
        self._resume = (epoch, position)
        self._progress = None

    # -- iteration ---------------------------------------------------------------------------

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        self._refresh_rank()
        start = self._start_position()
        plan = self._plan(start)
        order = EpochOrder([s.samples for s in self.dataset.shards], self.shuffle, self.seed,
                           self._epoch, self.shuffle_block_size)
        progress = None
        if info is None:  # the training process itself iterates: count what it takes
            progress = {"epoch": self._epoch, "start": start, "consumed": 0}
            self._progress = progress
            self._resume = None
        return self._generate(plan, order, worker, workers, progress)

    def _generate(self, plan, order, worker, workers, progress):
        reader = _BatchReader(self.dataset, self.columns, self.cache_shards)
        total = len(self.dataset)
        for j in range(worker, plan.num_batches, workers):
            first, length = plan.batch(j)
            positions = np.arange(first, first + length, dtype=np.int64) % total
            shards, rows = order.locate(positions)
            out = reader.single(shards[0], rows[0]) if self.batch_size is None else reader.batch(shards, rows)
            if progress is not None:
                progress["consumed"] += 1
            yield out


class _BatchReader:
    """Cuts batches out of shard memory: a contiguous run of rows is a view (local) or one range
    read (remote); scattered rows are one ``take`` per shard; KV rows are stacked."""

    def __init__(self, dataset, columns, cache_shards):
        self.ds = dataset
        self.columns = columns
        self.dtypes = {c: dataset.schema[c]["dtype"] for c in columns}
        self.cache_shards = max(1, int(cache_shards))
        self._full = {}  # (shard index, column) -> whole column array (remote: LRU)

    def _column(self, shard, column):
        key = (shard.index, column)
        a = self._full.get(key)
        if a is None:
            a = self.ds.tensor_array(shard, self.ds._header(shard)[column])
            # local: a view of the process's map of the shard, kept (costs no memory of its own);
            # remote: a fresh read, kept for the last `cache_shards` shards
            if not self.ds._store.is_local and len(self._full) >= self.cache_shards * len(self.columns):
                self._full.pop(next(iter(self._full)))
            self._full[key] = a
        return a

    def _torch(self, arrays):
        return {c: _to_torch(a, self.dtypes[c]) for c, a in arrays.items()}

    def single(self, shard_index, row):
        shard = self.ds.shards[int(shard_index)]
        return self._torch(self.ds.sample(shard, int(row), self.columns))

    def batch(self, shards, rows):
        ds = self.ds
        if ds.layout == "kv":
            out = {}
            for c in self.columns:
                parts = []
                for s, r in zip(shards.tolist(), rows.tolist()):
                    shard = ds.shards[s]
                    ds._kv_keys(shard)
                    parts.append(ds.kv_tensor(shard, shard.keys[r], c))
                out[c] = np.stack(parts)
            return self._torch(out)
        n = len(rows)
        cut = np.flatnonzero((np.diff(shards) != 0) | (np.diff(rows) != 1)) + 1
        bounds = [0, *cut.tolist(), n]
        shared = torch.utils.data.get_worker_info() is not None
        if len(bounds) - 1 <= 4:  # a few contiguous runs: slices
            runs = []
            for a, b in zip(bounds[:-1], bounds[1:]):
                shard = ds.shards[int(shards[a])]
                r0 = int(rows[a])
                runs.append((a, b, {c: ds.rows(shard, c, r0, r0 + (b - a)) for c in self.columns}))
            if len(runs) == 1 and not shared:
                return self._torch(runs[0][2])  # one run, in this process: a zero-copy view of the map
            arrays, tensors = self._alloc(n, runs[0][2], shared)
            for a, b, run in runs:
                for c in self.columns:
                    arrays[c][a:b] = run[c]
            return tensors
        uniq = np.unique(shards).tolist()
        if len(uniq) * 4 > n:
            # scattered over many shards (a random sampler over the whole dataset): one row copy
            # per sample and column beats a mask and a take per shard
            cols = {c: {s: self._column(ds.shards[s], c) for s in uniq} for c in self.columns}
            arrays, tensors = self._alloc(n, {c: cols[c][uniq[0]] for c in self.columns}, shared)
            where = list(zip(shards.tolist(), rows.tolist()))
            for c in self.columns:
                buf, src = arrays[c], cols[c]
                for k, (s, r) in enumerate(where):
                    buf[k] = src[s][r]
            return tensors
        first = {c: self._column(ds.shards[uniq[0]], c) for c in self.columns}
        arrays, tensors = self._alloc(n, first, shared)
        for s in uniq:
            m = shards == s
            for c in self.columns:
                arrays[c][m] = self._column(ds.shards[s], c).take(rows[m], axis=0)
        return tensors

    def _alloc(self, n, like, shared):
        """Output buffers for a batch of ``n`` rows shaped like the arrays ``like`` (column →
        rows): ``(column → numpy array to fill, column → tensor of the same memory)``.

        In a DataLoader worker all columns share one block of shared memory (what torch's own
        collate does for its stacked batches): sending the batch to the training process then
        passes one handle instead of copying every tensor into shared memory of its own."""
        specs, total = [], 0
        for c in self.columns:
            a = like[c]
            shape = (n, *a.shape[1:])
            nbytes = int(np.prod(shape, dtype=np.int64)) * a.dtype.itemsize
            specs.append((c, a.dtype, shape, total, nbytes))
            total += -(-nbytes // 64) * 64  # each column 64-byte aligned
        if not shared:
            arrays = {c: np.empty(shape, dtype=dt) for c, dt, shape, _, _ in specs}
            return arrays, self._torch(arrays)
        block = torch.empty(0, dtype=torch.uint8)
        block = block.new(block._typed_storage()._new_shared(max(total, 1)))
        arrays, tensors = {}, {}
        for c, dt, shape, off, nbytes in specs:
            t = self._torch({c: np.empty((0,), dtype=dt)})[c]  # the column's torch dtype
            tensors[c] = block[off: off + nbytes].view(t.dtype).view(shape)
            arrays[c] = tensors[c].view(torch.uint8).numpy().view(dt).reshape(shape) if nbytes else np.empty(shape, dt)
        return arrays, tensors


class _CountingLoader(torch.utils.data.DataLoader):
    def __iter__(self):
        ds = self.dataset
        if self.num_workers == 0:
            return super().__iter__()  # the dataset's own iterator counts in this process
        ds._refresh_rank()
        start = ds._start_position()
        iterator = super().__iter__()  # workers start here, with the pending resume state
        progress = {"epoch": ds._epoch, "start": start, "consumed": 0}
        ds._progress = progress
        ds._resume = None
        return _count(iterator, progress)


def _count(iterator, progress):
    for batch in iterator:
        progress["consumed"] += 1
        yield batch


def loader(dataset, **kwargs):
    """A ``DataLoader`` over a :class:`SafetensorsIterableDataset` (``batch_size=None``: the
    dataset batches) that counts, in this process, the batches the training loop has taken, so
    ``dataset.state_dict()`` is exact for any ``num_workers``. Other keyword arguments go to
    ``DataLoader``; ``persistent_workers`` (workers would keep a stale epoch) and ``in_order=False``
    are refused."""
    if not isinstance(dataset, SafetensorsIterableDataset):
        raise TypeError(f"loader() takes a SafetensorsIterableDataset, got {type(dataset).__name__}")
    if kwargs.get("batch_size") is not None:
        raise ValueError("loader(): the dataset batches (its batch_size); do not pass batch_size to the DataLoader")
    if kwargs.get("persistent_workers"):
        raise ValueError("loader(): persistent_workers=True would keep each worker's copy of the dataset, so "
                         "set_epoch() and load_state_dict() would not reach it; leave it False")
    if kwargs.get("in_order") is False:
        raise ValueError("loader(): in_order=False returns batches in completion order, which breaks the "
                         "sample order and the resume count; leave it True")
    kwargs["batch_size"] = None
    return _CountingLoader(dataset, **kwargs)
