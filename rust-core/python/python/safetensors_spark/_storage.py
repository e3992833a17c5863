"""Where the bytes come from: local files (memory-mapped), fsspec range reads, or a local cache.

A *store* is rooted at the dataset directory and knows only plain file names in it (the caller has
checked them with the Rust trust rule). No thread, pool or open file survives pickling: a store
pickles as its URL pieces and reopens files lazily in the process that uses it.
"""

import errno
import hashlib
import mmap
import os
import random
import threading
import time

import numpy as np

HEADER_READ_AHEAD = 64 * 1024
PREFETCH_THREAD = "safetensors-spark-prefetch"  # a read-ahead thread never waits on read-ahead


class RemoteReadError(OSError):
    """A remote read that failed for good: after its retries, or at once for an error that a
    retry cannot cure (not found, access denied). Names the object."""


class _ShortRead(OSError):
    """A range read that returned fewer bytes than asked (a transfer cut short)."""


# The local disk refused the copy (a full cache disk, a file size limit, a read-only disk): no
# retry of the remote request can cure it.
_LOCAL_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS})


def _retriable(e):
    """Whether a failed GET may be tried again: reads are idempotent, so every transient
    failure (throttling such as 503 SlowDown, 500, timeouts, connection resets, a cut-short
    body, a server that does not answer) is; an object that is not there, access denied, a
    wrong argument, or a local disk that refused the copy are not (they would fail the same way
    again)."""
    if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(e, OSError) and e.errno in _LOCAL_DISK_ERRNOS:
        return False
    if isinstance(e, (OSError, TimeoutError, ConnectionError, EOFError)):
        return True
    mod = type(e).__module__.split(".")[0]
    return mod in ("botocore", "aiobotocore", "aiohttp", "urllib3", "requests", "s3fs", "fsspec", "gcsfs",
                   "adlfs", "asyncio", "http")


class RetryPolicy:
    """Bounded exponential backoff for remote reads: up to ``retries`` more attempts after the
    first, waiting ``backoff · 2^i`` seconds (capped at ``max_backoff``, with jitter in
    [50 %, 100 %]) before retry ``i``. Each attempt is bounded by the file system's own timeouts
    (s3fs/botocore: ``config_kwargs`` ``connect_timeout``, ``read_timeout``)."""

    def __init__(self, retries=5, backoff=0.1, max_backoff=5.0):
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise ValueError(f"retries must be an integer >= 0, got {retries!r}")
        self.retries, self.backoff, self.max_backoff = retries, float(backoff), float(max_backoff)

    def call(self, fn, url, what):
        t0 = time.monotonic()
        for attempt in range(self.retries + 1):
            try:
                return fn()
            except Exception as e:  # noqa: BLE001 - classified below, re-raised naming the object
                if not _retriable(e):
                    if isinstance(e, (FileNotFoundError, PermissionError)):
                        # the same type (callers tell a missing object by it), naming the object
                        msg = f"{url}: {what} failed: {e.strerror or e}"
                        raise (type(e)(msg) if e.errno is None else type(e)(e.errno, msg)) from e
                    if isinstance(e, OSError) and e.errno in _LOCAL_DISK_ERRNOS:
                        raise OSError(e.errno, f"{url}: {what}: the local copy could not be written "
                                               f"(not retried): {e.strerror or e}") from e
                    raise RemoteReadError(f"{url}: {what} failed: {type(e).__name__}: {e}") from e
                if attempt == self.retries:
                    raise RemoteReadError(
                        f"{url}: {what} failed {attempt + 1} times over {time.monotonic() - t0:.1f} s "
                        f"(retries={self.retries}); last error: {type(e).__name__}: {e}") from e
                wait = min(self.backoff * 2 ** attempt, self.max_backoff)
                time.sleep(wait * (0.5 + random.random() / 2))


IO_FIELDS = ("bytes_fetched", "requests", "request_s", "cache_hits", "cache_misses")


