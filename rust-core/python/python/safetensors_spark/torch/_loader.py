"""``loader()``: a DataLoader over a safetensors-spark dataset that counts, in the training
process, the batches the loop has taken (exact ``state_dict()`` with any ``num_workers``), reads
a map-style dataset's sampled indices as whole batches, and has its workers send several batches
per message (``_handoff``)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.utils.data

from .._errors import StateError
from .._prefetch import index_groups
from ._torch_datasets import SafetensorsDataset, SafetensorsIterableDataset
from ._torch_mixture import SafetensorsMixture
from ._device import Delivery, resolve_device
from ._handoff import POOL_SLOTS, Handoff, Releases, batches_per_message, item_messages, messages
from ._provenance import Provenance
from ._reader import BatchReader
from ._stats import LoaderStats, timed, worker_counters
from .._spool import ROOM, make_spool, spool_bound, why_not_spool


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
        self.shared = None  # persistent workers: the indices in shared memory, rewritten per iterator
        self._handoff = (0, None)
        self._worker_counters = None  # loader().stats() (_stats.py)

    def __len__(self):
        n = len(self.indices) if self.indices is not None else self.num_samples
        if n is None:
            raise TypeError("len() of this loader: its sampler has no len()")
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is not None and self._worker_counters is not None:
            return timed(self._items(info), self._worker_counters, info.id, [self.dataset.dataset])
        return self._items(info)

    def _items(self, info):
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        ds = self.dataset
        if info is not None and self.shared is not None:
            self.indices = self.shared.numpy()  # this iterator's draw, written by the training process
        reader = BatchReader(ds.dataset, ds.columns, cache_shards=8)
        size, num_batches, (k, flags) = self.batch_size, len(self), self._handoff

        finish = ds.finish
        # SafetensorsDataset(provenance=True): each batch's rows' provenance (spec/python.md §3.7)
        prov = Provenance(ds.dataset) if ds.provenance else None

        def read(shards, rows, shared):
            out = reader.batch(shards, rows, shared=shared)
            return prov.batch(out, shards, rows) if prov is not None else out

        # the store reads ahead in this worker's order (spec/python.md §2.1)
        ds.dataset.prefetch(index_groups(ds._locate_many, self.indices, size, worker, workers,
                                         max(k, 1) if info is not None else 1), ds.columns)

        def rows_of(j0, j1):
            idx = self.indices[j0 * size: j1 * size]
            return (*ds._locate_many(idx), [len(idx[i: i + size]) for i in range(0, len(idx), size)])

        if info is not None and k >= 1:
            if finish.in_worker:
                def batches_of(j0, j1):
                    return [finish(read(*rows_of(j, j + 1)[:2], shared=False)) for j in range(j0, j1)]

                yield from item_messages(batches_of, num_batches, worker, workers, k, flags)
                return
            nested = tuple(c for c, f in finish.forms.items() if f == "nested")
            yield from messages(reader, rows_of, num_batches, worker, workers, k, flags, nested, provenance=prov)
            return
        for j in range(worker, num_batches, workers):
            shards, rows, _ = rows_of(j, j + 1)
            yield finish(read(shards, rows, shared=False if finish.in_worker else None))


class _CountingLoader(torch.utils.data.DataLoader):
    def __init__(self, dataset, handoff_batches, pin=False, device=None, stats_every=None, stats_callback=None,
                 share_shards=None, **kwargs):
        # pinning and the device copy are this loader's (_device), not torch's pinning thread
        super().__init__(dataset, **kwargs)
        self.handoff_batches = handoff_batches
        self.spool = _spool_for(dataset, share_shards, self.num_workers)
        self.pin, self.device = pin, device
        self.stats_every, self.stats_callback = stats_every, stats_callback
        self._stats = None  # the latest iterator's LoaderStats
        self._counters = None  # live workers' counters (persistent_workers: one array for all iterators)
        self._counters_base = None  # their values when this iterator's workers were started or woken

    def stats(self) -> dict[str, Any] | None:
        """The latest iterator's figures (spec/python.md §3.1.2): batches and bytes, rates from the
        first batch on, time to the first batch, the time the loop waited for batches and the
        loader's CPU per batch in this process, the workers' busy share, the host→device rate,
        and remote reads (bytes, GETs and their latency, node-cache hits and misses). ``None``
        before the first iterator."""
        return self._stats.snapshot() if self._stats is not None else None

    def _counted(self, iterator, progress, flags=None, delivery=None, counted=False):
        """The iterator's batches through :func:`_count`, with this iterator's LoaderStats."""
        counters = self._counters if self.num_workers > 0 else None
        self._stats = LoaderStats(self.num_workers, counters, self._counters_base if counters is not None else None,
                                  _datasets_of(self.dataset), self.device, self.stats_every, self.stats_callback)
        return _count(iterator, progress, self._stats, flags, delivery, counted, self.spool)

    def __iter__(self):
        ds = self.dataset
        delivery = Delivery(self.device) if self.pin else None
        if isinstance(ds, _SampledBatches):
            # the epoch's indices, drawn here (a RandomSampler draws a new permutation per iterator)
            indices = np.fromiter((int(i) for i in self.sampled_from), dtype=np.int64)
            ds.dataset.dataset._locate_many(indices)  # an index out of range fails here, naming it
            if self.persistent_workers and self.num_workers > 0:
                # live workers read each iterator's indices from one shared buffer
                if ds.shared is None:
                    ds.shared = torch.from_numpy(indices).share_memory_()
                elif len(ds.shared) != len(indices):
                    raise ValueError(f"loader(persistent_workers=True): the sampler drew {len(indices)} indices "
                                     f"for this iterator but {len(ds.shared)} for the first; live workers read "
                                     f"the indices from a buffer of the first size: use a sampler of fixed "
                                     f"length, or persistent_workers=False")
                else:
                    ds.shared.copy_(torch.from_numpy(indices))
                indices = ds.shared.numpy()
            ds.indices = indices
            if self.num_workers == 0:
                return self._counted(super().__iter__(), {"consumed": 0}, None, delivery)
            iterator = self._start_workers(ds)
            return self._counted(iterator, {"consumed": 0}, self._flags, delivery)
        if self.num_workers == 0:
            it = super().__iter__()  # the dataset's own iterator counts in this process
            # the dataset counted each batch as it gave it; _count counts it when the loop gets it
            # (one batch later with a device copy ahead)
            return self._counted(it, ds._progress, None, delivery, counted=True)
        ds._publish()  # the epoch and start the workers read when their iterator starts (live ones too)
        ds._refresh_rank()
        start = ds._start_position()
        iterator = self._start_workers(ds)
        return self._counted(iterator, ds._count_from(start), self._flags, delivery)

    def _start_workers(self, ds):
        flags = None
        if self.handoff_batches >= 1 and not self.persistent_workers:
            # (live workers would keep a pool whose release flags outlive the iterator that set them)
            flags = torch.zeros((self.num_workers, POOL_SLOTS), dtype=torch.uint8).share_memory_()
        if self._counters is None or not self.persistent_workers:
            self._counters = worker_counters(self.num_workers)
        self._counters_base = self._counters.clone()
        ds._handoff = (self.handoff_batches, flags)
        ds._worker_counters = self._counters
        ds._spool = self.spool
        try:
            iterator = super().__iter__()  # workers start here, with the pending resume state
        finally:
            ds._handoff = (0, None)  # only this loader's workers send messages in pooled blocks
            ds._worker_counters = None
            ds._spool = None
        self._flags = flags
        return iterator

    # -- the Stateful protocol (torch.distributed.checkpoint, spec/python.md §5.1) ----------------

    def state_dict(self) -> dict[str, Any]:
        """The dataset's resume state (``SafetensorsIterableDataset.state_dict()``): the epoch and
        the position of its global order the loop has consumed, counted here."""
        return self._iterable_dataset("state_dict").state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes the dataset (``SafetensorsIterableDataset.load_state_dict()``): the next
        iterator starts where ``state`` stopped, with any worker count or world size."""
        self._iterable_dataset("load_state_dict").load_state_dict(state)

    def _iterable_dataset(self, what):
        if isinstance(self.dataset, _SampledBatches):
            raise StateError(f"loader().{what}(): a map-style SafetensorsDataset's order is its sampler's, and a "
                             f"sampler keeps no resumable state; use SafetensorsIterableDataset (exact resume "
                             f"with any worker count and world size) or torchdata's StatefulDataLoader, whose "
                             f"samplers save their state (spec/python.md §5.1)")
        return self.dataset


