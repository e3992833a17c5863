"""Where the bytes come from: local files (memory-mapped), fsspec range reads, or a local cache.

A *store* is rooted at the dataset directory and knows only plain file names in it (the caller has
checked them with the Rust trust rule). No thread, pool or open file survives pickling: a store
pickles as its URL pieces and reopens files lazily in the process that uses it.
"""

import hashlib
import mmap
import os

import numpy as np

HEADER_READ_AHEAD = 64 * 1024


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

    def exists(self, name):
        return os.path.exists(self.url(name))

    def isdir(self, name):
        return os.path.isdir(self.url(name))

    def size(self, name):
        return os.stat(self.url(name)).st_size

    def log_entries(self, log_dir):
        """``(file name, modification time in ms)`` of the files in ``log_dir`` (none if absent)."""
        try:
            with os.scandir(self.url(log_dir)) as it:
                return [(e.name, int(e.stat().st_mtime * 1000)) for e in it if e.is_file()]
        except FileNotFoundError:
            return []

    def read(self, name, start, end):
        with open(self.url(name), "rb") as f:
            f.seek(start)
            return f.read(end - start)

    def read_text(self, name):
        with open(self.url(name), "rb") as f:
            return f.read()

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

    def array(self, name, start, end, dtype, shape):
        """A zero-copy view of bytes ``[start, end)`` of file ``name``, after checking the file
        still holds them (:meth:`check`)."""
        buf = self.buffer(name)
        self.check(name, end)
        count = (end - start) // np.dtype(dtype).itemsize
        return np.frombuffer(buf, dtype=dtype, count=count, offset=start).reshape(shape)

    def parquet_source(self, name):
        return self.url(name), None


class FsspecStore:
    """A dataset directory behind an fsspec file system (tested: ``s3://`` through s3fs and
    ``memory://``): only byte ranges are read, never whole shards."""

    is_local = False

    def __init__(self, fs, root):
        self._fs = fs
        self._pid = os.getpid()
        self.root = root.rstrip("/")
        self.bytes_fetched = 0

    def __getstate__(self):
        # the file system pickles as its class and arguments (fsspec's own ``__reduce__``); the
        # count starts again in the process that unpickles (spec/python.md: bytes fetched)
        return {"fs": self._fs, "root": self.root}

    def __setstate__(self, state):
        self._fs = state["fs"]
        self._pid = os.getpid()
        self.root = state["root"]
        self.bytes_fetched = 0

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
            self.bytes_fetched = 0
        return self._fs

    def url(self, name):
        return f"{self.root}/{name}"

    def exists(self, name):
        return self.fs.exists(self.url(name))

    def isdir(self, name):
        return self.fs.isdir(self.url(name))

    def size(self, name):
        return int(self.fs.size(self.url(name)))

    def log_entries(self, log_dir):
        """``(file name, modification time in ms)`` of the files in ``log_dir`` (none if absent)."""
        try:
            listed = self.fs.ls(self.url(log_dir), detail=True)
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

    def read(self, name, start, end):
        if end <= start:
            return b""
        data = self.fs.cat_file(self.url(name), start=start, end=end)
        self.bytes_fetched += len(data)
        return data

    def read_text(self, name):
        data = self.fs.cat_file(self.url(name))
        self.bytes_fetched += len(data)
        return data

    def array(self, name, start, end, dtype, shape):
        """Bytes ``[start, end)`` read into a fresh writable array."""
        data = bytearray(self.read(name, start, end))
        if len(data) != end - start:
            raise OSError(f"{self.url(name)}: asked for bytes [{start}, {end}), got {len(data)}")
        count = (end - start) // np.dtype(dtype).itemsize
        return np.frombuffer(data, dtype=dtype, count=count).reshape(shape)

    def parquet_source(self, name):
        return self.url(name), self.fs


class CachedStore(LocalStore):
    """Whole shards of a remote dataset copied once into ``cache_dir``, then memory-mapped; the
    manifest and the index are still read from the remote store."""

    def __init__(self, remote, cache_dir):
        digest = hashlib.sha256(f"{remote.fs.protocol}:{remote.root}".encode()).hexdigest()[:16]
        super().__init__(os.path.join(os.fspath(cache_dir), digest))
        self.remote = remote

    def __getstate__(self):
        return {"root": self.root, "remote": self.remote}

    def __setstate__(self, state):
        super().__setstate__(state)
        self.remote = state["remote"]

    def exists(self, name):
        return self.remote.exists(name)

    def isdir(self, name):
        return self.remote.isdir(name)

    def size(self, name):
        return self.remote.size(name)

    def read(self, name, start, end):
        return self.remote.read(name, start, end)

    def read_text(self, name):
        return self.remote.read_text(name)

    def log_entries(self, log_dir):
        return self.remote.log_entries(log_dir)

    def fetch(self, name, size):
        """Copies shard ``name`` (``size`` bytes) into the cache unless it is there already."""
        local = super().url(name)
        if os.path.exists(local) and os.stat(local).st_size == size:
            return
        os.makedirs(self.root, exist_ok=True)
        tmp = f"{local}.{os.getpid()}.tmp"
        self.remote.fs.get_file(self.remote.url(name), tmp)
        got = os.stat(tmp).st_size
        self.remote.bytes_fetched += got
        if got != size:
            os.unlink(tmp)
            raise OSError(f"{self.remote.url(name)}: copied {got} bytes into the cache, expected {size}")
        os.replace(tmp, local)

    def parquet_source(self, name):
        return self.remote.parquet_source(name)


def open_store(path, storage_options=None, cache_dir=None):
    """A store for a dataset path or URL."""
    path = os.fspath(path)
    if "://" not in path and not storage_options:
        return LocalStore(os.path.abspath(path))
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    fs, root = fsspec.core.url_to_fs(path, **(storage_options or {}))
    if isinstance(fs, LocalFileSystem):
        return LocalStore(os.path.abspath(root))
    store = FsspecStore(fs, root)
    return CachedStore(store, cache_dir) if cache_dir is not None else store