class LocalStore:
    """A dataset directory on the local file system. Shards are memory-mapped copy-on-write
    (``MAP_PRIVATE``): arrays over them are writable, writes never reach the file."""

    is_local = True

    def __init__(self, root):
        self.root = root
        self._maps = {}

    def __getstate__(self):
        return {"root": self.root}

    def __setstate__(self, state):
        self.root = state["root"]
        self._maps = {}

    def url(self, name):
        return os.path.join(self.root, name)

    def io_counters(self):
        """This process's remote reads (``IO_FIELDS``): none for a local directory."""
        return dict.fromkeys(IO_FIELDS, 0)

    def exists(self, name):
        return os.path.exists(self.url(name))

    def isdir(self, name):
        return os.path.isdir(self.url(name))

    def size(self, name):
        return os.stat(self.url(name)).st_size

    def sizes(self, names):
        """``{name: bytes}`` of the files ``names`` that exist (a missing one is left out)."""
        out = {}
        for n in names:
            try:
                out[n] = self.size(n)
            except FileNotFoundError:
                pass
        return out

    def log_entries(self, log_dir):
        """``(file name, modification time in ms)`` of the entries of the dataset's own directory
        ``log_dir`` (none if absent). A ``log_dir`` that is a symbolic link is refused naming it,
        and an entry that is no regular file is listed (reading it refuses it by name):
        spec/dataset.md §5.9, the Rust rule."""
        from . import _native

        if not _native.own_dir(self.root, log_dir):  # ManifestError naming a linked one
            return []
        with os.scandir(self.url(log_dir)) as it:
            return [(e.name, int(e.stat(follow_symlinks=False).st_mtime * 1000)) for e in it
                    if not e.is_dir(follow_symlinks=False)]

    def read(self, name, start, end):
        with open(self.url(name), "rb") as f:
            f.seek(start)
            return f.read(end - start)

    def read_text(self, name):
        with open(self.url(name), "rb") as f:
            return f.read()

    def header_bytes(self, name, n, size, crc32c=None):
        """``(the first n bytes of file name, its size now)``: a shard's header read."""
        with open(self.url(name), "rb") as f:
            return f.read(n), os.fstat(f.fileno()).st_size

    def read_manifest(self, name):
        """A manifest or log entry as text, by the Rust rule of spec/dataset.md §5.9: a regular
        file (a FIFO or a device is refused at once, never read) within the size bound."""
        from . import _native

        return _native.read_manifest_file(self.url(name))

    def buffer(self, name):
        """The whole file as a private memory map (one per file and process)."""
        m = self._maps.get(name)
        if m is None:
            with open(self.url(name), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) if size else b""
            self._maps[name] = m
        return m

    def check(self, name, end):
        """Raises ``ShardError`` naming file ``name`` unless it still holds bytes ``[0, end)``
        (``end``: what its validated header says). Called before the package touches a mapped
        shard and after it copied a batch out of one: a shard truncated under the map would
        raise SIGBUS on a page that is gone, or read a cut page's tail as zeros (spec/python.md
        §4). One ``fstat`` of the map's own descriptor."""
        m = self._maps.get(name)
        if m is None or end == 0:
            return  # not mapped yet: the map is made, and checked, when it is first needed
        now = m.size() if isinstance(m, mmap.mmap) else 0
        if min(now, len(m)) < end:
            from ._errors import ShardError

            raise ShardError(f"{self.url(name)}: the file changed while being read: it is now "
                             f"{now} bytes, but its header (checked when it was opened) needs "
                             f"{end}; a shard must not be modified while it is read")

    def array(self, name, start, end, dtype, shape, view=False):
        """A zero-copy view of bytes ``[start, end)`` of file ``name``, after checking the file
        still holds them (:meth:`check`). (``view``: see :meth:`FsspecStore.array`.)"""
        buf = self.buffer(name)
        self.check(name, end)
        count = (end - start) // np.dtype(dtype).itemsize
        return np.frombuffer(buf, dtype=dtype, count=count, offset=start).reshape(shape)

    def parquet_source(self, name):
        """An index part's path, once the Rust rule has opened it as a regular file (a FIFO
        would block pyarrow, a device would be read without end; spec/dataset.md §5.9)."""
        from . import _native

        _native.check_regular_file(self.url(name))
        return self.url(name), None


