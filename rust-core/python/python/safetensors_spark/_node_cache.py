"""The node-local shard cache shared by every rank and DataLoader worker on one machine
(spec/python.md §2.1, "The node cache").

Layout under ``cache_dir``::

    <digest of the dataset URL>/<shard>            a complete, checked copy (only ever renamed in)
    <digest>/<shard>.lock                          the shard's lock (flock), holding its owner's pid
    <digest>/<shard>.<pid>.<thread>.part           a download in progress
    <digest>/<shard>.<pid>.<thread>.resv           its room, reserved (holds its size)
    <digest>/.events                               one line per fetch / eviction (the stats)
    .needs/<pid>                                   the shards process <pid> will read next
    .evict.lock                                    held while a process evicts

Protocol: a process that needs shard ``s`` and finds no complete copy takes ``s.lock``
(``flock``, exclusive, blocking: a second process waits for the first one's download instead of
starting its own), looks again, removes any ``.part`` a dead owner left, makes room, downloads to
its own ``.part``, checks size (and CRC-32C when asked), ``fsync``s it and renames it to ``s``. The
kernel releases a dead process's ``flock``, so a process killed mid-download blocks nobody, and its
``.part`` is never read: only a rename makes a copy visible.
"""

import errno
import fcntl
import json
import os
import threading
import time

from ._errors import ShardError

