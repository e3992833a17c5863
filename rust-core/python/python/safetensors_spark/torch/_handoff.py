"""Several batches per DataLoader worker message, in shared-memory blocks that are reused.

torch hands every item a worker yields to the training process with a per-message cost
(pickling, a shared-memory segment, its descriptor); ``loader()``'s workers send ``k``
consecutive batches of their share as one :class:`Handoff`, and the training process yields
them one at a time as views of it. A worker's blocks come from a :class:`BlockPool`: the
training process sets a block's release flag when every tensor of its message is gone, and the
worker then writes its next message into it instead of a fresh block (spec/python.md §4)."""

import weakref

import numpy as np
import torch


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


def messages(reader, rows_of, num_batches, worker, workers, k, release_flags):
    """A DataLoader worker's messages of ``k`` batches: batches [b·k, (b+1)·k) for every b ≡
    ``worker`` (mod ``workers``); ``rows_of(j0, j1)`` gives the (shards, rows, lengths) of batches
    [j0, j1)."""
    if release_flags is not None:
        reader.pool = BlockPool(release_flags, worker)
    for b in range(worker, -(-num_batches // k), workers):
        shards, rows, lengths = rows_of(b * k, min((b + 1) * k, num_batches))
        tensors = reader.batch(shards, rows)
        slot, reader.slot = reader.slot, None
        if slot is None:
            yield Handoff(lengths, tensors=tensors)
        else:  # in a pooled block: only the slot travels (and the block on its first use)
            yield Handoff(lengths, slot=slot)


class Handoff:
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
        return Handoff(self.lengths, tensors={c: pin(t) for c, t in self.tensors.items()})

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


def batches_per_message(data, columns, batch_size, requested):
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