class FsspecStore:
    """A dataset directory behind an fsspec file system (tested: ``s3://`` through s3fs and
    ``memory://``): only byte ranges are read, never whole shards."""

    is_local = False

    def __init__(self, fs, root, retry=None):
        self._fs = fs
        self._pid = os.getpid()
        self.root = root.rstrip("/")
        self.retry = retry or RetryPolicy()
        self._reset_counts()
        self.prefetcher = None  # a _prefetch.Prefetcher of column ranges (this process)

    def __getstate__(self):
        # the file system pickles as its class and arguments (fsspec's own ``__reduce__``); the
        # count starts again in the process that unpickles (spec/python.md: bytes fetched)
        return {"fs": self._fs, "root": self.root, "retry": self.retry}

    def __setstate__(self, state):
        self._fs = state["fs"]
        self._pid = os.getpid()
        self.root = state["root"]
        self.retry = state.get("retry") or RetryPolicy()
        self._reset_counts()
        self.prefetcher = None

    @property
    def cache_key(self):
        """Names this dataset in the node cache (``cache_dir``)."""
        return f"{self.fs.protocol}:{self.root}"

    def _reset_counts(self):
        self.bytes_fetched = self.requests = 0
        self.request_s = 0.0
        self._count_lock = threading.Lock()  # (a forked copy: the parent's may have been held at the fork)

    def _count(self, n, since):
        """A GET answered with ``n`` bytes, sent at ``time.perf_counter()`` ``since``."""
        seconds = time.perf_counter() - since
        self.fs  # a forked copy resets its count first
        with self._count_lock:
            self.bytes_fetched += n
            self.requests += 1
            self.request_s += seconds

    def io_counters(self):
        """This process's GETs: ``bytes_fetched``, ``requests``, ``request_s`` (their summed
        latency, first byte to last); no cache here."""
        self.fs
        return {"bytes_fetched": self.bytes_fetched, "requests": self.requests, "request_s": self.request_s,
                "cache_hits": 0, "cache_misses": 0}

    @property
    def fs(self):
        """This process's file system. A forked worker inherits the parent's instance, whose
        event loop and connections belong to the parent (s3fs refuses it: "This class is not
        fork-safe"); the first use in another process builds a new instance from the same class
        and arguments, as fsspec does when it unpickles one (its instance cache is per process).
        The count of bytes fetched starts again with it."""
        if self._pid != os.getpid():
            old = self._fs
            self._fs = type(old)(*old.storage_args, **old.storage_options)
            self._pid = os.getpid()
            self._reset_counts()
        return self._fs

    def url(self, name):
        return f"{self.root}/{name}"

    def exists(self, name):
        return self.retry.call(lambda: self.fs.exists(self.url(name)), self.url(name), "exists")

    def isdir(self, name):
        return self.retry.call(lambda: self.fs.isdir(self.url(name)), self.url(name), "isdir")

    def size(self, name):
        return int(self.retry.call(lambda: self.fs.size(self.url(name)), self.url(name), "size"))

    def sizes(self, names):
        """``{name: bytes}`` of the files ``names`` that exist, from one listing of each directory
        they are in (an object store lists 1,000 keys a request) instead of a request per file;
        a name the listing does not show is asked for on its own (a missing one is left out)."""
        by_dir = {}
        for n in names:
            d, _, base = n.rpartition("/")
            by_dir.setdefault(d, []).append((n, base))
        out = {}
        for d, members in by_dir.items():
            url = self.url(d) if d else self.root
            try:
                listed = self.retry.call(lambda: self.fs.ls(url, detail=True, refresh=True), url, "listing")
            except FileNotFoundError:
                listed = []
            found = {e["name"].rstrip("/").rsplit("/", 1)[-1]: e.get("size") for e in listed
                     if e.get("type") != "directory"}
            for n, base in members:
                size = found.get(base)
                if size is None:
                    try:
                        size = self.size(n)
                    except FileNotFoundError:
                        continue
                out[n] = int(size)
        return out

    def log_entries(self, log_dir):
        """``(file name, modification time in ms)`` of the files in ``log_dir`` (none if absent)."""
        try:
            listed = self.retry.call(lambda: self.fs.ls(self.url(log_dir), detail=True), self.url(log_dir),
                                     "listing")
        except FileNotFoundError:
            return []
        out = []
        for e in listed:
            if e.get("type") == "directory":
                continue
            t = e.get("mtime") or e.get("LastModified") or e.get("created") or 0
            if hasattr(t, "timestamp"):
                t = t.timestamp()
            out.append((e["name"].rstrip("/").rsplit("/", 1)[-1], int(float(t) * 1000)))
        return out

    def read(self, name, start, end, view=False):
        """Bytes ``[start, end)`` of object ``name``: from the read-ahead when it holds them (a
        copy, or with ``view`` a read-only ``memoryview`` of its buffer), else one range GET."""
        if end <= start:
            return b""
        p = self.prefetcher
        if p is not None and p.pid == os.getpid() and threading.current_thread().name != PREFETCH_THREAD:
            ranges = p.want(name)
            for s0, e0, data in ranges or ():
                if s0 <= start and end <= e0:
                    if view:
                        return memoryview(data).toreadonly()[start - s0: end - s0]
                    return data[start - s0: end - s0]
        return self.read_range(name, start, end)

    def read_range(self, name, start, end):
        """One range GET of bytes ``[start, end)`` (retried by the policy; a short answer is
        retried as a cut-short transfer)."""
        url = self.url(name)

        def get():
            t0 = time.perf_counter()
            data = self.fs.cat_file(url, start=start, end=end)
            self._count(len(data), t0)
            if len(data) != end - start:
                raise _ShortRead(f"asked for bytes [{start}, {end}), got {len(data)}")
            return data

        return self.retry.call(get, url, f"GET bytes [{start}, {end})")

    def read_text(self, name):
        url = self.url(name)

        def get():
            t0 = time.perf_counter()
            data = self.fs.cat_file(url)
            self._count(len(data), t0)
            return data

        return self.retry.call(get, url, "GET")

    def header_bytes(self, name, n, size, crc32c=None):
        """``(the first n bytes of object name, its size)`` (a HEAD, then a range GET unless the
        size is not the manifest's ``size``: ``(b"", size)``). A missing object raises
        :class:`FileNotFoundError`."""
        got = self.size(name)
        if got != size:
            return b"", got
        # never through the read-ahead: its fetch of this shard waits for this header
        return self.read_range(name, 0, n), got

    def read_manifest(self, name):
        """A manifest or log entry as text (one GET; an object store has no special files)."""
        data = bytes(self.read_text(name))
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise OSError(f"{self.url(name)}: not UTF-8 ({e})") from None

    def download(self, name, local, writeback=False):
        """The whole object into file ``local`` (retried; a failed attempt's file is removed);
        returns the bytes written. ``writeback`` (the native client's: the disk writes start as
        the bytes come) is ignored here."""
        url = self.url(name)

        def get():
            t0 = time.perf_counter()
            try:
                self.fs.get_file(url, local)
            except BaseException:
                if os.path.exists(local):
                    os.unlink(local)
                raise
            n = os.stat(local).st_size
            self._count(n, t0)
            return n

        return self.retry.call(get, url, "GET (whole object)")

    def array(self, name, start, end, dtype, shape, view=False):
        """Bytes ``[start, end)`` read into a fresh writable array; with ``view`` a read-only
        array that may share the read-ahead's buffer (no copy: for a caller that only copies out
        of it, as a batch's gather does; spec/performance.md §13.7)."""
        data = self.read(name, start, end, view=True) if view else bytearray(self.read(name, start, end))
        return self._frombuffer(name, data, start, end, dtype, shape)

    def _frombuffer(self, name, data, start, end, dtype, shape):
        if len(data) != end - start:
            raise OSError(f"{self.url(name)}: asked for bytes [{start}, {end}), got {len(data)}")
        count = (end - start) // np.dtype(dtype).itemsize
        return np.frombuffer(data, dtype=dtype, count=count).reshape(shape)

    def parquet_source(self, name):
        return self.url(name), self.fs


