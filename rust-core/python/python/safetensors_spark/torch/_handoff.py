"""Several batches per DataLoader worker message, in shared-memory blocks that are reused.

torch hands every item a worker yields to the training process with a per-message cost
(pickling, a shared-memory segment, its descriptor); ``loader()``'s workers send ``k``
consecutive batches of their share as one :class:`Handoff`, and the training process yields
them one at a time as views of it. A worker's blocks come from a :class:`BlockPool`: the
training process sets a block's release flag when every tensor of its message is gone, and the
worker then writes its next message into it instead of a fresh block (spec/python.md §4)."""

import collections
import weakref

import numpy as np
import torch

from .._dataset import offsets_name
from ._provenance import sliced


def new_shared_block(nbytes):
    """A uint8 tensor of at least ``nbytes`` in fresh shared memory."""
    block = torch.empty(0, dtype=torch.uint8)
    return block.new(block._typed_storage()._new_shared(max(nbytes, 1)))


POOL_SLOTS = 64  # pooled blocks per worker; beyond, a worker sends fresh blocks


class BlockPool:
    """A worker's shared-memory blocks for its messages, reused once the training process has
    released them. Writing into a fresh shared-memory block costs a page fault (a page allocated
    and zeroed by the kernel) per 4 KiB, ≈ 20 × copying into memory already mapped
    (spec/performance.md §10.7); the training process keeps each block mapped, too.

    ``flags[worker, slot]`` is set to 1 by the training process when every tensor of the message
    in that block is gone (Handoff.batches), and to 0 by the worker when it reuses the block. A consumer
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
        block = new_shared_block(nbytes)
        if len(self.blocks) == len(self.flags):
            return None, block, True
        self.blocks.append(block)
        return len(self.blocks) - 1, block, True


def worker_pool(release_flags, worker, pools=None):
    """The worker's :class:`BlockPool` (None without flags). ``pools``: a dict the caller keeps
    for several plans of one iterator (a follow's segments), so they share one pool — two pools
    on one row of flags would each hand out slot 0 while a tensor of the other's still lives."""
    if release_flags is None:
        return None
    if pools is None:
        return BlockPool(release_flags, worker)
    pool = pools.get("pool")
    if pool is None:
        pool = pools["pool"] = BlockPool(release_flags, worker)
    return pool


def messages(reader, rows_of, num_batches, worker, workers, k, release_flags, nested=(), first=None, pools=None,
             provenance=None):
    """A DataLoader worker's messages of ``k`` batches: batches [b·k, (b+1)·k) for every b ≡
    ``first`` (default ``worker``; mod ``workers``); ``rows_of(j0, j1)`` gives the (shards, rows,
    lengths) of batches [j0, j1). Ragged columns travel as values + offsets of all the message's
    rows; ``nested`` names those the training process turns into nested tensors; ``pools``: see
    :func:`worker_pool`; ``provenance`` (a :class:`_provenance.Provenance`): the message carries
    its rows' provenance, taken from the same (shards, rows)."""
    if release_flags is not None:
        reader.pool = worker_pool(release_flags, worker, pools)
    ragged = tuple(c for c in reader.columns if c in reader.ds.ragged)
    for b in range(worker if first is None else first, -(-num_batches // k), workers):
        shards, rows, lengths = rows_of(b * k, min((b + 1) * k, num_batches))
        tensors = reader.batch(shards, rows)
        slot, reader.slot = reader.slot, None
        prov = provenance.arrays(shards, rows) if provenance is not None else None
        if slot is None:
            yield Handoff(lengths, tensors=tensors, ragged=ragged, nested=nested, provenance=prov)
        else:  # in a pooled block: only the slot travels (and the block on its first use)
            yield Handoff(lengths, slot=slot, ragged=ragged, nested=nested, provenance=prov)


def item_messages(batches_of, num_batches, worker, workers, k, release_flags, first=None, pools=None):
    """A DataLoader worker's messages of ``k`` finished batches (each any ``{name: tensor}``:
    padded, transformed, packed), batches [b·k, (b+1)·k) for every b ≡ ``first`` (default
    ``worker``; mod ``workers``); ``batches_of(j0, j1)`` makes batches [j0, j1). Each message's
    tensors are copied into one pooled block, each batch with its own layout."""
    pool = worker_pool(release_flags, worker, pools)
    for b in range(worker if first is None else first, -(-num_batches // k), workers):
        yield pack(batches_of(b * k, min((b + 1) * k, num_batches)), pool)


def block_messages(epoch, spans, num_batches, worker, workers, k, release_flags, first=None, pools=None):
    """A DataLoader worker's messages of ``k`` batches of packed blocks (spec/python.md §3.3),
    as :func:`item_messages` sends them, the batches written straight into the message's pooled
    block by the Rust block builder (``epoch``: a local :class:`PackedEpoch`; ``spans(j)``: the
    blocks ``(first, count)`` of batch ``j``) — no copy in between."""
    pool = worker_pool(release_flags, worker, pools)
    seq = epoch.packing.seq_len
    for b in range(worker if first is None else first, -(-num_batches // k), workers):
        firsts, counts = zip(*(spans(j) for j in range(b * k, min((b + 1) * k, num_batches))))
        parts, offsets, nbytes, total = epoch.layout(firsts, counts)
        if pool is not None:
            slot, block, new = pool.get(total)
        else:
            slot, block, new = None, new_shared_block(total), True
        cus = epoch.fill(block.data_ptr(), block.numel(), firsts, counts, offsets, nbytes)
        kinds = [(name, _torch_dtype(dtype)) for name, dtype in parts]
        layouts = [[(name, [(dtype, (cu,) if name == "cu_seqlens" else (n, seq), o,
                             cu * 4 if name == "cu_seqlens" else k_)])
                    for (name, dtype), o, k_ in zip(kinds, offs, nbs)]
                   for n, cu, offs, nbs in zip(counts, cus, offsets.tolist(), nbytes.tolist())]
        if slot is None:
            yield Handoff(None, tensors={"": block}, items=layouts)
        else:
            yield Handoff(None, slot=(pool.worker, slot, block if new else None, None), items=layouts)


_TORCH_DTYPES: dict[np.dtype, torch.dtype] = {}


def _torch_dtype(dtype):
    t = _TORCH_DTYPES.get(dtype)
    if t is None:
        t = _TORCH_DTYPES[dtype] = torch.from_numpy(np.empty(0, dtype)).dtype
    return t


def pack(batches, pool):
    """One :class:`Handoff` holding ``batches`` in one block (a pooled one when ``pool``): per
    batch a layout ``[(name, parts)]``, ``parts`` ``[(torch dtype, shape, byte offset, bytes)]``
    (one for a tensor, values + offsets for a jagged nested tensor), or a :class:`Listed` (a list
    of str, as provenance's ``_file``: pickled with the message)."""
    layouts, total, copies = [], 0, []
    for batch in batches:
        layout = []
        for name, t in batch.items():
            if isinstance(t, list) and all(isinstance(v, str) for v in t):
                layout.append((name, Listed(t)))
                continue
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"batch entry '{name}' is a {type(t).__name__}; a worker sends tensors (and "
                                f"lists of str, as provenance's _file) only (a transform must return a dict "
                                f"of those)")
            pieces = (t.values(), t.offsets()) if t.is_nested else (t,)
            parts = []
            for p in pieces:
                nbytes = p.numel() * p.element_size()
                parts.append((p.dtype, tuple(p.shape), total, nbytes))
                copies.append((p, total, nbytes))
                total += -(-nbytes // 64) * 64
            layout.append((name, parts))
        layouts.append(layout)
    if pool is not None:
        slot, block, new = pool.get(total)
    else:
        slot, block, new = None, new_shared_block(total), True
    for p, off, nbytes in copies:
        if nbytes:
            block[off: off + nbytes].view(p.dtype).view(p.shape).copy_(p)
    if slot is None:
        return Handoff(None, tensors={"": block}, items=layouts)
    return Handoff(None, slot=(pool.worker, slot, block if new else None, None), items=layouts)


class Listed:
    """A list of str in a :func:`pack` layout (pickled with the message, not in the block)."""

    __slots__ = ("values",)

    def __init__(self, values):
        self.values = values


class Handoff:
    """Consecutive batches of one worker sent to the training process as one message, their
    rows one after the other, with each batch's row count (``lengths``). Either ``tensors``
    (column → tensor, one shared-memory block) or ``slot``: ``(worker, slot, block, layout)`` of
    a pooled block, ``block`` only on the slot's first use (the training process keeps it),
    ``layout`` the columns' ``(name, torch dtype, shape, byte offset, bytes)`` in it.
    ``provenance``: the rows' ``{_file: [str], _row_index, _added_version: int64 arrays}``
    (spec/python.md §3.7), pickled with the message, each batch given its slice."""

    __slots__ = ("lengths", "tensors", "slot", "ragged", "nested", "items", "provenance")

    def __init__(self, lengths, tensors=None, slot=None, ragged=(), nested=(), items=None, provenance=None):
        self.lengths = lengths
        self.tensors = tensors
        self.slot = slot
        self.ragged = ragged  # ragged columns: values + "<c>.offsets" of all the rows
        self.nested = nested  # of those, the ones handed out as nested tensors
        self.items = items  # finished batches: one layout per batch (pack())
        self.provenance = provenance

    def pin_memory(self, pin=None):
        """This message with its tensors copied into pinned memory (``pin``: the copy; default
        ``Tensor.pin_memory``). Only a message that carries its tensors (not a pooled slot)."""
        pin = pin or (lambda t: t.pin_memory())
        return Handoff(self.lengths, tensors={c: pin(t) for c, t in self.tensors.items()}, ragged=self.ragged,
                       nested=self.nested, items=self.items, provenance=self.provenance)

    def batches(self, blocks=None, release=None):
        """The batches as ``{column: tensor}`` views of the message's block (no copy). A pooled
        block is looked up in (or added to) ``blocks``; ``release(worker, slot)`` is called once
        every tensor of this message is gone (:class:`Releases`)."""
        tensors = self.tensors
        if self.slot is not None:
            worker, slot, block, layout = self.slot
            if block is not None:
                blocks[worker, slot] = block.numpy()  # mapped once for the iterator's life
            # this message's own storage over the block's memory: a numpy view that every tensor
            # and storage made from the batches (views, detach, numpy, untyped_storage, dlpack)
            # keeps alive; when the last of them goes, the block is released to the worker
            memory = blocks[worker, slot][:]
            weakref.finalize(memory, release, worker, slot).atexit = False
            base = torch.from_numpy(memory)
            del memory
            if self.items is None:
                tensors = {c: base[off: off + nbytes].view(dtype).view(shape)
                           for c, dtype, shape, off, nbytes in layout}
                del base
        else:
            base = tensors.get("") if self.items is not None else None
        if self.items is not None:
            yield from _items(base, self.items)
            return
        offset_names = {offsets_name(c) for c in self.ragged}
        fixed = [c for c in tensors if c not in self.ragged and c not in offset_names]
        offsets = {c: tensors[offsets_name(c)] for c in self.ragged}
        provenance = self.provenance
        first = 0
        for n in self.lengths:
            batch = {c: tensors[c][first: first + n] for c in fixed}
            for c, o in offsets.items():
                o = o[first: first + n + 1]
                e0 = int(o[0])
                values, o = tensors[c][e0: int(o[-1])], o - e0
                if c in self.nested:
                    batch[c] = torch.nested.nested_tensor_from_jagged(values, o)
                else:
                    batch[c], batch[offsets_name(c)] = values, o
            if provenance is not None:
                batch.update(sliced(provenance, first, n))
            yield batch
            first += n


def _items(base, items):
    def view(dtype, shape, off, nbytes):
        return base[off: off + nbytes].view(dtype).view(shape)

    for layout in items:
        batch = {}
        for name, parts in layout:
            if isinstance(parts, Listed):
                batch[name] = parts.values
            elif len(parts) == 2:
                batch[name] = torch.nested.nested_tensor_from_jagged(view(*parts[0]), view(*parts[1]))
            else:
                batch[name] = view(*parts[0])
        yield batch


class Releases:
    """How the training process gives pooled blocks back to their workers: by setting the block's
    release flag (``flags[worker, slot] = 1``) once every tensor of its message is gone.

    Without pinning that is at once. With pinned (registered) blocks a tensor's death does not
    mean the memory is free: an asynchronous copy the user (``.to("cuda", non_blocking=True)``)
    or the loader issued from it may still be queued on the GPU, and the worker would overwrite
    the bytes under it. So with a ``fence`` (``fence()`` records an event on the current CUDA
    stream) a dropped block is only noted when its last tensor goes (a finalizer makes no CUDA
    call); :meth:`poll`, run by the training process each time it hands out a batch, records one
    event after every copy queued so far on the current stream for the blocks dropped since, and
    sets the flags of those whose event has completed (torch's caching host allocator does the
    same per copy for its pinned blocks)."""

    def __init__(self, flags, fence=None):
        self.flags = flags
        self.fence = fence
        self.dropped = collections.deque()  # (worker, slot) whose tensors are gone, not fenced yet
        self.fenced = collections.deque()  # (event, [(worker, slot)]) in the order recorded

    def __call__(self, worker, slot):
        if self.fence is None:
            self.flags[worker, slot] = 1
        else:
            self.dropped.append((worker, slot))  # deque.append: atomic, safe from any thread's GC

    def poll(self):
        """Fences the blocks dropped since the last call and gives back those whose fence passed."""
        if self.fence is None:
            return
        if self.dropped:
            keys = []
            while self.dropped:
                keys.append(self.dropped.popleft())
            self.fenced.append((self.fence(), keys))
        while self.fenced and self.fenced[0][0].query():
            for worker, slot in self.fenced.popleft()[1]:
                self.flags[worker, slot] = 1

    def drain(self):
        """Waits for every copy queued so far on the current stream (before the blocks are
        unregistered at the iterator's end); the iterator is over, so no flag is set."""
        if self.fence is not None:
            self.fence().synchronize()
            self.dropped.clear()
            self.fenced.clear()


HANDOFF_BYTES = 8 << 20


def batches_per_message(data, columns, batch_size, requested, sample_bytes=None):
    """Batches per worker message: ``requested``, or as many batches as fit in HANDOFF_BYTES
    (at least 1) when the schema of ``data`` (a Dataset) gives every column's sample size (a
    ragged column: its average row in the shards' headers read so far), else 1."""
    if requested is not None:
        if not isinstance(requested, int) or isinstance(requested, bool) or requested < 1:
            raise ValueError(f"loader(): handoff_batches must be an integer >= 1 or None (automatic), "
                             f"got {requested!r}")
        return requested
    if batch_size is None:
        return 0  # single samples: one per item, torch's own handoff
    if sample_bytes is not None:
        return max(1, HANDOFF_BYTES // max(1, sample_bytes * batch_size))
    sample = 0
    for c in columns:
        if c in data.ragged:
            sample += _average_row_bytes(data, c) + 8
            continue
        shape = data.schema[c].get("shape")
        dims = None if shape is None else (shape[1:] if data.layout == "batch" else shape)
        if dims is None or any(not isinstance(d, int) or d < 0 for d in dims):
            return 1
        sample += int(np.prod(dims, dtype=np.int64)) * data._dtypes[c].itemsize
    return max(1, HANDOFF_BYTES // max(1, sample * batch_size))


def _average_row_bytes(data, column):
    """The average bytes of a row of ragged ``column`` over the shards whose header is read (the
    first shard's when none is)."""
    shards = [s for s in data.shards if s.tensors is not None or s.header is not None] or data.shards[:1]
    rows = sum(s.samples + s.padded for s in shards)
    nbytes = 0
    for s in shards:
        t = data._header(s)[column]
        nbytes += t.end - t.start
    return -(-nbytes // max(rows, 1))
