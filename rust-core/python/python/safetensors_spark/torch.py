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
import weakref

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
        # private memory even in a worker: the collate function stacks the views into the
        # shared block it sends, so a shared block here would be a second fresh one per batch
        batch = self._reader.batch(shards, rows, shared=False)
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
        # batches per worker message and the block pool's release flags (workers × slots);
        # set by loader() while its workers start
        self._handoff = (1, None)

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
        k, release_flags = self._handoff
        if k > 1 and self.batch_size is not None and torch.utils.data.get_worker_info() is not None:
            # loader()'s workers: the batches [b·k, (b+1)·k) of the rank's sequence go to worker
            # b mod workers as one message, so the loader's in-order round robin over workers
            # yields them in the same order as batch by batch; _count splits them again
            def rows_of(j0, j1):
                spans = [plan.batch(j) for j in range(j0, j1)]
                positions = np.concatenate([np.arange(f, f + n, dtype=np.int64) for f, n in spans]) % total
                return (*order.locate(positions), [n for _, n in spans])

            yield from _messages(reader, rows_of, plan.num_batches, worker, workers, k, release_flags)
            return
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
        self.pool = None  # a worker's _BlockPool (loader() with several batches per message)
        self.slot = None  # the pooled block the last batch went into: (worker, slot, block|None, specs)

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

    def batch(self, shards, rows, shared=None):
        """``{column: tensor}`` of the rows ``rows`` of the shards ``shards``; in shared memory
        when ``shared`` (default: in a DataLoader worker)."""
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
        if shared is None:
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
        if self.pool is not None:
            slot, block, new = self.pool.get(total)
        else:
            slot, block, new = None, _new_shared_block(total), True
        arrays, tensors, layout = {}, {}, []
        for c, dt, shape, off, nbytes in specs:
            t = self._torch({c: np.empty((0,), dtype=dt)})[c]  # the column's torch dtype
            tensors[c] = block[off: off + nbytes].view(t.dtype).view(shape)
            arrays[c] = tensors[c].view(torch.uint8).numpy().view(dt).reshape(shape) if nbytes else np.empty(shape, dt)
            layout.append((c, t.dtype, shape, off, nbytes))
        if slot is not None:
            self.slot = (self.pool.worker, slot, block if new else None, layout)
        return arrays, tensors


def _new_shared_block(nbytes):
    block = torch.empty(0, dtype=torch.uint8)
    return block.new(block._typed_storage()._new_shared(max(nbytes, 1)))


POOL_SLOTS = 64  # pooled blocks per worker; beyond, a worker sends fresh blocks


class _BlockPool:
    """A worker's shared-memory blocks for its messages, reused once the training process has
    released them. Writing into a fresh shared-memory block costs a page fault (a page allocated
    and zeroed by the kernel) per 4 KiB, ≈ 20 × copying into memory already mapped
    (spec/performance.md §10.8); the training process keeps each block mapped, too.

    ``flags[worker, slot]`` is set to 1 by the training process when every tensor of the message
    in that block is gone (_count), and to 0 by the worker when it reuses the block. A consumer
    that holds many batches makes the pool grow (to POOL_SLOTS), then get fresh blocks: never a
    wait, never a block overwritten while a tensor of it lives."""

    def __init__(self, flags, worker):
        self.flags = flags[worker].numpy()
        self.worker = worker
        self.blocks = []

    def get(self, nbytes):
        """``(slot, block, new)``: a released block of at least ``nbytes``, else a new one
        (slot None once the pool is full)."""
        for slot, block in enumerate(self.blocks):
            if self.flags[slot] == 1 and block.numel() >= nbytes:
                self.flags[slot] = 0
                return slot, block, False
        block = _new_shared_block(nbytes)
        if len(self.blocks) == len(self.flags):
            return None, block, True
        self.blocks.append(block)
        return len(self.blocks) - 1, block, True