def _spool_for(ds, share_shards, workers):
    """The spool the loader's workers share remote shards through (spec/python.md §2.1), or
    ``None``: ``share_shards`` None decides by :func:`why_not_spool`; True asks for one (a
    ``ValueError`` says why there is none); False never."""
    if share_shards is False:
        return None
    if share_shards is not None and share_shards is not True:
        raise ValueError(f"loader(): share_shards must be None (decide), True or False, got {share_shards!r}")
    if isinstance(ds, (SafetensorsMixture, _SampledBatches)):
        if share_shards:
            what = "a mixture's sources are read each through their own store" \
                if isinstance(ds, SafetensorsMixture) else "a map-style dataset is read in its sampler's order"
            raise ValueError(f"loader(share_shards=True): {what}; give open_dataset a cache_dir (the node cache) "
                             f"to share its shards between workers")
        return None
    data = ds.dataset
    why = why_not_spool(data, ds.columns, workers)
    if why is None:
        limit = spool_bound(data, workers)
        spool = make_spool(limit)
        if spool is not None:
            return spool
        why = f"neither /dev/shm nor the temporary directory has {ROOM * limit} bytes free"
    if share_shards:
        raise ValueError(f"loader(share_shards=True): the workers of {data.path} cannot share its shards: {why}")
    return None