class NativeStore(FsspecStore):
    """A dataset directory in an S3 bucket (or an S3-compatible endpoint's) read through the
    extension's own client (``_native.ObjectStoreClient``, the Arrow project's ``object_store``
    crate on a tokio runtime): the GIL is released while a request runs and the bytes never pass
    through Python code. Same reads, counts, retries and errors as :class:`FsspecStore`, whose
    methods it keeps for what it does not override."""

    #: fsspec's name of the scheme, in the node cache's key: a cache filled through fsspec is
    #: the same cache read through this client
    _CACHE_PROTOCOL = ("s3", "s3a")

    def __init__(self, scheme, bucket, prefix, options, storage_options, retry=None):
        self.scheme, self.bucket, self.prefix = scheme, bucket, prefix.strip("/")
        self._options = options  # [(object_store key, value)]
        self._storage_options = storage_options  # fsspec's, for pyarrow (KV index parts)
        self._client = None
        self._stale = []  # clients made before a fork: kept, never used nor freed here
        self._pid = os.getpid()
        self.root = f"{bucket}/{self.prefix}" if self.prefix else bucket
        self.retry = retry or RetryPolicy()
        self._reset_counts()
        self.prefetcher = None

    def __getstate__(self):
        return {"scheme": self.scheme, "bucket": self.bucket, "prefix": self.prefix, "options": self._options,
                "storage_options": self._storage_options, "retry": self.retry}

    def __setstate__(self, state):
        self.__init__(state["scheme"], state["bucket"], state["prefix"], state["options"],
                      state["storage_options"], state["retry"])

    @property
    def cache_key(self):
        return f"{self._CACHE_PROTOCOL}:{self.root}"

    @property
    def fs(self):
        """This process's client (a forked worker makes its own; the count starts again)."""
        if self._client is None or self._pid != os.getpid():
            from . import _native

            if self._client is not None:
                self._stale.append(self._client)
                self._reset_counts()
            self._client = _native.ObjectStoreClient(self.scheme, self.bucket, self._options)
            self._pid = os.getpid()
        return self._client

    def key(self, name):
        return f"{self.prefix}/{name}" if self.prefix else name

    def url(self, name):
        return f"{self.scheme}://{self.root}/{name}"

    def exists(self, name):
        return self._head_or_none(name) is not None or self.isdir(name)

    def _head_or_none(self, name):
        try:
            return self.size(name)
        except FileNotFoundError:
            return None

    def isdir(self, name):
        files, dirs = self._list(name)
        return bool(files or dirs)

    def _list(self, name):
        url = self.url(name)
        return self.retry.call(lambda: self.fs.list(self.key(name)), url, "listing")

    def size(self, name):
        return int(self.retry.call(lambda: self.fs.head(self.key(name)), self.url(name), "size"))

    def sizes(self, names):
        by_dir = {}
        for n in names:
            d, _, base = n.rpartition("/")
            by_dir.setdefault(d, []).append((n, base))
        out = {}
        for d, members in by_dir.items():
            found = {f: size for f, size, _ in (self._list(d)[0] if d else self._list_root())}
            for n, base in members:
                size = found.get(base)
                if size is None:
                    size = self._head_or_none(n)
                if size is not None:
                    out[n] = int(size)
        return out

    def _list_root(self):
        url = f"{self.scheme}://{self.root}"
        return self.retry.call(lambda: self.fs.list(self.prefix), url, "listing")[0]

    def log_entries(self, log_dir):
        return [(f, mtime) for f, _, mtime in self._list(log_dir)[0]]

    def read_range(self, name, start, end):
        url = self.url(name)

        def get():
            t0 = time.perf_counter()
            data, _ = self.fs.get_range(self.key(name), start, end)
            self._count(len(data), t0)
            if len(data) != end - start:
                raise _ShortRead(f"asked for bytes [{start}, {end}), got {len(data)}")
            return data

        return self.retry.call(get, url, f"GET bytes [{start}, {end})")

    def header_bytes(self, name, n, size, crc32c=None):
        """``(the first n bytes of object name, its size)`` from one range GET (the size is the
        answer's ``Content-Range``)."""
        url = self.url(name)

        def get():
            t0 = time.perf_counter()
            data, got = self.fs.get_range(self.key(name), 0, n)
            self._count(len(data), t0)
            if got == size and len(data) != n:
                raise _ShortRead(f"asked for bytes [0, {n}), got {len(data)}")
            return data, got

        return self.retry.call(get, url, f"GET bytes [0, {n})")

    def read_text(self, name):
        url = self.url(name)

        def get():
            t0 = time.perf_counter()
            data = self.fs.get(self.key(name))
            self._count(len(data), t0)
            return data

        return self.retry.call(get, url, "GET")

    def download(self, name, local, writeback=False):
        url = self.url(name)

        def get():
            t0 = time.perf_counter()
            try:
                n = self.fs.download(self.key(name), local, writeback)
            except BaseException:
                if os.path.exists(local):
                    os.unlink(local)
                raise
            self._count(n, t0)
            return n

        return self.retry.call(get, url, "GET (whole object)")

    def array(self, name, start, end, dtype, shape, view=False):
        """Bytes ``[start, end)`` read into a fresh writable array (the ``bytearray`` the client
        filled: no copy in Python); ``view``: as :meth:`FsspecStore.array`."""
        data = self.read(name, start, end, view)
        if not view and not isinstance(data, bytearray):
            data = bytearray(data)
        return self._frombuffer(name, data, start, end, dtype, shape)

    def parquet_source(self, name):
        """A KV index part for pyarrow: read whole (one GET; a part indexes one shard)."""
        import pyarrow as pa

        return pa.BufferReader(bytes(self.read_text(name))), None


