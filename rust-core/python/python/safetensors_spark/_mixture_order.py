"""The order of a mixture of datasets (spec/python.md §3.5), in numpy only (no torch), so it is
testable alone: which source, and which draw of that source, each position of an epoch reads.
A pure function of (seed, epoch, per-source counts, shuffle); the counts come from the weights
and the sources' lengths (:func:`quotas`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray


def check_weights(weights: Any, sources: int) -> NDArray[np.float64]:
    """``weights`` as float64: one finite number >= 0 per source, summing to more than 0."""
    if isinstance(weights, (str, bytes)) or not hasattr(weights, "__len__"):
        raise ValueError(f"mixture: weights must be a list of {sources} numbers (one per source), got {weights!r}")
    if len(weights) != sources:
        raise ValueError(f"mixture: weights has {len(weights)} entries for {sources} sources; give one weight "
                         f"per source")
    out = []
    for i, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)) \
                or not math.isfinite(float(w)) or w < 0:
            raise ValueError(f"mixture: weight {i} is {w!r}; a weight must be a finite number >= 0")
        out.append(float(w))
    if sum(out) <= 0:
        raise ValueError(f"mixture: weights {list(weights)} sum to 0; at least one source needs a weight > 0")
    return np.asarray(out, dtype=np.float64)


def quotas(weights: Sequence[float] | NDArray[Any], total: int) -> NDArray[np.int64]:
    """Samples per source in an epoch of ``total``: ``total · w_i / Σw`` rounded by largest
    remainder (floors, then +1 to the largest fractional parts, ties to the lower source index),
    so they sum to ``total`` exactly."""
    w = np.asarray(weights, dtype=np.float64)
    # scaled by the largest first: weights whose sum overflows ([1e308, 1e308]) keep their ratios
    # instead of giving every source 0 (then an epoch of one sample per source, silently)
    w = w / w.max()
    exact = total * (w / w.sum())
    base = np.floor(exact).astype(np.int64)
    left = int(total - base.sum())
    frac = exact - base
    order = np.lexsort((np.arange(len(w)), -frac))
    base[order[:left]] += 1
    return base


class MixtureOrder:
    """``labels[p]``: the source of position ``p``; ``draws[p]``: how many earlier positions
    drew from that source (its ``j``-th draw). With ``shuffle`` the labels are the multiset
    ``{i × counts[i]}`` permuted by numpy ``default_rng([seed, epoch, 2])``; without, a smooth
    interleave: draw ``j`` of source ``i`` sits at key ``(j + ½) / counts[i]``, positions in
    key order, ties to the lower source index."""

    def __init__(self, counts: Sequence[int] | NDArray[Any], shuffle: bool, seed: int, epoch: int) -> None:
        counts = np.asarray(counts, dtype=np.int64)
        k = len(counts)
        labels = np.repeat(np.arange(k, dtype=np.int32), counts)
        if shuffle:
            labels = np.random.default_rng([int(seed), int(epoch), 2]).permutation(labels)
        else:
            keys = np.concatenate([(np.arange(c, dtype=np.float64) + 0.5) / c for c in counts if c > 0]
                                  or [np.zeros(0)])
            labels = labels[np.lexsort((labels, keys))]
        draws = np.empty(len(labels), dtype=np.int64)
        for i in range(k):
            draws[labels == i] = np.arange(counts[i], dtype=np.int64)
        self.counts, self.labels, self.draws = counts, labels, draws
        self.total = len(labels)

    def consumed(self, position: int) -> NDArray[np.int64]:
        """Samples of each source among positions ``[0, position)``."""
        return np.bincount(self.labels[:position], minlength=len(self.counts)).astype(np.int64)


def source_seed(seed: int, source: int, rnd: int) -> int:
    """The seed of source ``source``'s order in its ``rnd``-th pass through its samples
    (draw ``j`` of a source of ``n`` samples is position ``j mod n`` of pass ``j div n``):
    the first 64-bit word of ``numpy.random.SeedSequence([seed, source, rnd])``, shifted right by one."""
    return int(np.random.SeedSequence([int(seed), int(source), int(rnd)]).generate_state(1, np.uint64)[0]) >> 1