def _datasets_of(ds):
    """The Datasets a loader's dataset reads (their remote reads are in stats())."""
    if isinstance(ds, _SampledBatches):
        return [ds.dataset.dataset]
    if isinstance(ds, SafetensorsMixture):
        return [o.dataset for o in ds.sources]
    return [ds.dataset]


def _count(iterator, progress, stats, flags=None, delivery=None, counted=False, spool=None):
    # spool: held while this iterator lives, so its workers' spool outlives a dropped loader
    blocks = {}  # (worker, slot) -> the pooled blocks of this iterator's workers, mapped once
    # pinned blocks go back to their workers only after the GPU copies queued from them (Releases)
    release = Releases(flags.numpy() if flags is not None else None,
                       delivery.fence if delivery is not None else None)
    host = _host_batches(iterator, blocks, release, delivery, progress if counted else None)
    out = delivery.deliver(host) if delivery is not None and delivery.device is not None else host
    asked, cpu = time.perf_counter(), time.thread_time()
    try:
        for batch in out:
            stats.took(batch, asked, cpu)
            progress["consumed"] += 1
            yield batch
            asked, cpu = time.perf_counter(), time.thread_time()
            release.poll()  # the loop is back for the next batch: what it dropped is fenced
    finally:
        out.close()  # the device copies in flight are waited for
        host.close()
        stats.end()
        if delivery is not None:
            release.drain()  # and the user's copies queued on the current stream
            delivery.close()  # then the pinned blocks unregistered


def _host_batches(iterator, blocks, release, delivery, counted):
    """The batches of the workers' messages (views of their blocks), pinned with ``delivery``:
    a pooled block registered once, anything else copied into pinned memory. ``counted``: the
    progress the source already counted each item in (undone here: the caller counts)."""
    for item in iterator:
        if counted is not None:
            counted["consumed"] -= 1
        if isinstance(item, Handoff):
            if delivery is not None and item.slot is not None:
                worker, slot, block, _ = item.slot
                if block is not None:
                    delivery.block((worker, slot), block)
                if not delivery.pinned((worker, slot)):
                    yield from (delivery.pin_batch(b) for b in item.batches(blocks, release))
                    continue
            elif delivery is not None:
                item = item.pin_memory(delivery.backend.pin)
            yield from item.batches(blocks, release)
        else:
            yield item if delivery is None else delivery.pin_batch(item)


