"""``open_dataset``: a dataset directory written by ``df.write.format("safetensors")``.

Format rules (manifest fields, header validity, shard names) are the Rust engine's
(``safetensors_spark._native``); this module reads bytes, checks that shards and manifest agree,
and cuts numpy arrays out of shard memory.
"""

from __future__ import annotations

import bisect
import copy
import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from numpy.typing import NDArray

from . import _native, _progress
from ._errors import (
    ColumnNotFoundError,
    IndexFileError,
    KeyNotFoundError,
    ManifestError,
    ShardError,
)
from ._storage import HEADER_READ_AHEAD, CachedStore, open_store

# the dataset's file names and shard metadata keys are the Rust rules' values (dataset::names),
# never copies: tests/python/package/test_one_home.py fails when a literal comes back
from ._native import (
    DEFAULT_KV_SEPARATOR,
    INDEX_DIR_NAME,
    KV_SEPARATOR_METADATA_KEY,
    LAYOUT_METADATA_KEY,
    MANIFEST_FILE_NAME,
    MANIFEST_LOG_DIR,
    PADDED_SAMPLES_METADATA_KEY,
    RAGGED_METADATA_KEY,
    manifest_log_file_name,
)
from ._native import ragged_offsets_name as offsets_name

if TYPE_CHECKING:
    import datetime

    from ._prefetch import Prefetcher

#: A store of _storage.py (LocalStore, FsspecStore or CachedStore): where the bytes come from
Store = Any
#: A sample or a shard's rows: ``{column: array}``
Arrays = dict[str, Any]

_NUMPY_DTYPES = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "U16": np.dtype(np.uint16),
    "I16": np.dtype(np.int16),
    "U32": np.dtype(np.uint32),
    "I32": np.dtype(np.int32),
    "U64": np.dtype(np.uint64),
    "I64": np.dtype(np.int64),
    "F16": np.dtype(np.float16),
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
}


def numpy_dtype(dtype: str, what: str) -> np.dtype[Any]:
    """The numpy dtype for a safetensors dtype name. BF16 is ``ml_dtypes.bfloat16`` when
    ml_dtypes is installed, else its raw bits as ``uint16``."""
    if dtype in _NUMPY_DTYPES:
        return _NUMPY_DTYPES[dtype]
    if dtype == "BF16":
        try:
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        except ImportError:
            return np.dtype(np.uint16)
    raise ShardError(f"{what}: dtype {dtype} has no numpy equivalent in this package "
                     f"(supported: {', '.join(sorted([*_NUMPY_DTYPES, 'BF16']))})")


class Ragged:
    """Rows of a ragged column: ``values`` (the rows concatenated along the first dimension,
    ``[elements, *inner_shape]``) and ``offsets`` (int64 ``[rows + 1]``, from 0): row ``i`` is
    ``values[offsets[i]:offsets[i + 1]]``. Local shards: ``values`` is a view of the map."""

    __slots__ = ("values", "offsets")

    def __init__(self, values: NDArray[Any], offsets: NDArray[np.int64]) -> None:
        self.values, self.offsets = values, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> NDArray[Any]:
        n = len(self)
        j = int(i) + n if i < 0 else int(i)
        if not 0 <= j < n:
            raise IndexError(f"row {i} is out of range for {n} ragged rows")
        return self.values[self.offsets[j]: self.offsets[j + 1]]

    def __iter__(self) -> Iterator[NDArray[Any]]:
        return (self[i] for i in range(len(self)))

    @property
    def lengths(self) -> NDArray[np.int64]:
        return np.diff(self.offsets)

    def __repr__(self) -> str:
        return f"Ragged(rows={len(self)}, values={self.values.dtype}{list(self.values.shape)})"


class Tensor:
    """One tensor of a shard header: dtype name, shape and absolute byte range."""

    __slots__ = ("name", "dtype", "shape", "start", "end")

    def __init__(self, name: str, dtype: str, shape: Sequence[int], start: int, end: int) -> None:
        self.name, self.dtype, self.shape, self.start, self.end = name, dtype, tuple(shape), start, end

    def __getstate__(self) -> tuple[str, str, tuple[int, ...], int, int]:
        return (self.name, self.dtype, self.shape, self.start, self.end)

    def __setstate__(self, state: tuple[str, str, tuple[int, ...], int, int]) -> None:
        self.name, self.dtype, self.shape, self.start, self.end = state


class Shard:
    """A shard listed in the manifest. ``header`` is its parsed header (a ``_native.Header``,
    kept in Rust), read when first needed; ``tensors`` (name -> Tensor) and the KV split
    (``keys``, ``kv``) are built from it only when asked for."""

    def __init__(self, index: int, name: str, samples: int, padded: int, size: int, offset: int,
                 added_version: int | None = None) -> None:
        self.index = index
        self.added_version = added_version  # the version that first listed it (provenance), if recorded
        self.name = name
        self.samples = samples
        self.padded = padded
        self.size = size
        self.offset = offset  # global index of its first sample
        self.metadata: dict[str, str] | None = None
        self.checked = False  # header checked against the manifest in this process
        # not pickled (a worker reads it again when needed)
        self.header: _native.Header | None = None
        self.tensors: dict[str, Tensor] | None = None  # name -> Tensor
        self.keys: list[str] = []  # KV: sorted keys (once kv is set)
        self.kv: dict[str, dict[str, Tensor]] | None = None  # KV: key -> {column: Tensor}

    def __repr__(self) -> str:
        return f"Shard({self.name!r}, samples={self.samples})"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["header"] = None
        state["checked"] = False  # checked again where it is read again
        return state


def _read_header(store: Store, shard: Shard, crc32c: str | None = None) -> _native.Header:
    """Reads and validates a shard's header (Rust rules); returns the ``_native.Header`` (its
    errors: :class:`ShardError` naming the file). The store also checks the object's size
    against the manifest's ``shards[].bytes`` with the same reads where it can
    (``store.header_bytes``: a local ``fstat``, the size a range GET's answer states, the copy
    in the node cache), so a remote shard costs one or two requests on its first use and
    nothing at open."""
    url = store.url(shard.name)
    size = shard.size
    try:
        head, got = store.header_bytes(shard.name, min(size, HEADER_READ_AHEAD), size, crc32c)
    except FileNotFoundError:  # (named by its remote URL with the node cache too)
        where = store.remote.url(shard.name) if isinstance(store, CachedStore) else url
        raise ShardError(f"{where}: listed in {MANIFEST_FILE_NAME} but missing") from None
    if got is not None and got != size:
        raise ShardError(f"{url}: the file has {got} bytes but {MANIFEST_FILE_NAME} says "
                         f"{size} (shards[].bytes)")
    n = _native.check_prefix(bytes(head[:8]), size, url)
    if 8 + n > len(head):
        more = getattr(store, "read_range", store.read)  # (never waiting for the read-ahead)
        head = head + more(shard.name, len(head), 8 + n)
    return _native.Header.parse(bytes(head[8 : 8 + n]), size, url)


