"""Remote shards shared by a loader's workers (spec/python.md §2.1, "Shards shared by workers").

Without a node cache each DataLoader worker fetches for itself, and a shuffled epoch deals the
messages of every shuffle block to all workers in turn, so each worker needs (and fetched) every
shard: ``W`` workers fetched ``W ×`` the dataset. A loader with workers over a remote batch
dataset without ``cache_dir`` gives its workers a *spool*: a private, bounded node cache
(:class:`~safetensors_spark._node_cache.NodeCache`, its locks and eviction) in a directory of its
own, on ``/dev/shm`` when that has room, else in the temporary directory. The first worker to
need a shard fetches it whole there; the others wait for that download and map the same copy. It
is removed when the loader and its iterators are gone (workers never make it again), and a spool
whose process died is removed by the next one made on that machine.

The spool is used where it fetches less: the columns read are more than ``1/W`` of the shards'
bytes (a few columns of wide shards are cheaper as ranges, fetched per worker).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import weakref
from typing import Any

from ._native import ragged_offsets_name
from ._node_cache import _alive
from ._storage import CachedStore

PREFIX = "safetensors-spark-spool-"
#: A spool takes at most a quarter of its filesystem's free room (other ranks' spools, torch's
#: shared memory and the batches' blocks live in /dev/shm too)
ROOM = 4
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)-")


class Spool:
    """A directory and a byte bound, handed to the workers (picklable); :meth:`attach` makes a
    worker's copy of a dataset read its shards through it."""

    def __init__(self, path: str, limit: int) -> None:
        self.path, self.limit = path, limit

    def attach(self, dataset: Any) -> None:
        store = dataset._store
        if isinstance(store, CachedStore) or store.is_local:
            return
        dataset._store = CachedStore(store, self.path, self.limit, refetches=min(store.retry.retries, 2),
                                     spool=True)


def spool_bound(dataset: Any, workers: int) -> int:
    """The bytes a spool for ``workers`` workers reading ``dataset`` may hold: every worker's
    read-ahead window (``prefetch`` shards) and the shard it reads, of the largest shard."""
    biggest = max(s.size for s in dataset.shards)
    return workers * (max(dataset.prefetch_depth, 1) + 1) * biggest


def why_not_spool(dataset: Any, columns: Any, workers: int) -> str | None:
    """``None`` where a spool fetches less than each worker fetching for itself, else why not."""
    if workers < 2:
        return "fewer than 2 workers fetch nothing twice"
    store = dataset._store
    if store.is_local or isinstance(store, CachedStore):
        return "the dataset is local or read through cache_dir"
    if dataset.layout != "batch":
        return "a KV dataset's samples are read on demand, not as whole shards"
    if not dataset.shards:
        return "the dataset has no shards"
    read, whole = _sample_bytes(dataset, columns), _sample_bytes(dataset, dataset.schema)
    if read is None or whole is None:  # ragged columns: their share in the first shard's header
        first = dataset.shards[0]
        tensors = dataset._header(first)
        wanted = set(columns) | {ragged_offsets_name(c) for c in columns if c in dataset.ragged}
        read, whole = sum(t.end - t.start for n, t in tensors.items() if n in wanted), first.size
    if read * workers <= whole:
        return (f"the columns read ({', '.join(columns)}) are {read} of every {whole} bytes: "
                f"{workers} workers' ranges fetch less than whole shards")
    return None


def _sample_bytes(dataset: Any, columns: Any) -> int | None:
    """A sample's bytes in ``columns`` by the schema (``None`` where a column is ragged)."""
    total = 0
    for c in columns:
        shape = dataset.schema[c].get("shape")
        if shape is None or c in dataset.ragged or any(not isinstance(d, int) for d in shape[1:]):
            return None
        n = dataset._dtypes[c].itemsize
        for d in shape[1:]:
            n *= d
        total += n
    return total


def make_spool(limit: int, dirs: tuple[str, ...] | None = None) -> Spool | None:
    """A new spool in the first of ``dirs`` (default ``/dev/shm``, then the temporary directory)
    with ``ROOM × limit`` free; ``None`` if none has. Spools of dead processes found there are
    removed first. Its directory is removed when the returned object is garbage-collected (the
    loader and each of its iterators hold it: an iterator outliving its loader keeps it) or at
    exit, by this process only."""
    for d in dirs if dirs is not None else ("/dev/shm", tempfile.gettempdir()):
        try:
            if not os.path.isdir(d) or not os.access(d, os.W_OK):
                continue
            _remove_orphans(d)
            st = os.statvfs(d)
            if st.f_bavail * st.f_frsize < ROOM * limit:
                continue
            path = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=d)
        except OSError:
            continue
        spool = Spool(path, limit)
        weakref.finalize(spool, _remove, path, os.getpid())
        return spool
    return None


def _remove(path: str, pid: int) -> None:
    if os.getpid() == pid:  # never from a forked worker's copy
        shutil.rmtree(path, ignore_errors=True)


def _remove_orphans(d: str) -> None:
    for e in os.listdir(d):
        m = _NAME.match(e)
        if m and not _alive(int(m.group(1))):
            shutil.rmtree(os.path.join(d, e), ignore_errors=True)