def loader(dataset: SafetensorsIterableDataset | SafetensorsDataset, *, handoff_batches: int | None = None,
           **kwargs: Any) -> _CountingLoader:
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

    Other keyword arguments go to ``DataLoader``; ``in_order=False`` (batches in completion
    order) is refused. With ``persistent_workers=True`` the workers read each iterator's epoch and
    start (``set_epoch``, ``load_state_dict``) or the sampler's indices from shared memory.

    The loader is ``Stateful`` (``state_dict()`` / ``load_state_dict()``, the dataset's), so
    ``torch.distributed.checkpoint`` saves and restores it with the model.

    With workers, each worker sends ``handoff_batches`` consecutive batches of its share in one
    message (default: as many as fit in 8 MiB), and the loader yields them one at a time as views
    of that message: the same batches in the same order as one batch per message, with torch's
    per-message cost (pickling, a shared-memory segment, its descriptor) paid once per several
    batches. The shared-memory blocks are reused once every tensor of a message is gone.
    ``prefetch_factor`` then counts messages. A ``collate_fn`` runs once per message in the
    worker, so with one the loader sends one batch per message.

    ``share_shards`` (default ``None``: where it fetches less): the workers of a remote
    ``SafetensorsIterableDataset`` opened without ``cache_dir`` fetch each shard once, whole, into a
    private bounded spool (``/dev/shm`` or the temporary directory) and map it from there, instead
    of each fetching every shard its messages touch; ``False``: each worker fetches for itself;
    ``True``: a ``ValueError`` where no spool can be made (spec/python.md §2.1).

    ``stats()`` says whether data is the bottleneck (batches/s, bytes/s, the time the loop waited
    for batches, the loader's CPU per batch in this process, the workers' busy share, host→device
    bytes/s, remote reads); ``stats_every=S`` reports it every ``S`` seconds to
    ``stats_callback(dict)`` (default: a line on the ``safetensors_spark.loader`` logger at INFO).

    ``pin_memory=True``: the pooled blocks are registered as pinned memory once each, so batches
    are pinned without a copy (others are copied into torch's pinned memory). ``device="cuda"``
    (or ``"cuda:N"``; implies pinning): batches are delivered on the GPU, each copied one batch
    ahead on a side stream, overlapping the step (spec/python.md §3.1.1). Without CUDA,
    ``device="cuda"`` is a ``ValueError`` and ``pin_memory=True`` a warning."""
    if kwargs.get("in_order") is False:
        raise ValueError("loader(): in_order=False returns batches in the order workers finish them, so the "
                         "batches would leave the epoch's global order and the batches taken would not be a "
                         "prefix of it, which a resume position needs; leave it True (spec/python.md §5.1)")
    device, pin = resolve_device(kwargs.pop("device", None), kwargs.pop("pin_memory", False))
    kwargs.update(pin=pin, device=device)
    every, callback = kwargs.get("stats_every"), kwargs.get("stats_callback")
    if every is not None and (isinstance(every, bool) or not isinstance(every, (int, float)) or not every > 0):
        raise ValueError(f"loader(): stats_every must be a number of seconds > 0 or None (no periodic report), "
                         f"got {every!r}")
    if callback is not None and not callable(callback):
        raise TypeError(f"loader(): stats_callback must be callable (it receives loader.stats()'s dict), "
                        f"got {type(callback).__name__}")
    if callback is not None and every is None:
        raise ValueError("loader(): stats_callback is called every stats_every seconds; give stats_every too")
    if isinstance(dataset, SafetensorsDataset):
        return _map_loader(dataset, handoff_batches, kwargs)
    if not isinstance(dataset, SafetensorsIterableDataset):
        raise TypeError(f"loader() takes a SafetensorsIterableDataset or a SafetensorsDataset, "
                        f"got {type(dataset).__name__}")
    if kwargs.get("batch_size") is not None:
        raise ValueError("loader(): the dataset batches (its batch_size); do not pass batch_size to the DataLoader")
    kwargs["batch_size"] = None
    if isinstance(dataset, SafetensorsMixture):
        handoff = batches_per_message(None, (), dataset.batch_size, handoff_batches, sample_bytes=dataset._sample_bytes)
    elif dataset.pack is not None:
        pack = dataset.pack
        per_block = pack.seq_len * (dataset.dataset._dtypes[pack.column].itemsize + len(pack.ids) * pack.ids_dtype.itemsize)
        handoff = batches_per_message(None, (), dataset.batch_size, handoff_batches, sample_bytes=per_block)
    else:
        handoff = batches_per_message(dataset.dataset, dataset.columns, dataset.batch_size, handoff_batches)
    if kwargs.get("collate_fn") is not None:
        handoff = 0  # the collate_fn's items, one per batch, through torch's own handoff
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
    handoff = batches_per_message(data, dataset.columns, batch_size, handoff_batches)
    if kwargs.get("collate_fn") is not None:
        handoff = 0  # the collate_fn's items, one per batch, through torch's own handoff
    num_samples = len(sampler) if hasattr(sampler, "__len__") else None
    made = _CountingLoader(_SampledBatches(dataset, batch_size, drop_last, num_samples), handoff, batch_size=None,
                           **kwargs)
    made.sampled_from = sampler
    return made