# fsspec's S3 options (s3fs) the native client understands, as object_store's keys; any other
# keeps a dataset on fsspec under client="auto" and is refused by name under client="native"
_S3_TOP = {"key": "access_key_id", "aws_access_key_id": "access_key_id", "secret": "secret_access_key",
           "aws_secret_access_key": "secret_access_key", "token": "token", "aws_session_token": "token",
           "endpoint_url": "endpoint", "region": "region", "region_name": "region"}
_S3_CLIENT_KWARGS = {"endpoint_url": "endpoint", "region_name": "region", "aws_access_key_id": "access_key_id",
                     "aws_secret_access_key": "secret_access_key", "aws_session_token": "token"}
_S3_CONFIG_KWARGS = {"connect_timeout": "connect_timeout", "read_timeout": "read_timeout"}
#: what the native client waits by default: connect 10 s, 60 s without a byte (botocore's
#: defaults); no bound on a whole transfer (a large shard on a slow link takes what it takes)
_NATIVE_DEFAULTS = {"connect_timeout": "10s", "read_timeout": "60s", "timeout": "86400s"}


def native_options(storage_options):
    """``(object_store options, None)`` for fsspec ``storage_options``, or ``(None, the first
    option the native client does not understand)``."""
    out = dict(_NATIVE_DEFAULTS)

    def seconds(v):
        return f"{int(round(float(v) * 1000))}ms"

    for k, v in (storage_options or {}).items():
        if k in _S3_TOP:
            out[_S3_TOP[k]] = str(v)
        elif k == "anon":
            if v:
                out["skip_signature"] = "true"
        elif k == "client_kwargs" and isinstance(v, dict):
            for ck, cv in v.items():
                if ck not in _S3_CLIENT_KWARGS:
                    return None, f"client_kwargs.{ck}"
                out[_S3_CLIENT_KWARGS[ck]] = str(cv)
        elif k == "config_kwargs" and isinstance(v, dict):
            for ck, cv in v.items():
                if ck == "retries":  # retries are the package's (retries=): the client tries once
                    continue
                if ck not in _S3_CONFIG_KWARGS:
                    return None, f"config_kwargs.{ck}"
                out[_S3_CONFIG_KWARGS[ck]] = seconds(cv)
        else:
            return None, k
    if out.get("endpoint", "").startswith("http://"):
        out["allow_http"] = "true"
    return sorted(out.items()), None


