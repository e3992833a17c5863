"""Following a dataset's new versions (spec/python.md §3.6): ``SafetensorsIterableDataset(...,
follow=True)`` yields its epoch over the version it opened, then, version by version, the shards
each newer version added (the Rust rule of spec/dataset.md §5.12 says what each version gives).

* A **segment** is what one iterator reads of one version: segment 0 the opened version whole,
  then one segment per newer version that added rows, in version order. Each segment is an epoch
  of its own over its shards (the same columns, batch size, shuffle, seed, filter and packing),
  dealt to ranks and workers as an epoch is; so every rank and every worker reads the same
  segments in the same order, whenever it polls.
* The batches of consecutive segments continue one sequence: a worker's share of segment ``s``
  is dealt from the worker after the one that took the previous segment's last message, so
  ``DataLoader``'s round robin over workers yields the batches in the rank's order, and the
  training process's count of batches taken maps to (segment, position) exactly.
* The resume state records the segment's version and the position in it
  (``{"follow": {"version", "position"}}`` beside ``epoch``).
"""

from __future__ import annotations

import time
from typing import Any

from .._dataset import Dataset, _follow_versions, _log_entries
from .._errors import StateError

SKIP_OPTION = "skip_change_commits"


class Follow:
    """``follow=`` of :class:`SafetensorsIterableDataset`: after its epoch, read the shards that
    newer versions add.

    ``poll_interval``: seconds between looks at the log when there is nothing new.
    ``until_version``: stop once that version is read (deterministic: every rank stops at the same
    batch). ``idle_timeout``: stop after that many seconds with no new version (per process: with
    several ranks, ranks may stop at different versions — use ``until_version`` there); None:
    wait for ever. ``skip_change_commits``: pass over versions that remove rows (deletes,
    overwrites) and what they add, instead of failing on them."""

    def __init__(self, poll_interval: float = 5.0, until_version: int | None = None,
                 idle_timeout: float | None = None, skip_change_commits: bool = False) -> None:
        if isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float)) or not poll_interval > 0:
            raise ValueError(f"follow: poll_interval must be a number of seconds > 0, got {poll_interval!r}")
        if until_version is not None and (isinstance(until_version, bool) or not isinstance(until_version, int)
                                          or until_version < 1):
            raise ValueError(f"follow: until_version must be a version number >= 1 or None, got {until_version!r}")
        if idle_timeout is not None and (isinstance(idle_timeout, bool) or not isinstance(idle_timeout, (int, float))
                                         or idle_timeout < 0):
            raise ValueError(f"follow: idle_timeout must be a number of seconds >= 0 or None, got {idle_timeout!r}")
        if not isinstance(skip_change_commits, bool):
            raise ValueError(f"follow: skip_change_commits must be True or False, got {skip_change_commits!r}")
        self.poll_interval = float(poll_interval)
        self.until_version = until_version
        self.idle_timeout = idle_timeout
        self.skip_change_commits = skip_change_commits

    def __repr__(self) -> str:
        return (f"Follow(poll_interval={self.poll_interval}, until_version={self.until_version}, "
                f"idle_timeout={self.idle_timeout}, skip_change_commits={self.skip_change_commits})")

    @staticmethod
    def _resolve(follow: Follow | bool | None) -> Follow | None:
        if follow is None or follow is False:
            return None
        if follow is True:
            return Follow()
        if not isinstance(follow, Follow):
            raise ValueError(f"follow must be True, False, None or a safetensors_spark.torch.Follow, got {follow!r}")
        return follow