class Dataset:
    """A dataset directory: ``len(ds)`` samples (pad rows excluded), ``ds[i]`` → ``{column:
    array}``, ``ds.get(key)`` for KV datasets, ``ds.iter_shards()``.

    Use :func:`open_dataset` to create one."""

    def __init__(self, path: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, check_headers: bool = True,
                 version: int | None = None, timestamp: datetime.datetime | str | None = None,
                 verify_checksums: bool = False, cache_limit: int | None = None, prefetch: int = 4,
                 max_in_flight: int = 4, retries: int = 5, client: str = "auto",
                 provenance: bool = False) -> None:
        self.path = os.fspath(path)
        if not isinstance(provenance, bool):
            raise ValueError(f"provenance must be True or False, got {provenance!r}")
        #: ``ds[i]`` also gives ``_file``, ``_row_index`` and ``_added_version`` (spec/python.md).
        self.provenance = provenance
        self.storage_options = storage_options
        self.cache_dir = cache_dir
        for name, v, low in (("prefetch", prefetch, 0), ("max_in_flight", max_in_flight, 1), ("retries", retries, 0)):
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
        if cache_limit is not None:
            if not isinstance(cache_limit, int) or isinstance(cache_limit, bool) or cache_limit < 1:
                raise ValueError(f"cache_limit must be a number of bytes >= 1 (or None: unbounded), got {cache_limit!r}")
            if cache_dir is None:
                raise ValueError("cache_limit bounds the node cache: give cache_dir too")
        self.prefetch_depth, self.max_in_flight = prefetch, max_in_flight
        self._store = open_store(self.path, storage_options, cache_dir, cache_limit, retries, client)
        # with the node cache, checksums are verified as each shard enters it (spec/python.md §2.1)
        self._verify = bool(verify_checksums) and isinstance(self._store, CachedStore)
        if version is None and timestamp is None:
            self.manifest = self._load_manifest()
        else:
            self.manifest = self._load_version(version, timestamp)
        #: The manifest version read (``manifest_version``; 0 for a manifest of another tool).
        self.version = self.manifest.get("manifest_version") or 0
        m = self.manifest
        self._take_columns(m["schema"])
        self._checked_offsets: dict[tuple[int, str], NDArray[np.int64]] = {}  # (shard index, column) -> checked offsets array (this process)
        self._list_shards(m)
        # A local directory's shard sizes are checked here (one stat each, no request); a remote
        # store's with each shard's first read (spec/python.md §2: open costs the manifest's GET)
        if self._store.is_local and not isinstance(self._store, CachedStore):
            self._check_shard_files()
        if cache_limit is not None and self.shards and max(s.size for s in self.shards) > cache_limit:
            big = max(self.shards, key=lambda s: s.size)
            raise ValueError(f"cache_limit={cache_limit} is smaller than shard {self._store.url(big.name)} "
                             f"({big.size} bytes): the node cache holds whole shards")
        self.layout = m.get("layout")
        self.kv_separator = m.get("kv_separator")
        self.batch_size = m.get("batch_size")
        #: whether each shard's header is checked against the manifest on its first use in this
        #: process (off until the layout is known)
        self._check_headers = False
        if self.layout is None:
            # a manifest with only the published fields (another tool's): the layout and the
            # ragged columns come from the shards, so every header is read here
            progress = _progress.reporter(f"open_dataset {self.path}", "shard headers read")
            progress.start(len(self.shards))
            try:
                self._each_shard(self._native_header, progress)
            finally:
                progress.finish()
            self._infer_layout()
        if self.layout == "kv" and self.kv_separator is None:
            self.kv_separator = DEFAULT_KV_SEPARATOR
        self._dtypes = {c: numpy_dtype(self.schema[c]["dtype"], f"{self.path}: column '{c}'")
                        for c in self.columns}
        if check_headers:
            for shard in self.shards:  # the headers read above (published-only manifests)
                if shard.header is not None:
                    self._check_header(shard, shard.header)
                    shard.checked = True
        # every other shard: checked by _native_header the first time it is used (lazily: an
        # open reads no shard, whatever the number of shards)
        self._check_headers = bool(check_headers)
        self._parts: dict[str, tuple[str, Any]] | None = None  # KV: {shard name: (part url, pyarrow ParquetFile)}, opened on first get

    def _list_shards(self, m: dict[str, Any]) -> None:
        """``shards`` (with each one's first sample) and ``total_samples`` from manifest ``m``."""
        self.total_samples = m["total_samples"]
        self.shards = []
        offset = 0
        for i, s in enumerate(m["shards"]):
            self.shards.append(Shard(i, s["shard_path"], s["samples_count"], s.get("padded_samples") or 0,
                                     s["bytes"], offset, s.get("added_version")))
            offset += s["samples_count"]
        self._starts = [s.offset for s in self.shards]

    def _take_columns(self, schema: dict[str, Any]) -> None:
        """The columns (and ragged columns) of manifest schema ``schema``."""
        self.schema = schema
        self.columns = list(self.schema)
        # ragged column -> inner shape (spec/dataset.md §2.1)
        self.ragged = {c: list(t["ragged"]["inner_shape"]) for c, t in self.schema.items() if t.get("ragged")}

    def _following(self, version: int, shards: list[dict[str, Any]]) -> Dataset:
        """This dataset as a follower reads version ``version`` (spec/dataset.md §5.12): the same
        store, columns and layout, listing only ``shards``, the version's added ones (their files
        checked as at open, their headers on first use). An empty version (no shard, no columns)
        follows with the columns of ``version``'s own manifest."""
        child = copy.copy(self)
        m = dict(self.manifest)
        if not self.schema:
            own = json.loads(_native.parse_log_entry(version, _rebuild_version(self._store, self.path, version),
                                                     self.path))
            m.update(schema=own["schema"])
            child._take_columns(own["schema"])
        m.update(shards=shards, manifest_version=version, total_samples=sum(s["samples_count"] for s in shards),
                 total_bytes=sum(s["bytes"] for s in shards))
        child.manifest, child.version = m, version
        child._list_shards(m)
        child._checked_offsets, child._parts = {}, None
        child.__dict__.pop("_header_locks", None)
        if child._store.is_local and not isinstance(child._store, CachedStore):
            child._check_shard_files()
        return child

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_parts", None)

    # -- pickling: the store (paths), the manifest and the tensors built from headers so far; no
    # open files, no index part, no native header (a process that needs one reads it again) ---

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_parts"] = None
        state["_checked_offsets"] = {}
        state.pop("_header_locks", None)
        return state

    def cache_stats(self) -> dict[str, Any] | None:
        """With ``cache_dir``: this dataset's node-cache events, every process on this node
        together (``fetches``, ``fetched_bytes``, ``refetches``, ``evictions``, ``evicted_bytes``,
        ``cached_bytes``, and the shard names ``fetched`` / ``evicted`` in order); take it before
        and after an epoch for the epoch's bytes. ``None`` without ``cache_dir``."""
        return self._store.node.stats() if isinstance(self._store, CachedStore) else None

    def io_counters(self) -> dict[str, int | float]:
        """This process's remote reads of this dataset: ``bytes_fetched``, ``requests`` (GETs),
        ``request_s`` (their summed latency), ``cache_hits`` / ``cache_misses`` (node cache);
        zeros for a local dataset. ``loader().stats()`` adds up its workers'."""
        return self._store.io_counters()

    def prefetch(self, groups: Iterable[Sequence[int]], columns: Iterable[str]) -> Prefetcher | None:
        """Starts reading ahead (spec/python.md §2.1) for an iterator of this process that will
        read ``groups`` (an iterable of lists of shard indices, one per batch or message, in
        order) of ``columns``. Replaces this process's previous read-ahead. Nothing for a local
        dataset or with ``prefetch=0``."""
        from ._prefetch import Prefetcher

        store = self._store
        cached = isinstance(store, CachedStore)
        if self.prefetch_depth == 0 or (store.is_local and not cached):
            return None
        if not cached and self.layout != "batch":
            return None  # KV: a sample's tensors are found through its key; read on demand
        names = ([self.shards[i].name for i in g] for g in groups)
        by_name = {s.name: s for s in self.shards}
        getattr(store, "remote", store).fs  # a forked copy rebuilds its file system here, not in a thread
        if cached:
            crcs = {s["shard_path"]: s.get("crc32c") for s in self.manifest["shards"]}

            def fetch(name: str) -> Any:
                sh = by_name[name]
                store.fetch_now(name, sh.size, crcs[name] if self._verify else None)
                return store.node.path(name)

            p = Prefetcher(names, fetch, self.prefetch_depth, self.max_in_flight,
                           size_of=lambda n: by_name[n].size, byte_budget=store.node.limit,
                           on_window=store.node.set_needs)
        else:
            wanted = set()
            for c in columns:
                wanted.add(c)
                if c in self.ragged:
                    wanted.add(offsets_name(c))

            def fetch(name: str) -> Any:
                tensors = self._header(by_name[name])
                spans = sorted((t.start, t.end) for n, t in tensors.items() if n in wanted and t.end > t.start)
                merged: list[list[int]] = []
                for a, b in spans:  # neighbouring tensors: one range GET
                    if merged and a <= merged[-1][1]:
                        merged[-1][1] = max(merged[-1][1], b)
                    else:
                        merged.append([a, b])
                return [(a, b, store.read_range(name, a, b)) for a, b in merged]

            p = Prefetcher(names, fetch, self.prefetch_depth, self.max_in_flight)
        old, store.prefetcher = store.prefetcher, p
        if old is not None and old.pid == os.getpid():
            old.close()
        return p

    @property
    def bytes_fetched(self) -> int:
        """Bytes this process has read from the remote store for this dataset object (manifest,
        headers, sample ranges, whole shards copied into ``cache_dir``); 0 for a local dataset.
        Counted per process: reads made in DataLoader workers are counted in the workers' copies,
        not here (spec/python.md §remote reads)."""
        store = self._store
        remote = getattr(store, "remote", store)
        return getattr(remote, "bytes_fetched", 0)

    # -- opening ---------------------------------------------------------------------------------

    def _load_manifest(self) -> dict[str, Any]:
        url = self._store.url(MANIFEST_FILE_NAME)
        try:
            text = self._store.read_manifest(MANIFEST_FILE_NAME)
        except FileNotFoundError:
            raise ManifestError(f"{url}: not found; {self.path} is not a dataset written by "
                                f"df.write.format('safetensors') (or its write has not committed)") from None
        except OSError as e:
            raise ManifestError(f"{url}: cannot be read: {e}") from None
        # every rule of spec/dataset.md §5, shard names included: ManifestError naming the file
        return json.loads(_native.parse_manifest(text, url))

    def _load_version(self, version: int | None, timestamp: datetime.datetime | str | None) -> dict[str, Any]:
        """The manifest of one committed version (spec/dataset.md §5.8), by number or by time,
        after checking that every shard it lists is there with its recorded size."""
        if isinstance(version, bool) or (version is not None and not isinstance(version, int)):
            raise ManifestError(f"version={version!r}: expected an integer ≥ 1")
        if timestamp is not None:
            import datetime as _dt
            if isinstance(timestamp, _dt.datetime):
                if timestamp.tzinfo is None:
                    timestamp = timestamp.replace(tzinfo=_dt.timezone.utc)
                timestamp = timestamp.isoformat()
            elif not isinstance(timestamp, str):
                raise ManifestError(f"timestamp={timestamp!r}: expected a datetime or a string such as "
                                    f"'2026-11-26 12:00:00' (UTC) or ISO 8601")
        # the native rules' errors name the dataset (ManifestError; ShardError for its shards)
        entries = _log_entries(self._store, self.path, with_text=timestamp is not None)
        v = _native.select_version(json.dumps(entries), self.path, None if version is None else str(version),
                                   timestamp)
        text = _rebuild_version(self._store, self.path, v)
        # the rebuilt manifest must be that version (spec/dataset.md §5.9): never another; its
        # shard names are checked as a manifest's are
        manifest = json.loads(_native.parse_log_entry(v, text, self.path))
        found = {}
        for s in manifest["shards"]:
            try:
                found[s["shard_path"]] = self._store.size(s["shard_path"])
            except FileNotFoundError:
                pass
        _native.check_version_shards(text, v, json.dumps(found), self.path)
        return manifest

    def verify_checksums(self) -> int:
        """Reads every shard whole and checks its CRC-32C against the manifest's
        ``shards[].crc32c`` (shards written before checksums were recorded are skipped). Returns
        the number of shards verified; a mismatch raises :class:`ShardError` naming the shard.
        With ``cache_dir``: each shard's copy in the node cache is checked, a missing or
        mismatching copy fetched (again, up to the refetch bound) and checked as it enters."""
        n = 0
        progress = _progress.reporter(f"verify_checksums {self.path}", "shards verified")
        listed = [s for s in self.manifest["shards"] if s.get("crc32c") is not None]
        progress.start(len(listed), sum(s["bytes"] for s in listed))
        try:
            for s in listed:
                self._verify_one(s)
                progress.advance(1, s["bytes"])
                n += 1
        finally:
            progress.finish()
        return n

    def _verify_one(self, s: dict[str, Any]) -> None:
        """One shard of :meth:`verify_checksums`, ``s`` its manifest entry (with a CRC-32C)."""
        want, name = s["crc32c"], s["shard_path"]
        if isinstance(self._store, CachedStore):
            node = self._store.node
            if node.has(name, s["bytes"]) and _native.file_crc32c(node.path(name)) != want:
                os.unlink(node.path(name))
            self._store.fetch_now(name, s["bytes"], want)
            return
        if self._store.is_local:
            got = _native.file_crc32c(self._store.url(name))
        else:
            got = _native.crc32c_hex(bytes(self._store.read_text(name)))
        if got != want:
            raise ShardError(f"{self._store.url(name)}: CRC-32C is {got}, the manifest (version "
                             f"{self.version}) records {want}: the file changed or is corrupt")

    def _each_shard(self, fn: Callable[[Shard], object], progress: _progress.Reporter | _progress._Silent) -> None:
        """``fn(shard)`` for every shard, in manifest order (the header checks), each advancing
        ``progress`` when done. Remote: on ``max_in_flight`` threads, so opening costs ``shards /
        max_in_flight`` round trips, not one per shard (at 25 ms a request, 61 shards took 3 s to
        open one after another); the first failure in manifest order is raised, as one after
        another would."""
        remote = isinstance(self._store, CachedStore) or not self._store.is_local
        if not remote or len(self.shards) < 2 or self.max_in_flight < 2:
            for shard in self.shards:
                fn(shard)
                progress.advance()
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(self.max_in_flight, len(self.shards)),
                                thread_name_prefix="safetensors-spark-open") as pool:
            for _ in pool.map(fn, self.shards):
                progress.advance()

    def _check_shard_files(self) -> None:
        """Every listed shard exists with its manifest size; the first that does not, in manifest
        order, is named. The sizes come from the store in one go (remote: a listing per directory,
        not a request per shard)."""
        sizes = self._store.sizes([s.name for s in self.shards])
        for shard in self.shards:
            url = self._store.url(shard.name)
            size = sizes.get(shard.name)
            if size is None:
                raise ShardError(f"{url}: listed in {MANIFEST_FILE_NAME} but missing")
            if size != shard.size:
                raise ShardError(f"{url}: the file has {size} bytes but {MANIFEST_FILE_NAME} says "
                                 f"{shard.size} (shards[].bytes)")

    def _native_header(self, shard: Shard) -> _native.Header:
        """The shard's parsed, validated header (read on first use in this process, and then,
        with ``check_headers``, checked against the manifest before anything is read through
        it: a disagreement is a :class:`ShardError` naming the shard, raised again at every
        use)."""
        header = shard.header
        if header is not None and (shard.checked or not self._check_headers):
            return header
        with self._header_lock(shard):  # the reader and the read-ahead: one read of a header
            header = shard.header
            if header is None:
                header = _read_header(self._store, shard,
                                      self.manifest["shards"][shard.index].get("crc32c") if self._verify else None)
                shard.metadata = header.metadata
                shard.header = header
            if self._check_headers and not shard.checked:
                self._check_header(shard, header)
                shard.checked = True
        return header

    def _header_lock(self, shard: Shard) -> threading.Lock:
        """One of this process's 64 locks of header reads (made again in a forked child: a lock
        the parent held at the fork would stay held)."""
        locks = self.__dict__.get("_header_locks")
        if locks is None or locks[0] != os.getpid():
            locks = (os.getpid(), [threading.Lock() for _ in range(64)])
            self._header_locks = locks
        return locks[1][shard.index % 64]

    def _header(self, shard: Shard) -> dict[str, Tensor]:
        """The shard's tensors as ``{name: Tensor}`` (built from the header on first use)."""
        if shard.tensors is None:
            shard.tensors = {t[0]: Tensor(*t) for t in self._native_header(shard).tensors()}
        return shard.tensors

    def _infer_layout(self) -> None:
        """A manifest with only the published fields: the layout comes from the shards (spec/python.md §2)."""
        self._ragged_from_shards()
        layouts = {v for s in self.shards if (v := (s.metadata or {}).get(LAYOUT_METADATA_KEY)) is not None}
        if len(layouts) > 1:
            raise ManifestError(f"{self.path}: shards disagree on {LAYOUT_METADATA_KEY}: {sorted(layouts)}")
        if layouts:
            self.layout = layouts.pop()
            if self.layout not in ("batch", "kv"):
                raise ShardError(f"{self.path}: {LAYOUT_METADATA_KEY} is '{self.layout}', expected batch or kv")
            seps = {(s.metadata or {}).get(KV_SEPARATOR_METADATA_KEY) for s in self.shards} - {None}
            self.kv_separator = seps.pop() if len(seps) == 1 else None
        else:
            def is_batch(s: Shard) -> bool:
                rows = s.samples + self._padded_from_metadata(s)
                tensors = self._header(s)
                return all(c in tensors and len(tensors[c].shape) >= 1 and tensors[c].shape[0] == rows
                           for c in self.columns if c not in self.ragged)

            self.layout = "batch" if all(is_batch(s) for s in self.shards) else "kv"
        if self.layout == "batch":
            for s in self.shards:
                s.padded = self._padded_from_metadata(s)
            fixed = [c for c in self.columns if c not in self.ragged]
            if self.batch_size is None and fixed:
                shape = self.schema[fixed[0]].get("shape")
                self.batch_size = shape[0] if shape else None

    def _ragged_from_shards(self) -> None:
        """A column whose schema shape is null and that every shard's ``safetensors_spark.ragged``
        lists is ragged (a shard describes itself; spec/python.md §2); its inner shape is its
        values tensor's in the first shard."""
        if not self.shards:
            return
        listed = []
        for s in self.shards:
            raw = (s.metadata or {}).get(RAGGED_METADATA_KEY, "[]")
            try:
                names = json.loads(raw)
                if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                    raise ValueError("not a JSON array of column names")
            except ValueError as e:
                raise ShardError(f"{self._store.url(s.name)}: __metadata__ {RAGGED_METADATA_KEY} is {raw!r}: {e}") from None
            listed.append(set(names))
        for c in self.columns:
            if c not in self.ragged and self.schema[c].get("shape") is None and all(c in n for n in listed):
                t = self._header(self.shards[0]).get(c)
                if t is None or not t.shape:
                    raise ShardError(f"{self._store.url(self.shards[0].name)}: no tensor '{c}' (ragged column "
                                     f"'{c}' of {RAGGED_METADATA_KEY})")
                self.ragged[c] = list(t.shape[1:])

    @staticmethod
    def _padded_from_metadata(shard: Shard) -> int:
        value = (shard.metadata or {}).get(PADDED_SAMPLES_METADATA_KEY, "0")
        return int(value) if value.isdigit() else 0

    def _check_header(self, shard: Shard, header: _native.Header) -> None:
        """Every fact the manifest states about a shard must hold in its header."""
        url = self._store.url(shard.name)
        nt = self.manifest["shards"][shard.index].get("num_tensors")
        if nt is not None and nt != len(header):
            raise ShardError(f"{url}: the header has {len(header)} tensors but {MANIFEST_FILE_NAME} "
                             f"says {nt} (shards[].num_tensors)")
        if self.layout == "batch":
            tensors = shard.tensors or {t[0]: Tensor(*t) for t in header.tensors()}
            rows = shard.samples + shard.padded
            for c in self.columns:
                if c in self.ragged:
                    header.check_ragged(c, self.schema[c]["dtype"], self.ragged[c], rows)
                    continue
                t = tensors.get(c)
                if t is None:
                    raise ShardError(f"{url}: no tensor '{c}', a column of {MANIFEST_FILE_NAME} schema")
                self._check_dtype(url, t, c)
                want = self.schema[c].get("shape")
                if not t.shape or t.shape[0] != rows:
                    raise ShardError(f"{url}: tensor '{c}' has shape {list(t.shape)}; {MANIFEST_FILE_NAME} "
                                     f"says {shard.samples} samples + {shard.padded} padded = {rows} rows")
                if want is not None and list(t.shape[1:]) != list(want[1:]):
                    raise ShardError(f"{url}: tensor '{c}' has sample shape {list(t.shape[1:])} but "
                                     f"{MANIFEST_FILE_NAME} schema says {list(want[1:])} (schema shape {want})")
        else:
            keys = header.count_kv_keys(self._kv_columns(), cast(str, self.kv_separator))
            if keys != shard.samples:
                raise ShardError(f"{url}: the header holds {keys} keys but {MANIFEST_FILE_NAME} "
                                 f"says samples_count {shard.samples}")

    def _check_dtype(self, url: str, t: Tensor, column: str) -> None:
        want = self.schema[column]["dtype"]
        if t.dtype != want:
            raise ShardError(f"{url}: tensor '{t.name}' has dtype {t.dtype} but {MANIFEST_FILE_NAME} "
                             f"schema says {want} for column '{column}'")

    def _kv_columns(self) -> list[tuple[str, str, list[int] | None]]:
        """The schema as the KV rules take it: ``[(column, dtype, shape or None)]``."""
        return [(c, self.schema[c]["dtype"], self.schema[c].get("shape")) for c in self.columns]

    def _kv_keys(self, shard: Shard) -> dict[str, dict[str, Tensor]]:
        """Splits a KV shard's tensor names into key and column (the Rust rule
        ``dataset::kv::split_kv_header``: the longest column that ends the name after the
        separator; dtypes and shapes as the schema says; every key has every column)."""
        if shard.kv is not None:
            return shard.kv
        header = self._native_header(shard)
        split = header.split_kv(self._kv_columns(), cast(str, self.kv_separator))
        kv: dict[str, dict[str, Tensor]] = {}
        for t, (key, i) in zip(header.tensors(), split):
            kv.setdefault(key, {})[self.columns[i]] = Tensor(*t)
        shard.kv = kv
        shard.keys = sorted(kv)
        return kv

    # -- public API ------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.total_samples

    def __repr__(self) -> str:
        return (f"Dataset({self.path!r}, layout={self.layout}, samples={self.total_samples}, "
                f"shards={len(self.shards)}, columns={self.columns})")

    def _check_columns(self, columns: str | Iterable[str] | None) -> list[str]:
        """``columns`` (None = all) as a list, each a column of the dataset."""
        if columns is None:
            return list(self.columns)
        if isinstance(columns, str):
            columns = [columns]
        columns = list(columns)
        for c in columns:
            if c not in self.schema:
                raise ColumnNotFoundError(f"column '{c}' is not in dataset {self.path}; its columns are {self.columns}")
        if not columns:
            raise ColumnNotFoundError(f"columns is empty; choose from {self.columns}")
        return columns

    def _locate(self, i: int | np.integer[Any]) -> tuple[Shard, int]:
        """``(shard, row)`` of sample ``i`` (negative counts from the end)."""
        n = self.total_samples
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool):
            raise TypeError(f"sample index must be an integer, got {type(i).__name__}")
        j = int(i) + n if i < 0 else int(i)
        if not 0 <= j < n:
            raise IndexError(f"sample index {i} is out of range for dataset {self.path} with {n} samples")
        # the last shard starting at or before j: never an empty one, which shares its start with
        # the next shard
        k = bisect.bisect_right(self._starts, j) - 1
        return self.shards[k], j - self.shards[k].offset

    def _locate_many(self, indices: Any) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """``(shard indices, rows)`` (int64 arrays) of samples ``indices``, checked as ``_locate``."""
        n = self.total_samples
        try:
            v = np.asarray(indices)
        except Exception:  # noqa: BLE001 - a ragged or odd sequence: the per-index rule decides
            v = None
        if v is None or v.ndim != 1 or v.dtype.kind not in "iu":
            pairs = [self._locate(i) for i in indices]
            return (np.array([s.index for s, _ in pairs], dtype=np.int64),
                    np.array([r for _, r in pairs], dtype=np.int64))
        v = v.astype(np.int64)
        bad = (v < -n) | (v >= n)
        if bad.any():
            i = v[bad][0]
            raise IndexError(f"sample index {i} is out of range for dataset {self.path} with {n} samples")
        v = np.where(v < 0, v + n, v)
        # the last shard starting at or before j (never an empty one: see _locate)
        k = np.searchsorted(np.asarray(self._starts, dtype=np.int64), v, side="right") - 1
        offsets = np.asarray([s.offset for s in self.shards], dtype=np.int64)
        return k, v - offsets[k]

    def _check_unchanged(self, shard: Shard) -> None:
        """For a local (or locally cached) shard: raises ``ShardError`` naming it unless the file
        still has its validated length (``LocalStore.check``); remote reads check every range."""
        if self._store.is_local:
            self._store.check(shard.name, shard.size)

    def _tensor_array(self, shard: Shard, tensor: Tensor, view: bool = False) -> NDArray[Any]:
        """The whole tensor as an array: a memory-map view (local) or a fresh read (remote; with
        ``view``, for a caller that only copies out of it, a read-only view of the read-ahead's
        buffer when it holds the tensor)."""
        store = self._store
        if isinstance(store, CachedStore):
            store.fetch(shard.name, shard.size,
                        self.manifest["shards"][shard.index].get("crc32c") if self._verify else None)
        dtype = self._dtype_of(shard, tensor)
        return store.array(shard.name, tensor.start, tensor.end, dtype, tensor.shape, view)

    def _dtype_of(self, shard: Shard, tensor: Tensor) -> np.dtype[Any]:
        return numpy_dtype(tensor.dtype, f"{self._store.url(shard.name)}: tensor '{tensor.name}'")

    def _rows(self, shard: Shard, column: str, start: int, stop: int, view: bool = False) -> NDArray[Any]:
        """Rows ``[start, stop)`` of a batch-layout column: a view for local files, a range read
        of exactly those rows otherwise (``view``: as :meth:`_tensor_array`)."""
        t = self._header(shard)[column]
        store = self._store
        if store.is_local:
            return self._tensor_array(shard, t)[start:stop]
        row_bytes = (t.end - t.start) // t.shape[0] if t.shape[0] else 0
        return store.array(shard.name, t.start + start * row_bytes, t.start + stop * row_bytes,
                           self._dtype_of(shard, t), (stop - start, *t.shape[1:]), view)

    def _offsets(self, shard: Shard, column: str) -> NDArray[np.int64]:
        """The offsets of ragged column ``column`` in ``shard`` (int64 ``[rows + 1]``; a view of
        the map for local shards), checked by the Rust rule once per process: from 0,
        non-decreasing, ending at the values' length."""
        key = (shard.index, column)
        o = self._checked_offsets.get(key)
        if o is None:
            tensors = self._header(shard)
            if column not in tensors or offsets_name(column) not in tensors:
                # a published-only manifest or check_headers=False: the header rule first
                self._native_header(shard).check_ragged(column, self.schema[column]["dtype"],
                                                        self.ragged[column], shard.samples + shard.padded)
            t = tensors[offsets_name(column)]
            o = self._tensor_array(shard, t)
            _native.check_ragged_offsets(column, o.tobytes(), tensors[column].shape[0],
                                         self._store.url(shard.name))
            self._checked_offsets[key] = o
        return o

    def _ragged_values(self, shard: Shard, column: str, start: int, stop: int) -> NDArray[Any]:
        """Elements ``[start, stop)`` of ragged column ``column``'s values: a view for local
        files, one range read otherwise."""
        t = self._header(shard)[column]
        if self._store.is_local:
            return self._tensor_array(shard, t)[start:stop]
        elem = (t.end - t.start) // t.shape[0] if t.shape[0] else 0
        return self._store.array(shard.name, t.start + start * elem, t.start + stop * elem,
                                 self._dtype_of(shard, t), (stop - start, *t.shape[1:]))

    def ragged_rows(self, shard: Shard, column: str, start: int, stop: int) -> Ragged:
        """Rows ``[start, stop)`` of ragged column ``column`` as :class:`Ragged` (values a view
        for local files; offsets rebased to 0)."""
        o = self._offsets(shard, column)
        e0, e1 = int(o[start]), int(o[stop])
        return Ragged(self._ragged_values(shard, column, e0, e1), o[start: stop + 1] - e0)

    def _kv_tensor(self, shard: Shard, key: str, column: str) -> NDArray[Any]:
        return self._tensor_array(shard, self._kv_keys(shard)[key][column])

    def _sample(self, shard: Shard, row: int, columns: Sequence[str]) -> Arrays:
        if self.layout == "batch":
            out = {}
            for c in columns:
                if c in self.ragged:
                    out[c] = self.ragged_rows(shard, c, row, row + 1).values  # the row's elements
                    continue
                a = self._rows(shard, c, row, row + 1)
                out[c] = a.reshape(a.shape[1:])  # a 0-d array (not a numpy scalar) for scalar samples
            return out
        self._kv_keys(shard)
        key = shard.keys[row]
        return {c: self._kv_tensor(shard, key, c) for c in columns}

    def __getitem__(self, i: int) -> Arrays:
        shard, row = self._locate(i)
        out = self._sample(shard, row, self.columns)
        if self.provenance:
            # spec/python.md §2: where the sample is stored, as Spark's hidden columns say it
            out["_file"] = shard.name
            out["_row_index"] = row
            out["_added_version"] = shard.added_version
        return out

    def __iter__(self) -> Iterator[Arrays]:
        for i in range(self.total_samples):
            yield self[i]

    def iter_shards(self, columns: str | Iterable[str] | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
        """Yields ``(shard_name, data)`` per shard in manifest order. Batch layout: ``data`` is
        ``{column: array of the shard's real rows}`` (a ragged column: :class:`Ragged`, its
        values and offsets); KV: ``{key: {column: array}}``."""
        columns = self._check_columns(columns)
        for shard in self.shards:
            if self.layout == "batch":
                yield shard.name, {c: self.ragged_rows(shard, c, 0, shard.samples) if c in self.ragged
                                   else self._rows(shard, c, 0, shard.samples) for c in columns}
            else:
                self._kv_keys(shard)
                yield shard.name, {k: {c: self._kv_tensor(shard, k, c) for c in columns} for k in shard.keys}

    def keys(self) -> list[str]:
        """KV datasets: every key, in sample order."""
        self._require_kv("keys()")
        out = []
        for s in self.shards:
            self._kv_keys(s)
            out.extend(s.keys)
        return out

    def _require_kv(self, what: str) -> None:
        if self.layout != "kv":
            raise ManifestError(f"{what} needs a KV dataset (written with name_col); {self.path} has layout {self.layout}")

    def get(self, key: str, columns: str | Iterable[str] | None = None) -> Arrays:
        """KV datasets: ``{column: array}`` of the row with this key. Looked up in
        ``_tensor_index.parquet`` when the dataset has one: per listed shard's part, its footer
        and only the row groups whose ``sample_key`` statistics can hold the key; the holding
        shard's header is then read and every row checked against it (spec/python.md §2).
        Shards the index does not cover are searched through their headers."""
        self._require_kv("get(key)")
        columns = self._check_columns(columns)
        parts = self._index_parts()
        uncovered = self.shards
        if parts:
            hits = [(shard, url, rows) for shard in self.shards if shard.name in parts
                    for url, pf in [parts[shard.name]]
                    for rows in [self._index_rows(shard, url, pf, key)] if rows]
            if len(hits) > 1:
                raise IndexFileError(f"{self.path}: key '{key}' has rows in the index parts of several shards: "
                                     f"{[url for _, url, _ in hits]}")
            if hits:
                return self._get_indexed(key, columns, *hits[0])
            uncovered = [s for s in self.shards if s.name not in parts]
        for shard in uncovered:
            cols = self._kv_keys(shard).get(key)
            if cols is not None:
                return {c: self._tensor_array(shard, cols[c]) for c in columns}
        raise KeyNotFoundError(f"key '{key}' not found in dataset {self.path} ({self.total_samples} keys)")

    _INDEX_COLUMNS = ["tensor_key", "file_name", "dtype", "shape", "data_start", "data_end", "sample_key", "column"]

    def _index_parts(self) -> dict[str, tuple[str, Any]]:
        """``{shard name: (part url, pyarrow.parquet.ParquetFile)}`` of the shards the index
        covers (opened once: each footer is read once), or ``{}`` without an index. The index is
        a directory of one part per shard (spec/dataset.md §6.1): only the parts of the shards the
        manifest lists are read; a listed shard without a part, or whose part has not the
        manifest's ``num_tensors`` rows, is not covered (its header answers for its keys, as the
        Spark reader does)."""
        if self._parts is not None:
            return self._parts
        parts = {}
        linked = False
        if self._store.is_local and not isinstance(self._store, CachedStore):
            try:  # a linked index directory is never followed (spec/dataset.md §5.9): headers answer
                _native.own_dir(self._store.root, INDEX_DIR_NAME)
            except ManifestError:
                linked = True
        if not linked and self._store.exists(INDEX_DIR_NAME) and self._store.isdir(INDEX_DIR_NAME):
            import pyarrow.parquet as pq

            for shard in self.shards:
                name = f"{INDEX_DIR_NAME}/{_native.index_part_name(shard.name)}"
                if not self._store.exists(name):
                    continue
                url = self._store.url(name)
                try:
                    source, fs = self._store.parquet_source(name)
                    pf = pq.ParquetFile(source, filesystem=fs)
                    missing = [c for c in self._INDEX_COLUMNS if c not in pf.schema_arrow.names]
                except Exception as e:  # pyarrow raises several types for unreadable or foreign files
                    raise IndexFileError(f"{url}: cannot be read as the tensor index ({type(e).__name__}: {e})") from None
                if missing:
                    raise IndexFileError(f"{url}: cannot be read as the tensor index (no column(s) {missing})")
                nt = self.manifest["shards"][shard.index].get("num_tensors")
                if nt is not None and pf.metadata.num_rows != nt:
                    continue
                parts[shard.name] = (url, pf)
        self._parts = parts
        return parts

    def _index_rows(self, shard: Shard, url: str, pf: Any, key: str) -> list[dict[str, Any]]:
        """The rows of ``key`` in one part: only the row groups whose ``sample_key`` min/max can
        hold it are read (a row group without statistics is read)."""
        md = pf.metadata
        leaf = next(i for i in range(md.num_columns) if md.schema.column(i).path == "sample_key")
        groups = []
        for g in range(md.num_row_groups):
            st = md.row_group(g).column(leaf).statistics
            if st is None or not st.has_min_max or st.min <= key <= st.max:
                groups.append(g)
        if not groups:
            return []
        try:
            table = pf.read_row_groups(groups, columns=self._INDEX_COLUMNS)
            # matched in Python: pyarrow.compute would import pandas, seconds on a first lookup.
            # A row whose tensor_key is one of the key's names, when no row of sample_key `key`
            # has that name, is the key's too, whatever its sample_key says: a changed
            # sample_key is then checked (and refused) against the header, never read as "not
            # found" (rows of the groups read for the key)
            names = {f"{key}{self.kv_separator}{c}" for c in self.columns}
            pairs = list(zip(table.column("sample_key").to_pylist(), table.column("tensor_key").to_pylist()))
            own = {t for k, t in pairs if k == key}
            at = [i for i, (k, t) in enumerate(pairs) if k == key or (t in names and t not in own)]
            rows = [r for i in at for r in table.slice(i, 1).to_pylist()]
        except Exception as e:  # pyarrow raises several types for unreadable or foreign files
            raise IndexFileError(f"{url}: cannot be read as the tensor index ({type(e).__name__}: {e})") from None
        for r in rows:
            _native.check_index_file_name(r["file_name"], url)
            if r["file_name"] != shard.name:
                raise IndexFileError(f"{url}: the index part of {shard.name} has a row for tensor '{r['tensor_key']}' "
                                     f"of shard {r['file_name']} (stale or misplaced index part)")
            if r["column"] not in self.schema:
                raise IndexFileError(f"{url}: tensor '{r['tensor_key']}' has column '{r['column']}', "
                                     f"not in the schema {self.columns}")
        return rows

    def _get_indexed(self, key: str, columns: Sequence[str], shard: Shard, url: str,
                     rows: list[dict[str, Any]]) -> Arrays:
        """Reads the holding shard's header and checks every row of the key against it (the Rust
        rule ``dataset::kv::check_index_row``: name, dtype, shape and byte range); the bytes
        read are the header's tensor's. A disagreement raises naming the dataset, the part, the
        key and what disagrees, never returns other bytes."""
        header = self._native_header(shard)
        out = {}
        context = f"{url}: key '{key}' of dataset {self.path} disagrees with the header of {shard.name}"
        for r in rows:
            t = header.check_index_row(r["tensor_key"], r["dtype"], r["shape"], r["data_start"],
                                         r["data_end"], r["sample_key"], r["column"],
                                         cast(str, self.kv_separator), context)
            if r["column"] in columns:
                out[r["column"]] = self._tensor_array(shard, Tensor(*t))
        missing = [c for c in columns if c not in out]
        if missing:
            raise IndexFileError(f"{url}: key '{key}' has no row for column(s) {missing}")
        return out


def open_dataset(path: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, check_headers: bool = True,
                 version: int | None = None, timestamp: datetime.datetime | str | None = None,
                 verify_checksums: bool = False, cache_limit: int | None = None, prefetch: int = 4,
                 max_in_flight: int = 4, retries: int = 5, client: str = "auto",
                 provenance: bool = False) -> Dataset:
    """Opens a dataset directory (local path or fsspec URL such as ``s3://bucket/data``).

    Reads the manifest only (one GET for a remote dataset, whatever its number of shards; a
    manifest with only the published fields, written by another tool, has every shard's header
    read here). With ``check_headers`` (default) each shard's header is checked against the
    manifest the first time the shard is used in this process, before any of its bytes are
    returned: a disagreement is a :class:`ShardError` naming the shard. ``storage_options`` go
    to the remote client; with ``cache_dir`` remote shards are copied there whole on first use
    and memory-mapped.

    ``client`` chooses how ``s3://`` is read: ``"auto"`` (default) the extension's native client
    when it understands every storage option (else fsspec), ``"native"`` always (an option it
    does not understand is a ``ValueError`` naming it), ``"fsspec"`` fsspec/s3fs.

    ``version=n`` reads committed version ``n`` and ``timestamp=`` (a datetime, naive = UTC, or a
    string such as ``"2026-11-26 12:00:00"`` or ISO 8601) the newest version committed at or
    before it, from ``_manifest_log/`` (spec/dataset.md §5.8); ``verify_checksums=True`` reads
    every shard whole once and checks its CRC-32C (:meth:`Dataset.verify_checksums`); with
    ``cache_dir`` instead each shard as it enters the node cache (refetched when it does not
    match).

    Remote reading (spec/python.md §2.1): ``prefetch`` shards ahead of the iterators' order are
    fetched on ``max_in_flight`` threads per process; ``cache_limit`` bounds ``cache_dir`` in
    bytes; a failed GET is retried up to ``retries`` times with exponential backoff.

    ``provenance=True``: each sample ``ds[i]`` also has ``_file`` (its shard's name), ``_row_index``
    (its row in the shard; KV: the key's position among the shard's sorted keys) and
    ``_added_version`` (the version that added the shard; None when the manifest does not record
    it), the values of Spark's hidden columns: a bad sample is deleted with
    :func:`safetensors_spark.delete_rows` (spec/dataset.md §5.11)."""
    ds = Dataset(path, storage_options=storage_options, cache_dir=cache_dir, check_headers=check_headers,
                 version=version, timestamp=timestamp, verify_checksums=verify_checksums,
                 cache_limit=cache_limit, prefetch=prefetch, max_in_flight=max_in_flight, retries=retries,
                 client=client, provenance=provenance)
    if verify_checksums and not isinstance(ds._store, CachedStore):
        ds.verify_checksums()
    return ds


def history(path: str | os.PathLike[str], *,
            storage_options: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The dataset's versions, oldest first (spec/dataset.md §5.8): a list of dicts with
    ``version``, ``committed_at_ms``, ``operation``, ``rows_added``, ``rows_removed``,
    ``bytes_added``, ``bytes_removed``, ``shards_added``, ``shards_removed``, ``total_rows``,
    ``total_bytes``, ``created_by``, ``app_id``, ``commit_message``."""
    store = open_store(os.fspath(path), storage_options, None)
    entries = _log_entries(store, str(path), with_text=True)
    if not entries:
        raise ManifestError(f"{store.url(MANIFEST_LOG_DIR)}: no manifest log; {path} is not a dataset "
                            "written by this connector")
    return json.loads(_native.history(json.dumps(entries), str(path)))


def _read_log_entry(store: Store, version: int) -> str:
    """The text of ``_manifest_log/`` entry ``version`` (a local one by the Rust rule of
    spec/dataset.md §5.9: a regular file within the size bound); an error names the entry."""
    name = f"{MANIFEST_LOG_DIR}/{manifest_log_file_name(version)}"
    try:
        return store.read_manifest(name)
    except OSError as e:
        raise ManifestError(f"{store.url(name)}: cannot be read: {e}") from None


def _rebuild_version(store: Store, dataset: str, version: int) -> str:
    """The whole manifest (JSON text) of ``version``, rebuilt from ``_manifest_log/`` by the Rust
    rule (spec/dataset.md §5.10): the newest checkpoint at or below it and the entries after it,
    read as the rule asks (a full entry written before log format 2 is read alone)."""
    return _run_log_plan(store, dataset, f"rebuilding version {version}",
                         lambda names, texts: _native.rebuild_version(names, version, texts, dataset))


def _follow_versions(store: Store, dataset: str, after: int, upto: int, skip_changes: bool,
                     skip_option: str) -> list[dict[str, Any]]:
    """The versions after ``after`` up to ``upto`` as a reader following the dataset takes them,
    by the Rust rule (spec/dataset.md §5.12): ``{version, operation, committed_at_ms, followed,
    add}`` each, ``followed`` one of ``rows`` (read ``add``), ``nothing``, ``skipped``. A version
    that removes rows is a :class:`ManifestError` naming it and ``skip_option`` unless
    ``skip_changes``."""
    text = _run_log_plan(store, dataset, f"following versions {after + 1}…{upto}",
                         lambda names, texts: _native.follow_versions(names, after, upto, texts, skip_changes,
                                                                      skip_option, dataset))
    versions: list[dict[str, Any]] = json.loads(text)
    return versions


def _run_log_plan(store: Store, dataset: str, what: str,
                  step: Callable[[list[str], dict[str, str]], tuple[str, list[str], str | None]]) -> str:
    """Runs a native plan over ``_manifest_log/`` (``step(names, texts)`` says what to read next
    or gives its result) reading what it asks; a file a commit removed after the listing (a
    superseded checkpoint) makes it list again, up to three times."""
    for attempt in range(3):
        names = [name for name, _ in store.log_entries(MANIFEST_LOG_DIR)]
        texts: dict[str, str] = {}
        gone = False
        for _ in range(6):
            _, need, result = step(names, texts)
            if result is not None:
                return result
            for name in need:
                path = f"{MANIFEST_LOG_DIR}/{name}"
                try:
                    texts[name] = store.read_manifest(path)
                except FileNotFoundError as e:
                    if attempt == 2:
                        raise ManifestError(f"{store.url(path)}: cannot be read: {e}") from None
                    gone = True
                    break
                except OSError as e:
                    raise ManifestError(f"{store.url(path)}: cannot be read: {e}") from None
            if gone:
                break
        if not gone:
            break
    raise ManifestError(f"{dataset}: {what} from {MANIFEST_LOG_DIR}/ did not end")


def _log_entries(store: Store, dataset: str, with_text: bool) -> list[dict[str, Any]]:
    """The ``_manifest_log/`` entries of ``dataset`` (its path, for errors) as the native version
    rules take them: ``{"version", "modified_ms"[, "text"]}``. Names and versions are the Rust
    rule's (a 20-digit name beyond the largest version is a :class:`ManifestError` naming it)."""
    entries = []
    for name, mtime in store.log_entries(MANIFEST_LOG_DIR):
        v = _native.log_entry_version(name, dataset)
        if v is None:
            continue
        e = {"version": v, "modified_ms": mtime}
        if with_text:
            e["text"] = _read_log_entry(store, v)
        entries.append(e)
    return entries