class CachedStore(LocalStore):
    """Whole shards of a remote dataset copied once into ``cache_dir``, then memory-mapped; the
    manifest and the index are still read from the remote store."""

    def __init__(self, remote, cache_dir, cache_limit=None, refetches=2, spool=False):
        from ._node_cache import NodeCache

        digest = hashlib.sha256(remote.cache_key.encode()).hexdigest()[:16]
        super().__init__(os.path.join(os.fspath(cache_dir), digest))
        self.remote = remote
        self.node = NodeCache(cache_dir, digest, cache_limit, refetches, spool)
        self.prefetcher = None  # a _prefetch.Prefetcher of whole shards into the node cache
        self._pid = os.getpid()
        self.cache_hits = self.cache_misses = 0
        self._wanted = {}  # name -> (size, crc32c) of its last fetch (a copy evicted before its map is fetched again)

    def __getstate__(self):
        return {"root": self.root, "remote": self.remote, "node": self.node}

    def __setstate__(self, state):
        super().__setstate__(state)
        self.remote = state["remote"]
        self.node = state["node"]
        self.prefetcher = None
        self._pid = os.getpid()
        self.cache_hits = self.cache_misses = 0
        self._wanted = {}

    def buffer(self, name):
        for attempt in range(3):
            try:
                m = super().buffer(name)
                break
            except FileNotFoundError:
                # evicted by another process between its fetch and this map (a copy is only
                # ever removed whole): fetched again, as its last fetch asked for it
                if attempt == 2 or name not in self._wanted:
                    raise
                self.fetch_now(name, *self._wanted[name])
        # keep the maps of the last few shards only: a copy evicted from the cache frees its
        # disk once no process maps it (arrays still using a map keep it alive)
        keep = 2 + (self.prefetcher.depth if self.prefetcher is not None else 0)
        while len(self._maps) > keep:
            self._maps.pop(next(iter(self._maps)))
        return m

    def exists(self, name):
        return self.remote.exists(name)

    def isdir(self, name):
        return self.remote.isdir(name)

    def size(self, name):
        return self.remote.size(name)

    def sizes(self, names):
        return self.remote.sizes(names)

    def read(self, name, start, end):
        return self.remote.read(name, start, end)

    def read_text(self, name):
        return self.remote.read_text(name)

    def read_manifest(self, name):
        return self.remote.read_manifest(name)

    def log_entries(self, log_dir):
        return self.remote.log_entries(log_dir)

    def header_bytes(self, name, n, size, crc32c=None):
        """A shard's header, from its copy in the node cache (fetched now, or by the read-ahead,
        whole: its size, and ``crc32c`` when given, checked as it enters the cache): the header
        costs no request of its own. Returns ``(8-byte prefix + the whole header, size)``."""
        self.fetch(name, size, crc32c)
        try:
            f = open(super().url(name), "rb")
        except FileNotFoundError:  # evicted meanwhile by another process: fetched again
            self.fetch_now(name, size, crc32c)
            f = open(super().url(name), "rb")
        with f:
            prefix = f.read(8)
            n = 8 + int.from_bytes(prefix, "little") if len(prefix) == 8 else 0
            return prefix + f.read(max(0, min(n, size) - 8)), size

    def fetch(self, name, size, crc32c=None):
        """Makes sure a complete copy of shard ``name`` (``size`` bytes; CRC-32C ``crc32c`` when
        given) is in the node cache: waits for the prefetch of it when one is planned, else
        fetches it now (:meth:`NodeCache.get`)."""
        self._own_counts()
        self._wanted[name] = (size, crc32c)
        if name in self._maps:
            if os.path.exists(super().url(name)):
                self.cache_hits += 1
                return
            self._maps.pop(name)  # evicted (the map stays valid for arrays still using it)
        p = self.prefetcher
        if p is not None and p.pid == os.getpid() and p.want(name) is not None:
            return
        self.fetch_now(name, size, crc32c)

    def fetch_now(self, name, size, crc32c=None):
        self._own_counts()
        # a copy the node cache will fsync is written back to disk as it comes (not for the spool)
        writeback = not self.node.spool
        _, fetched = self.node.get(name, size, crc32c,
                                   lambda tmp: self.remote.download(name, tmp, writeback=writeback),
                                   self.remote.url(name))
        if fetched:
            self.cache_misses += 1  # (+= from the read-ahead thread too: a lost count, never a wrong byte)
        else:
            self.cache_hits += 1

    def _own_counts(self):
        if self._pid != os.getpid():  # a forked copy counts its own from zero
            self._pid, self.cache_hits, self.cache_misses = os.getpid(), 0, 0

    def io_counters(self):
        """This process's GETs (the remote store's) and node-cache hits (a shard found complete in
        the cache, fetched by any process) and misses (downloaded by this process)."""
        self._own_counts()
        out = self.remote.io_counters()
        out.update(cache_hits=self.cache_hits, cache_misses=self.cache_misses)
        return out

    def parquet_source(self, name):
        return self.remote.parquet_source(name)