class Segments:
    """The versions after the opened one that add rows, found by polling the log (in this
    process; each worker keeps its own copy). ``versions[i]`` is segment ``i + 1``'s version."""

    def __init__(self, dataset: Dataset, follow: Follow) -> None:
        self.follow = follow
        self.reached = dataset.version  # every version up to it is classified
        self.versions: list[int] = []
        self.adds: dict[int, list[dict[str, Any]]] = {}

    def poll(self, dataset: Dataset) -> bool:
        """Looks at the log once: True when it found newer versions (up to ``until_version``)."""
        until = self.follow.until_version
        if until is not None and self.reached >= until:
            return False
        entries = _log_entries(dataset._store, dataset.path, with_text=False)
        latest = max((e["version"] for e in entries), default=0)
        if until is not None:
            latest = min(latest, until)
        if latest <= self.reached:
            return False
        for v in _follow_versions(dataset._store, dataset.path, self.reached, latest,
                                  self.follow.skip_change_commits, SKIP_OPTION):
            if v["followed"] == "rows":
                self.versions.append(v["version"])
                self.adds[v["version"]] = v["add"]
        self.reached = latest
        return True

    def done(self) -> bool:
        until = self.follow.until_version
        return until is not None and self.reached >= until

    def get(self, i: int, dataset: Dataset, wait: bool) -> int | None:
        """The version of segment ``i`` (≥ 1), polling the log (and, with ``wait``, sleeping
        ``poll_interval`` between looks) until it exists; None once the follow has stopped
        (``until_version`` read, ``idle_timeout`` passed, or nothing new without ``wait``)."""
        idle_since = time.monotonic()
        while len(self.versions) < i:
            if self.poll(dataset):
                idle_since = time.monotonic()
                continue
            timeout = self.follow.idle_timeout
            if not wait or self.done() or (timeout is not None and time.monotonic() - idle_since >= timeout):
                return None
            time.sleep(self.follow.poll_interval if timeout is None
                       else min(self.follow.poll_interval, max(timeout - (time.monotonic() - idle_since), 0.0)))
        return self.versions[i - 1]

    def index_of(self, version: int, base: int, dataset: Dataset) -> int:
        """The segment of ``version`` (0: the opened version ``base``); a version that is no
        segment of this follow is a StateError."""
        if version == base:
            return 0
        while version > self.reached and self.poll(dataset):
            pass
        if version in self.adds:
            return self.versions.index(version) + 1
        raise StateError(f"cannot resume: state has follow version {version}, which is no version this dataset "
                         f"follows after version {base} (versions with new rows so far: {self.versions})")


def segment_dataset(ds: Any, segments: Segments, i: int) -> Any:
    """The iterable dataset of segment ``i`` (0: ``ds`` itself): ``ds``'s settings over the
    segment's version's added shards, made once per process."""
    if i == 0:
        return ds
    cache = ds.__dict__.setdefault("_segment_cache", {})
    version = segments.versions[i - 1]
    child = cache.get(version)
    if child is None:
        child = type(ds)(ds.dataset._following(version, segments.adds[version]), **ds._segment_args())
        cache[version] = child
    # the loader's handoff settings reach workers on ds; segments send messages the same way
    child._handoff, child._worker_counters = ds._handoff, ds._worker_counters
    child._epoch = ds._epoch
    return child


def units_per_item(ds: Any, in_worker: bool) -> int:
    """Batches per item a worker yields: ``k`` with loader()'s handoff, else 1."""
    k = ds._handoff[0]
    if in_worker and k >= 1 and (ds.batch_size is not None or ds.pack is not None):
        return k
    return 1


def generate(ds: Any, worker: int, workers: int, start_segment: int, start: int, progress: Any,
             in_worker: bool) -> Any:
    """The iterator of a following dataset: segment ``start_segment`` from position ``start``,
    then every later segment as it appears, each dealt to workers continuing the previous one's
    round robin (module docs); one pool of shared-memory blocks per worker for all of them."""
    k = units_per_item(ds, in_worker)
    phase = 0  # items of the rank's sequence yielded before this segment, by all workers
    pool: dict[str, Any] = {}
    i = start_segment
    while True:
        if i > 0 and ds._segments.get(i, ds.dataset, wait=True) is None:
            return
        seg = segment_dataset(ds, ds._segments, i)
        plan = seg._plan(start if i == start_segment else 0)
        yield from seg._generate(plan, seg._order(), worker, workers, progress, 0, phase=phase % workers,
                                 pool=pool)
        phase += -(-plan.num_batches // k)
        i += 1


def position(ds: Any, start_segment: int, start: int, consumed: int) -> tuple[int, int]:
    """``(segment, position)`` after the training loop took ``consumed`` batches of an iterator
    that started at ``start`` of segment ``start_segment``; segments are looked up in the log
    (without waiting: the ones the loop read exist)."""
    i, first = start_segment, start
    while True:
        seg = segment_dataset(ds, ds._segments, i)
        plan = seg._plan(first)
        if consumed <= plan.num_batches:
            nxt = None if consumed < plan.num_batches else ds._segments.get(i + 1, ds.dataset, wait=False)
            if nxt is None:
                return i, min(plan.position_after(consumed), seg._units())
            return i + 1, 0
        consumed -= plan.num_batches
        if ds._segments.get(i + 1, ds.dataset, wait=False) is None:
            raise StateError(f"batches_consumed counts {consumed} batch(es) beyond the versions this dataset has "
                             f"followed (up to version {ds._segments.reached})")
        i, first = i + 1, 0
