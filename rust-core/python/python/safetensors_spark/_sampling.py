"""The sampling contract of spec/python.md §3, in numpy only (no torch), so it is testable alone.

* :class:`EpochOrder` — the global order of an epoch: position ``p`` → ``(shard, row)``. A function
  of the shard sizes, ``shuffle``, ``seed``, ``epoch`` and the shuffle block size only.
* :class:`RankPlan` — which positions rank ``r`` of ``R`` reads, in ``batch_size`` chunks, from a
  start position (0, or where a resumed run stopped), with equal counts on every rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

#: ``(shard indices, rows)``, int64 arrays
Located = tuple[NDArray[np.int64], NDArray[np.int64]]


class EpochOrder:
    """Position → sample. Without shuffle: manifest order. With shuffle: the shard order is
    permuted with ``(seed, epoch)``, the shards are laid end to end, and the samples are
    permuted inside consecutive blocks of ``block_size`` positions (each block covers only a few
    neighbouring shards, so reads stay local)."""

    def __init__(self, counts: Sequence[int] | NDArray[Any], shuffle: bool, seed: int, epoch: int,
                 block_size: int) -> None:
        counts = np.asarray(counts, dtype=np.int64)
        self.total = int(counts.sum())
        self.shuffle = bool(shuffle)
        self.seed, self.epoch, self.block_size = int(seed), int(epoch), int(block_size)
        if self.shuffle:
            self.shard_order = np.random.default_rng([self.seed, self.epoch]).permutation(len(counts))
        else:
            self.shard_order = np.arange(len(counts))
        sizes = counts[self.shard_order]
        self.ends = np.cumsum(sizes)
        self.begins = self.ends - sizes
        self._blocks: dict[int, NDArray[np.int64]] = {}

    def _block(self, k: int) -> NDArray[np.int64]:
        perm = self._blocks.get(k)
        if perm is None:
            length = min(self.block_size, self.total - k * self.block_size)
            perm = np.random.default_rng([self.seed, self.epoch, 1, k]).permutation(length)
            if len(self._blocks) >= 4:
                self._blocks.pop(next(iter(self._blocks)))
            self._blocks[k] = perm
        return perm

    def locate(self, positions: ArrayLike) -> Located:
        """``(shard indices, rows)`` of positions in ``[0, total)`` (int64 arrays)."""
        v = np.asarray(positions, dtype=np.int64)
        if self.shuffle:
            v = v.copy()
            blocks = v // self.block_size
            for k in np.unique(blocks):
                m = blocks == k
                base = int(k) * self.block_size
                v[m] = base + self._block(int(k))[v[m] - base]
        j = np.searchsorted(self.ends, v, side="right")
        return self.shard_order[j], v - self.begins[j]

    def locate_all(self) -> Located:
        """``locate(arange(total))`` in one pass over the shuffle blocks (no mask per block)."""
        v = np.arange(self.total, dtype=np.int64)
        if self.shuffle:
            for k in range(-(-self.total // self.block_size)):
                base = k * self.block_size
                perm = np.random.default_rng([self.seed, self.epoch, 1, k]).permutation(
                    min(self.block_size, self.total - base))
                v[base: base + len(perm)] = base + perm
        j = np.searchsorted(self.ends, v, side="right")
        return self.shard_order[j], v - self.begins[j]


class RankPlan:
    """The batches of one rank for one epoch, from global position ``start``.

    Positions ``[start, T)`` are cut into rounds of ``world_size × batch_size``; in a round, rank
    ``r`` takes chunk ``r``. The last round, if shorter, is split evenly (every rank gets the same
    number of batches and samples). ``T``: without ``drop_last`` the remaining ``N − start``
    samples rounded up to a multiple of ``world_size`` (positions ≥ N repeat the epoch's order from
    its start); with ``drop_last`` rounded down to whole rounds."""

    def __init__(self, total: int, batch_size: int, world_size: int, rank: int, drop_last: bool,
                 start: int) -> None:
        self.total, self.b, self.R, self.r = int(total), int(batch_size), int(world_size), int(rank)
        self.start = int(start)
        left = max(self.total - self.start, 0)
        rnd = self.R * self.b
        if drop_last:
            left = (left // rnd) * rnd
        else:
            left = -(-left // self.R) * self.R
        self.end = self.start + left
        self.full_rounds, rem = divmod(left, rnd)
        self.last = rem // self.R  # samples per rank in the short last round (0: none)
        self.num_batches = self.full_rounds + (1 if self.last else 0)

    def batch(self, j: int) -> tuple[int, int]:
        """``(first position, length)`` of this rank's batch ``j``."""
        if j < self.full_rounds:
            return self.start + (j * self.R + self.r) * self.b, self.b
        return self.start + self.full_rounds * self.R * self.b + self.r * self.last, self.last

    def position_after(self, batches: int) -> int:
        """The global position once every rank has consumed ``batches`` batches."""
        if batches < 0:
            raise ValueError(f"batches consumed must be >= 0, got {batches}")
        if batches <= self.full_rounds:
            return self.start + batches * self.R * self.b
        return self.end