NEEDS_DIR = ".needs"
EVICT_LOCK = ".evict.lock"
EVENTS = ".events"
_SUFFIXES = (".lock", ".part", ".resv")


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Flock:
    """An exclusive ``flock`` on ``path`` (created if missing) writing this process's pid in it."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            self.previous = os.pread(self.fd, 32, 0).decode("ascii", "replace").strip()
        except OSError:
            self.previous = ""
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)
        return self

    def __exit__(self, *exc):
        try:
            os.ftruncate(self.fd, 0)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)


class NodeCache:
    """Whole shards of one remote dataset in ``cache_dir`` (its own sub-directory), bounded by
    ``limit`` bytes over the whole ``cache_dir`` (``None``: unbounded). ``spool=True``: a
    loader's private cache (``_spool.py``): a copy is not ``fsync``ed before it is renamed in,
    and ``cache_dir`` is never made again once its owner removed it (a worker still finishing
    then fails to write there instead of leaving a directory behind)."""

    def __init__(self, cache_dir, digest, limit=None, refetches=2, spool=False):
        self.base = os.fspath(cache_dir)
        self.root = os.path.join(self.base, digest)
        self.limit = limit
        self.refetches = refetches
        self.spool = spool
        self._needs_lock = threading.Lock()
        self._needs = {}  # pid-local: the shards this process reads next (its prefetch window)

    def __getstate__(self):
        return {"base": self.base, "root": self.root, "limit": self.limit, "refetches": self.refetches,
                "spool": self.spool}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._needs_lock = threading.Lock()
        self._needs = {}

    def _make_dir(self, d):
        """Makes ``d`` (under ``cache_dir``) if missing; a spool's ``cache_dir`` itself is never
        made again (FileNotFoundError once its owner removed it)."""
        if not self.spool:
            os.makedirs(d, exist_ok=True)
            return
        try:
            os.mkdir(d)
        except FileExistsError:
            pass

    def path(self, name):
        return os.path.join(self.root, name)

    def has(self, name, size):
        """Whether a complete copy of ``name`` (``size`` bytes) is there; marks it used."""
        p = self.path(name)
        try:
            if os.stat(p).st_size != size:
                return False
            os.utime(p)  # the eviction order: least recently used first
            return True
        except FileNotFoundError:
            return False

    # -- what this process reads next (protected from eviction by every process) -------------

    def set_needs(self, names):
        """Declares the shards this process reads next (its prefetch window)."""
        with self._needs_lock:
            pid = os.getpid()
            if self._needs.get("pid") != pid:
                self._needs = {"pid": pid, "names": None}
            names = sorted(set(names))
            if names == self._needs["names"]:
                return
            self._needs["names"] = names
            d = os.path.join(self.base, NEEDS_DIR)
            self._make_dir(d)
            tmp = os.path.join(d, f".{pid}.{threading.get_ident()}.tmp")
            with open(tmp, "w") as f:
                json.dump([os.path.join(os.path.basename(self.root), n) for n in names], f)
            os.replace(tmp, os.path.join(d, str(pid)))

    def _needed_by_others(self):
        d = os.path.join(self.base, NEEDS_DIR)
        out = set()
        try:
            entries = os.listdir(d)
        except FileNotFoundError:
            return out
        me = os.getpid()
        for e in entries:
            if not e.isdigit() or int(e) == me:
                continue
            if not _alive(int(e)):
                try:
                    os.unlink(os.path.join(d, e))
                except FileNotFoundError:
                    pass
                continue
            try:
                with open(os.path.join(d, e)) as f:
                    out.update(json.load(f))
            except (OSError, ValueError):
                continue
        return out

    # -- fetching ------------------------------------------------------------------------------

    def get(self, name, size, crc32c, download, url):
        """The local path of a complete copy of shard ``name``, downloading it with
        ``download(tmp_path)`` (which returns the bytes it wrote) if no process has yet. A copy
        of another size, or (``crc32c`` given) another CRC-32C, is downloaded again up to
        ``refetches`` times, then :class:`ShardError` names ``url``. Returns ``(path, bytes
        fetched by this call)``."""
        p = self.path(name)
        if self.has(name, size):
            return p, 0
        self._make_dir(self.root)
        with _Flock(p + ".lock"):
            if self.has(name, size):  # another process fetched it while this one waited
                return p, 0
            self._remove_parts(name)  # a dead owner's partial download (only the owner writes one)
            resv = f"{p}.{os.getpid()}.{threading.get_ident()}.resv"
            if self.limit is not None:
                self._make_room(size, keep={name}, reserve=resv)
            fetched = 0
            problems = []
            try:
                for _ in range(1 + self.refetches):
                    tmp = f"{p}.{os.getpid()}.{threading.get_ident()}.part"
                    try:
                        fetched += download(tmp)
                        problem = self._check(tmp, size, crc32c)
                        if problem is None:
                            if not self.spool:
                                with open(tmp, "rb+") as f:
                                    os.fsync(f.fileno())
                            os.replace(tmp, p)
                            if not self.spool:
                                self._fsync_dir()
                            self._event("F", name, size)
                            return p, fetched
                        problems.append(problem)
                        self._event("R", name, size)
                    finally:
                        if os.path.exists(tmp):
                            os.unlink(tmp)
            finally:
                if os.path.exists(resv):
                    os.unlink(resv)  # the complete copy (or nothing) counts from now on
            raise ShardError(f"{url}: fetched {len(problems)} times, never intact: {'; '.join(problems)} "
                             f"(a corrupt or truncated object; the manifest records {size} bytes"
                             f"{'' if crc32c is None else f' and CRC-32C {crc32c}'})")

    @staticmethod
    def _check(tmp, size, crc32c):
        got = os.stat(tmp).st_size
        if got != size:
            return f"{got} bytes instead of {size}"
        if crc32c is not None:
            from . import _native

            crc = _native.file_crc32c(tmp)
            if crc != crc32c:
                return f"CRC-32C {crc} instead of {crc32c}"
        return None

    def _remove_parts(self, name):
        prefix = name + "."
        for e in os.listdir(self.root):
            if e.startswith(prefix) and e.endswith((".part", ".resv")):
                try:
                    os.unlink(os.path.join(self.root, e))
                except FileNotFoundError:
                    pass

    def _fsync_dir(self):
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- eviction ------------------------------------------------------------------------------

    def _entries(self):
        """``[(mtime, size, relative path)]`` of the complete copies under ``cache_dir`` and the
        bytes reserved by downloads in progress (a dead process's reservation is removed)."""
        out, partial = [], 0
        for d in os.listdir(self.base):
            full = os.path.join(self.base, d)
            if d.startswith(".") or not os.path.isdir(full):
                continue
            for e in os.listdir(full):
                if e.startswith("."):
                    continue
                try:
                    st = os.stat(os.path.join(full, e))
                except FileNotFoundError:
                    continue
                if e.endswith(".resv"):
                    pid = e.rsplit(".", 3)[-3]
                    if pid.isdigit() and not _alive(int(pid)):
                        try:
                            os.unlink(os.path.join(full, e))
                        except FileNotFoundError:
                            pass
                        continue
                    try:
                        with open(os.path.join(full, e)) as f:
                            partial += int(f.read().strip() or 0)
                    except (OSError, ValueError):
                        continue
                elif e.endswith(".part"):
                    continue
                elif not e.endswith(_SUFFIXES):
                    out.append((st.st_mtime, st.st_size, os.path.join(d, e)))
        return out, partial

    def _make_room(self, size, keep, reserve):
        """Evicts complete copies until ``size`` more bytes fit in ``limit``: first those no
        live process declared it reads next, least recently used first; then those only other
        processes need; never ``keep`` nor this process's own window. Runs under the eviction
        lock (one evicting process at a time)."""
        with _Flock(os.path.join(self.base, EVICT_LOCK)):
            entries, partial = self._entries()
            used = sum(s for _, s, _ in entries) + partial
            self._reserve(reserve, size)
            if used + size <= self.limit:
                return
            mine = {os.path.join(os.path.basename(self.root), n) for n in (self._needs.get("names") or ())
                    if self._needs.get("pid") == os.getpid()}
            mine |= {os.path.join(os.path.basename(self.root), n) for n in keep}
            others = self._needed_by_others()
            order = sorted((rel in others, mtime, s, rel) for mtime, s, rel in entries if rel not in mine)
            for _, _, s, rel in order:
                if used + size <= self.limit:
                    break
                d, n = os.path.split(rel)
                # a shard being (re)written holds its lock: leave it to its owner
                fd = os.open(os.path.join(self.base, rel + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except OSError as e:
                        if e.errno in (errno.EAGAIN, errno.EACCES):
                            continue
                        raise
                    try:
                        os.unlink(os.path.join(self.base, rel))
                    except FileNotFoundError:
                        continue
                    finally:
                        fcntl.flock(fd, fcntl.LOCK_UN)
                finally:
                    os.close(fd)
                used -= s
                with open(os.path.join(self.base, d, EVENTS), "a") as f:
                    f.write(f"E {os.getpid()} {s} {n}\n")

    @staticmethod
    def _reserve(path, size):
        with open(path, "w") as f:
            f.write(str(size))

    # -- what was fetched ----------------------------------------------------------------------

    def _event(self, kind, name, size):
        # one short O_APPEND write per event: lines of several processes never interleave
        with open(os.path.join(self.root, EVENTS), "a") as f:
            f.write(f"{kind} {os.getpid()} {size} {name}\n")

    def stats(self):
        """This dataset's cache events on this node, all processes together: ``fetches`` /
        ``fetched_bytes`` (complete shards downloaded into the cache), ``refetches`` (downloads
        thrown away: wrong size or CRC-32C), ``evictions`` / ``evicted_bytes``, ``cached_bytes``
        (complete copies there now), the names ``fetched`` / ``evicted`` in event order, and
        ``events``: ``(what, shard)`` in the order they happened."""
        out = {"fetches": 0, "fetched_bytes": 0, "refetches": 0, "evictions": 0, "evicted_bytes": 0,
               "fetched": [], "evicted": [], "events": []}
        try:
            with open(os.path.join(self.root, EVENTS)) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            parts = line.split(" ", 3)
            if len(parts) != 4:
                continue
            kind, _, size, name = parts
            out["events"].append(({"F": "fetched", "E": "evicted", "R": "refetched"}.get(kind, kind), name))
            if kind == "F":
                out["fetches"] += 1
                out["fetched_bytes"] += int(size)
                out["fetched"].append(name)
            elif kind == "E":
                out["evictions"] += 1
                out["evicted_bytes"] += int(size)
                out["evicted"].append(name)
            elif kind == "R":
                out["refetches"] += 1
        cached = 0
        if os.path.isdir(self.root):
            for e in os.listdir(self.root):
                if not e.startswith(".") and not e.endswith(_SUFFIXES):
                    cached += os.stat(os.path.join(self.root, e)).st_size
        out["cached_bytes"] = cached
        out["at"] = time.time()
        return out