def _messages(reader, rows_of, num_batches, worker, workers, k, release_flags):
    """A DataLoader worker's messages of ``k`` batches: batches [b·k, (b+1)·k) for every b ≡
    ``worker`` (mod ``workers``); ``rows_of(j0, j1)`` gives the (shards, rows, lengths) of batches
    [j0, j1)."""
    if release_flags is not None:
        reader.pool = _BlockPool(release_flags, worker)
    for b in range(worker, -(-num_batches // k), workers):
        shards, rows, lengths = rows_of(b * k, min((b + 1) * k, num_batches))
        tensors = reader.batch(shards, rows)
        slot, reader.slot = reader.slot, None
        if slot is None:
            yield _Handoff(lengths, tensors=tensors)
        else:  # in a pooled block: only the slot travels (and the block on its first use)
            yield _Handoff(lengths, slot=slot)


class _SampledBatches(torch.utils.data.IterableDataset):
    """loader() over a map-style :class:`SafetensorsDataset`: the indices a sampler drew in the
    training process when the iterator started, cut into batches of ``batch_size`` and read by
    the workers (or this process) like the iterable dataset's."""

    def __init__(self, dataset, batch_size, drop_last, num_samples):
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_samples = num_samples  # the sampler's len (None: it has none)
        self.indices = None  # drawn when an iterator starts
        self._handoff = (1, None)

    def __len__(self):
        n = len(self.indices) if self.indices is not None else self.num_samples
        if n is None:
            raise TypeError("len() of this loader: its sampler has no len()")
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        ds = self.dataset
        reader = _BatchReader(ds.dataset, ds.columns, cache_shards=8)
        size, num_batches, (k, flags) = self.batch_size, len(self), self._handoff

        def rows_of(j0, j1):
            idx = self.indices[j0 * size: j1 * size]
            return (*ds.dataset.locate_many(idx), [len(idx[i: i + size]) for i in range(0, len(idx), size)])

        if info is not None and k > 1:
            yield from _messages(reader, rows_of, num_batches, worker, workers, k, flags)
            return
        for j in range(worker, num_batches, workers):
            shards, rows, _ = rows_of(j, j + 1)
            yield reader.batch(shards, rows)


class _Handoff:
    """Consecutive batches of one worker sent to the training process as one message, their
    rows one after the other, with each batch's row count (``lengths``). Either ``tensors``
    (column → tensor, one shared-memory block) or ``slot``: ``(worker, slot, block, layout)`` of
    a pooled block, ``block`` only on the slot's first use (the training process keeps it),
    ``layout`` the columns' ``(name, torch dtype, shape, byte offset, bytes)`` in it."""

    __slots__ = ("lengths", "tensors", "slot")

    def __init__(self, lengths, tensors=None, slot=None):
        self.lengths = lengths
        self.tensors = tensors
        self.slot = slot

    def pin_memory(self, device=None):
        pin = (lambda t: t.pin_memory(device)) if device else (lambda t: t.pin_memory())
        return _Handoff(self.lengths, tensors={c: pin(t) for c, t in self.tensors.items()})

    def batches(self, blocks=None, flags=None):
        """The batches as ``{column: tensor}`` views of the message's block (no copy). A pooled
        block is looked up in (or added to) ``blocks``; its release flag is set once every
        tensor of this message is gone."""
        tensors = self.tensors
        if self.slot is not None:
            worker, slot, block, layout = self.slot
            if block is not None:
                blocks[worker, slot] = block.numpy()  # mapped once for the iterator's life
            # this message's own storage over the block's memory: a numpy view that every tensor
            # and storage made from the batches (views, detach, numpy, untyped_storage, dlpack)
            # keeps alive; when the last of them goes, the block is released to the worker
            memory = blocks[worker, slot][:]
            weakref.finalize(memory, _release, flags, worker, slot)
            base = torch.from_numpy(memory)
            del memory
            tensors = {c: base[off: off + nbytes].view(dtype).view(shape) for c, dtype, shape, off, nbytes in layout}
            del base
        first = 0
        for n in self.lengths:
            yield {c: t[first: first + n] for c, t in tensors.items()}
            first += n


def _release(flags, worker, slot):
    flags[worker, slot] = 1


HANDOFF_BYTES = 8 << 20


def _handoff_batches(data, columns, batch_size, requested):
    """Batches per worker message: ``requested``, or as many batches as fit in HANDOFF_BYTES
    (at least 1) when the schema of ``data`` (a Dataset) gives every column's sample size, else 1."""
    if requested is not None:
        if not isinstance(requested, int) or isinstance(requested, bool) or requested < 1:
            raise ValueError(f"loader(): handoff_batches must be an integer >= 1 or None (automatic), "
                             f"got {requested!r}")
        return requested
    if batch_size is None:
        return 1
    sample = 0
    for c in columns:
        shape = data.schema[c].get("shape")
        dims = None if shape is None else (shape[1:] if data.layout == "batch" else shape)
        if dims is None or any(not isinstance(d, int) or d < 0 for d in dims):
            return 1
        sample += int(np.prod(dims, dtype=np.int64)) * data._dtypes[c].itemsize
    return max(1, HANDOFF_BYTES // max(1, sample * batch_size))


class _CountingLoader(torch.utils.data.DataLoader):
    def __init__(self, dataset, handoff_batches, **kwargs):
        super().__init__(dataset, **kwargs)
        self.handoff_batches = handoff_batches

    def __iter__(self):
        ds = self.dataset
        if isinstance(ds, _SampledBatches):
            # the epoch's indices, drawn here (a RandomSampler draws a new permutation per iterator)
            indices = np.fromiter((int(i) for i in self.sampled_from), dtype=np.int64)
            ds.dataset.dataset.locate_many(indices)  # an index out of range fails here, naming it
            ds.indices = indices
            if self.num_workers == 0:
                return super().__iter__()
            iterator = self._start_workers(ds)
            return _count(iterator, {"consumed": 0}, self._flags)
        if self.num_workers == 0:
            return super().__iter__()  # the dataset's own iterator counts in this process
        ds._refresh_rank()
        start = ds._start_position()
        iterator = self._start_workers(ds)
        progress = {"epoch": ds._epoch, "start": start, "consumed": 0}
        ds._progress = progress
        ds._resume = None
        return _count(iterator, progress, self._flags)

    def _start_workers(self, ds):
        flags = None
        if self.handoff_batches > 1 and not self.pin_memory:
            # (with pin_memory the pinning thread copies every message: nothing to reuse)
            flags = torch.zeros((self.num_workers, POOL_SLOTS), dtype=torch.uint8).share_memory_()
        ds._handoff = (self.handoff_batches, flags)
        try:
            iterator = super().__iter__()  # workers start here, with the pending resume state
        finally:
            ds._handoff = (1, None)  # only this loader's workers send several batches per message
        self._flags = flags
        return iterator


def _count(iterator, progress, flags=None):
    blocks = {}  # (worker, slot) -> the pooled blocks of this iterator's workers, mapped once
    flags = flags.numpy() if flags is not None else None
    for item in iterator:
        for batch in item.batches(blocks, flags) if isinstance(item, _Handoff) else (item,):
            progress["consumed"] += 1
            yield batch


def loader(dataset, *, handoff_batches=None, **kwargs):
    """A ``DataLoader`` over a safetensors-spark dataset, with the batches of several worker
    reads sent to the training process in one message.

    * A :class:`SafetensorsIterableDataset` (it batches: ``batch_size`` must not be given): the
      loader counts, in this process, the batches the training loop has taken, so
      ``dataset.state_dict()`` is exact for any ``num_workers``.
    * A :class:`SafetensorsDataset` (map-style): ``batch_size`` (required), ``shuffle``,
      ``sampler``, ``drop_last`` and ``generator`` as ``DataLoader`` takes them. The sampler's
      indices for the epoch are drawn in this process when the iterator starts, cut into batches
      of ``batch_size`` in that order and read as whole batches (one gather per column instead
      of a sample at a time and a collate).

    Other keyword arguments go to ``DataLoader``; ``persistent_workers`` (workers would keep a
    stale epoch or sample) and ``in_order=False`` (batches in completion order) are refused.

    With workers, each worker sends ``handoff_batches`` consecutive batches of its share in one
    message (default: as many as fit in 8 MiB), and the loader yields them one at a time as views
    of that message: the same batches in the same order as one batch per message, with torch's
    per-message cost (pickling, a shared-memory segment, its descriptor) paid once per several
    batches. The shared-memory blocks are reused once every tensor of a message is gone.
    ``prefetch_factor`` then counts messages. A ``collate_fn`` runs once per message in the
    worker, so with one the loader sends one batch per message."""
    if kwargs.get("persistent_workers"):
        raise ValueError("loader(): persistent_workers=True would keep each worker's copy of the dataset, so "
                         "set_epoch(), load_state_dict() and a new sample of indices would not reach it; "
                         "leave it False")
    if kwargs.get("in_order") is False:
        raise ValueError("loader(): in_order=False returns batches in completion order, which breaks the "
                         "sample order and the resume count; leave it True")
    if isinstance(dataset, SafetensorsDataset):
        return _map_loader(dataset, handoff_batches, kwargs)
    if not isinstance(dataset, SafetensorsIterableDataset):
        raise TypeError(f"loader() takes a SafetensorsIterableDataset or a SafetensorsDataset, "
                        f"got {type(dataset).__name__}")
    if kwargs.get("batch_size") is not None:
        raise ValueError("loader(): the dataset batches (its batch_size); do not pass batch_size to the DataLoader")
    kwargs["batch_size"] = None
    handoff = _handoff_batches(dataset.dataset, dataset.columns, dataset.batch_size, handoff_batches)
    if kwargs.get("collate_fn") is not None:
        handoff = 1
    return _CountingLoader(dataset, handoff, **kwargs)


def _map_loader(dataset, handoff_batches, kwargs):
    batch_size = kwargs.pop("batch_size", None)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"loader(): batch_size must be an integer >= 1 for a map-style SafetensorsDataset, "
                         f"got {batch_size!r}")
    if kwargs.get("batch_sampler") is not None:
        raise ValueError("loader(): batch_sampler is not supported; pass sampler= and batch_size=")
    shuffle = kwargs.pop("shuffle", False)
    sampler = kwargs.pop("sampler", None)
    drop_last = bool(kwargs.pop("drop_last", False))
    generator = kwargs.pop("generator", None)
    if sampler is not None and shuffle:
        raise ValueError("loader(): sampler and shuffle=True are mutually exclusive (as for DataLoader)")
    if sampler is None:
        sampler = torch.utils.data.RandomSampler(dataset, generator=generator) if shuffle \
            else torch.utils.data.SequentialSampler(dataset)
    data = dataset.dataset
    if data.layout == "kv":
        ragged = [c for c in dataset.columns if data.schema[c].get("shape") is None]
        if ragged:
            raise ValueError(f"loader(): column(s) {ragged} of KV dataset {data.path} have rows of different "
                             f"shapes (schema shape null), so they cannot be stacked into batches")
    handoff = _handoff_batches(data, dataset.columns, batch_size, handoff_batches)
    if kwargs.get("collate_fn") is not None:
        handoff = 1
    num_samples = len(sampler) if hasattr(sampler, "__len__") else None
    made = _CountingLoader(_SampledBatches(dataset, batch_size, drop_last, num_samples), handoff, batch_size=None,
                           **kwargs)
    made.sampled_from = sampler
    return made
