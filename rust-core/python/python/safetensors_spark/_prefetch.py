"""Read-ahead of a remote dataset in the order an iterator will read it (spec/python.md §2.1).

The iterator hands :meth:`Dataset.prefetch` its *reads*: a lazy sequence of groups, one per
batch (or per worker message) it will read, each the sorted shard indices that batch touches. A
:class:`Prefetcher` keeps the shards of the reader's current group and of the next groups, up to
``depth`` distinct shards beyond the current group's (searched from the first group that holds
another shard: a shuffle block can be thousands of messages long), fetched or in flight on
``max_in_flight`` threads of this process; the reader's first request of a shard of a later group
moves the window on. A request for a shard the plan does not name (random access)
is served directly. An error of a fetch is raised to the reader when it asks for that shard (never
skipped); the fetch itself retries by the store's policy.
"""

import os
import queue
import threading

import numpy as np


def batch_groups(plan, order, worker, workers, k, skip=0):
    """The shard groups of one worker of a :class:`RankPlan`: for each message ``b ≡ worker (mod
    workers)`` of ``k`` batches, from the worker's message ``skip`` on, the sorted distinct shards
    of batches ``[b·k, (b+1)·k)``. ``order``: the epoch's order (an ``EpochOrder``, or the
    filtered order), an instance of its own (the reader's is not shared across threads)."""
    total = order.total
    if total == 0:
        return
    for b in range(worker + skip * workers, -(-plan.num_batches // k), workers):
        spans = [plan.batch(j) for j in range(b * k, min((b + 1) * k, plan.num_batches))]
        pos = np.concatenate([np.arange(f, f + n, dtype=np.int64) for f, n in spans]) % total
        yield np.unique(order.locate(pos)[0]).tolist()


def index_groups(locate_many, indices, batch_size, worker, workers, k):
    """The shard groups of a map-style loader's worker: its messages of ``k`` batches of
    ``batch_size`` sampled indices."""
    n = -(-len(indices) // batch_size)
    for b in range(worker, -(-n // k), workers):
        idx = indices[b * k * batch_size: min((b + 1) * k, n) * batch_size]
        yield np.unique(locate_many(idx)[0]).tolist()


class _Slot:
    __slots__ = ("event", "value", "error")

    def __init__(self):
        self.event = threading.Event()
        self.value = None
        self.error = None


class Prefetcher:
    """Fetches ``fetch(shard index)`` ahead of the reader, in the order of ``groups``."""

    HORIZON = 256  # groups searched ahead for a requested shard, and past the current shards
    FAR = 4096  # groups looked at ahead of the reader for the first that holds another shard

    def __init__(self, groups, fetch, depth, max_in_flight, size_of=None, byte_budget=None, on_window=None):
        self.pid = os.getpid()
        self._groups_iter = iter(groups)
        self._groups = []  # materialised groups, from index self._base
        self._base = 0
        self._exhausted = False
        self._pos = 0  # the group the reader is in (absolute index)
        self._fetch = fetch
        self.depth = max(1, int(depth))
        self._size_of = size_of
        self._budget = byte_budget
        self._on_window = on_window
        self._slots = {}  # shard -> _Slot (fetched or in flight) of the window
        self._window = []
        self._first_new_memo = None  # (the current group's shards, the first group past them)
        self._lock = threading.Lock()
        self._queue = queue.Queue()
        self._closed = False
        self._threads = []
        for _ in range(max(1, int(max_in_flight))):
            t = threading.Thread(target=self._run, daemon=True, name="safetensors-spark-prefetch")
            t.start()
            self._threads.append(t)
        with self._lock:
            self._top_up()

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            shard, slot = item
            if self._closed:
                slot.error = RuntimeError("prefetch closed")
                slot.event.set()
                continue
            try:
                slot.value = self._fetch(shard)
            except BaseException as e:  # noqa: BLE001 - handed to the reader, who raises it
                slot.error = e
            slot.event.set()

    def _group(self, i):
        """Group ``i`` (absolute), materialising the lazy sequence; None past its end."""
        while not self._exhausted and i - self._base >= len(self._groups):
            try:
                self._groups.append(next(self._groups_iter))
            except StopIteration:
                self._exhausted = True
        j = i - self._base
        return self._groups[j] if 0 <= j < len(self._groups) else None

    def _top_up(self):
        """Makes the window the shards of the reader's current group (always, whatever their
        number) and then those of the groups after it, in order, up to ``depth`` more shards (and
        ``byte_budget`` in all); starts what is not fetched, drops the rest. A shuffled epoch's
        group spans a whole shuffle block (4-5 shards by default): counting ``depth`` from the
        current group's end is what lets the next block's shards download while this block is
        read, rather than the link waiting for the reader to enter it."""
        window = list(self._group(self._pos) or [])
        seen = set(window)
        used = sum(self._size_of(s) for s in window) if self._size_of else 0
        ahead = 0
        i = start = self._first_new(seen, self.FAR)
        while i is not None and ahead < self.depth and i < start + self.HORIZON:
            g = self._group(i)
            if g is None:
                break
            for s in g:
                if s in seen:
                    continue
                size = self._size_of(s) if self._size_of else 0
                if ahead >= self.depth or (self._budget is not None and used + size > self._budget):
                    ahead = self.depth  # the window ends at the first shard that does not fit
                    break
                window.append(s)
                seen.add(s)
                used += size
                ahead += 1
            i += 1
        # forget the groups behind the reader
        drop = self._pos - self._base
        if drop > 0:
            del self._groups[:drop]
            self._base = self._pos
        for s in list(self._slots):
            if s not in seen:
                del self._slots[s]
        if self._on_window is not None and window != self._window:
            self._on_window(window)
        self._window = window
        for s in window:
            if s not in self._slots:
                slot = _Slot()
                self._slots[s] = slot
                self._queue.put((s, slot))

    def _first_new(self, current, far=None):
        """The first group after the reader's that holds a shard outside ``current`` (the current
        group's shards), or None (none within ``far`` groups of the reader, or none left). A
        shuffled epoch's messages of one block touch the same few shards, and a block of small
        samples is thousands of messages long: the scan is kept while the current group's shards
        stay the same (the reader only moves forward) and goes on from where it stopped, so a
        block's groups are looked at once, not at every message. The window looks ``FAR`` ahead
        at most (a dataset of one or two shards is one block: its whole epoch is not
        materialised at the first batch); a reader asking for another shard has left the
        current shards' groups, so :meth:`want` looks as far as it takes."""
        key = frozenset(current)
        memo = self._first_new_memo
        i = self._pos + 1
        if memo is not None and memo[0] == key:
            found, scanned = memo[1], memo[2]
            if found is not None and found > self._pos:
                return found
            if found is None and scanned is None:
                return None  # no other shard before the end of the plan
            if found is None:
                i = max(i, scanned)
        while far is None or i < self._pos + far:
            g = self._group(i)
            if g is None:
                self._first_new_memo = (key, None, None)
                return None
            if any(s not in key for s in g):
                self._first_new_memo = (key, i, None)
                return i
            i += 1
        self._first_new_memo = (key, None, i)  # only the current shards up to i: go on from there
        return None

    def want(self, shard):
        """The fetched value of ``shard`` if the plan names it soon (waiting for it), else
        ``None`` (the caller reads it directly). Moves the window to the first group, from the
        reader's current one, that holds ``shard`` (the groups that hold only the current
        group's shards are passed over: a block thousands of messages long does not hide the
        next one from the search)."""
        with self._lock:
            if self._closed:
                return None
            found = None
            current = self._group(self._pos)
            if current is not None and shard in current:
                found = self._pos
            elif current is not None and (start := self._first_new(current)) is not None:
                for i in range(start, start + self.HORIZON):
                    g = self._group(i)
                    if g is None:
                        break
                    if shard in g:
                        found = i
                        break
            if found is None:
                return None
            if found != self._pos or shard not in self._slots:
                self._pos = found
                self._top_up()
            slot = self._slots.get(shard)
        if slot is None:
            return None
        slot.event.wait()
        if slot.error is not None:
            raise slot.error
        return slot.value

    def close(self):
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
