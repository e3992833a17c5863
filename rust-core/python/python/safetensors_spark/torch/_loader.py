"""``loader()``: a DataLoader over a safetensors-spark dataset that counts, in the training
process, the batches the loop has taken (exact ``state_dict()`` with any ``num_workers``), reads
a map-style dataset's sampled indices as whole batches, and has its workers send several batches
per message (``_handoff``)."""

import numpy as np
import torch
import torch.utils.data

from ._datasets import SafetensorsDataset, SafetensorsIterableDataset
from ._handoff import POOL_SLOTS, Handoff, batches_per_message, item_messages, messages
from ._reader import BatchReader


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
        reader = BatchReader(ds.dataset, ds.columns, cache_shards=8)
        size, num_batches, (k, flags) = self.batch_size, len(self), self._handoff

        finish = ds.finish

        def rows_of(j0, j1):
            idx = self.indices[j0 * size: j1 * size]
            return (*ds.dataset.locate_many(idx), [len(idx[i: i + size]) for i in range(0, len(idx), size)])

        if info is not None and k > 1:
            if finish.in_worker:
                def batches_of(j0, j1):
                    return [finish(reader.batch(*rows_of(j, j + 1)[:2], shared=False)) for j in range(j0, j1)]

                yield from item_messages(batches_of, num_batches, worker, workers, k, flags)
                return
            nested = tuple(c for c, f in finish.forms.items() if f == "nested")
            yield from messages(reader, rows_of, num_batches, worker, workers, k, flags, nested)
            return
        for j in range(worker, num_batches, workers):
            shards, rows, _ = rows_of(j, j + 1)
            yield finish(reader.batch(shards, rows, shared=False if finish.in_worker else None))


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
        return _count(iterator, ds._count_from(start), self._flags)

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
        for batch in item.batches(blocks, flags) if isinstance(item, Handoff) else (item,):
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
    if dataset.pack is not None:
        per_block = dataset.pack.seq_len * (dataset.dataset._dtypes[dataset.pack.column].itemsize + 16)
        handoff = batches_per_message(None, (), dataset.batch_size, handoff_batches, sample_bytes=per_block)
    else:
        handoff = batches_per_message(dataset.dataset, dataset.columns, dataset.batch_size, handoff_batches)
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
    handoff = batches_per_message(data, dataset.columns, batch_size, handoff_batches)
    if kwargs.get("collate_fn") is not None:
        handoff = 1
    num_samples = len(sampler) if hasattr(sampler, "__len__") else None
    made = _CountingLoader(_SampledBatches(dataset, batch_size, drop_last, num_samples), handoff, batch_size=None,
                           **kwargs)
    made.sampled_from = sampler
    return made