CLIENTS = ("auto", "native", "fsspec")


def open_store(path, storage_options=None, cache_dir=None, cache_limit=None, retries=5, client="auto"):
    """A store for a dataset path or URL. ``client`` chooses how a remote dataset is read:
    ``"native"`` the extension's client (``s3://``/``s3a://``; an option or scheme it cannot
    serve is a ``ValueError`` naming it), ``"fsspec"`` fsspec, ``"auto"`` (default) the native
    client where it can serve the URL and every storage option, else fsspec."""
    if client not in CLIENTS:
        raise ValueError(f"client must be one of {', '.join(CLIENTS)}, got {client!r}")
    path = os.fspath(path)
    if "://" not in path and not storage_options:
        return LocalStore(os.path.abspath(path))
    scheme, _, rest = path.partition("://")
    store = None
    if client != "fsspec" and scheme in ("s3", "s3a") and rest:
        options, unknown = native_options(storage_options)
        if options is None and client == "native":
            raise ValueError(f"client='native': storage option '{unknown}' is not one the native client "
                             f"understands (key, secret, token, anon, endpoint_url, region, client_kwargs "
                             f"endpoint_url/region_name, config_kwargs connect_timeout/read_timeout); "
                             f"use client='fsspec'")
        if options is not None:
            bucket, _, prefix = rest.partition("/")
            store = NativeStore("s3", bucket, prefix, options, storage_options, RetryPolicy(retries))
    elif client == "native":
        raise ValueError(f"client='native' reads s3:// URLs; {path} is read through fsspec (client='fsspec' or 'auto')")
    if store is None:
        import fsspec
        from fsspec.implementations.local import LocalFileSystem

        fs, root = fsspec.core.url_to_fs(path, **(storage_options or {}))
        if isinstance(fs, LocalFileSystem):
            if client == "native":
                raise ValueError(f"client='native' reads s3:// URLs; {path} is a local path")
            return LocalStore(os.path.abspath(root))
        store = FsspecStore(fs, root, RetryPolicy(retries))
    return CachedStore(store, cache_dir, cache_limit, refetches=min(retries, 2)) if cache_dir is not None else store
