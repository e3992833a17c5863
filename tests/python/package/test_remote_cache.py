"""Training straight from object storage (issue 26, spec/python.md §2.1): read-ahead in the
sampling order, the node cache shared by processes, retries and refetches. Against the real moto
S3 server on loopback (tests/python/s3_server.py); faults are injected by that server's own
middleware (`S3Server.fail_next`: 503 SlowDown, a slow answer, a body corrupted or cut short),
and a server that goes away by the TCP relay `StoppableEndpoint`. The client's own retries
(s3fs's loop, botocore's) are turned off, so the retries seen are the package's."""
import glob
import json
import multiprocessing
import os
import signal
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import handmade  # noqa: E402

from conftest import StoppableEndpoint  # noqa: E402
from safetensors_spark import ShardError, _native, open_dataset  # noqa: E402

import torch  # noqa: E402  (a requirement: a broken import fails the run, never skips it)
from safetensors_spark.torch import SafetensorsIterableDataset, loader  # noqa: E402

SHARDS, PER_SHARD = 8, 16
ALL = list(range(SHARDS * PER_SHARD))


@pytest.fixture
def no_client_retries(monkeypatch):
    import s3fs

    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)


def opts_for(s3_server, endpoint=None, timeout=2.0):
    o = s3_server.storage_options()
    o["client_kwargs"] = {**o["client_kwargs"], "endpoint_url": endpoint or s3_server.endpoint}
    o["config_kwargs"] = {"retries": {"max_attempts": 1}, "connect_timeout": timeout, "read_timeout": timeout}
    return o


@pytest.fixture
def remote(s3_server, tmp_path):
    """A fresh dataset (8 shards of 16 samples, CRC-32C in the manifest) under its own prefix, so
    a fault aimed at one test's objects never reaches another's."""
    local = str(tmp_path / "d")
    handmade.write_batch_dataset(local, [PER_SHARD] * SHARDS, batch_size=PER_SHARD)
    m = handmade.read_manifest(local)
    for s in m["shards"]:
        s["crc32c"] = _native.file_crc32c(os.path.join(local, s["shard_path"]))
    handmade.write_manifest(local, m)
    url, bucket = s3_server.upload_dataset(local, "c")
    names = [s["shard_path"] for s in m["shards"]]
    sizes = {s["shard_path"]: s["bytes"] for s in m["shards"]}
    return {"local": local, "url": url, "bucket": bucket, "names": names, "sizes": sizes}


def ids(batches):
    return [int(v) for b in batches for v in b["y"]]


def since(s3_server, mark, remote):
    """This test's requests logged since ``mark``: those on its own bucket (a request of an
    earlier test that the server answers late, e.g. after a delay fault, is logged late too)."""
    return [r for r in s3_server.requests_since(mark) if r["path"].startswith(f"/{remote['bucket']}/")]


def whole_gets(requests, names):
    """Whole-object GETs (no Range: a copy into the node cache) per shard name."""
    out = {}
    for r in requests:
        n = r["path"].rsplit("/", 1)[-1]
        if r["method"] == "GET" and r["range"] is None and n in names and r.get("status") == 200 \
                and not r.get("injected"):
            out[n] = out.get(n, 0) + 1
    return out


def answered_while_held(s3_server, mark, remote, thread, ranged):
    """While the server holds one request, waits (at most 15 s) until shards 1-3 have answered
    GETs (``ranged``: range GETs only); then releases the held request and joins ``thread``.
    Returns the shard names answered meanwhile and how many requests were held."""
    try:
        deadline = time.monotonic() + 15
        while True:
            answered = {r["path"].rsplit("/", 1)[-1] for r in since(s3_server, mark, remote)
                        if r["method"] == "GET" and (r["range"] is not None or not ranged)
                        and r.get("status") in (200, 206)}
            if set(remote["names"][1:4]) <= answered or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        held = s3_server.held()
    finally:
        s3_server.release()
        thread.join(30)
    return answered, held


def complete_bytes(root):
    """Bytes of the complete copies in a dataset's cache directory now."""
    n = 0
    for e in os.scandir(root):
        if not e.name.startswith(".") and not e.name.endswith((".lock", ".part", ".resv")):
            try:
                n += e.stat().st_size
            except FileNotFoundError:  # evicted meanwhile
                pass
    return n


def rank_process(spec):
    """One "rank": a real process (forked from this one) that opens the remote dataset through
    the node cache shared with others, says it is ready, waits for the go, reads its share of one
    shuffled epoch and writes the ids it read."""
    ds = open_dataset(spec["url"], storage_options=spec["opts"], cache_dir=spec["cache_dir"])
    open(spec["ready"], "w").close()
    while not os.path.exists(spec["go"]):
        time.sleep(0.02)
    it = SafetensorsIterableDataset(ds, batch_size=4, shuffle=True, seed=3, rank=spec["rank"],
                                    world_size=spec["world"])
    with open(spec["out"], "w") as f:
        json.dump(ids(it), f)


def start_rank(spec):
    p = multiprocessing.get_context("fork").Process(target=rank_process, args=(spec,))
    p.start()
    return p


def cache_files(cache):
    return sorted(os.path.relpath(p, cache) for p in glob.glob(os.path.join(cache, "*", "*")))


@pytest.mark.parametrize("cached", [False, True], ids=["ranges", "node-cache"])
def test_prefetch_fetches_the_next_shards_while_one_is_slow(remote, s3_server, tmp_path, cached):
    """While the first shard's GET is held by the server, the GETs of the shards the order reads
    next are already made and answered (several requests in flight, in the sampling order); the
    first batch comes as soon as its own shard does."""
    ds = open_dataset(remote["url"], storage_options=opts_for(s3_server, timeout=30),
                      cache_dir=str(tmp_path / "cache") if cached else None)  # default: prefetch=4, max_in_flight=4
    mark = s3_server.mark()
    first = remote["names"][0]
    s3_server.fail_next("GET", 1, path=f"/{remote['bucket']}/ds/{first}", hold=30)
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("b", next(iter(SafetensorsIterableDataset(ds, batch_size=4)))))
    t.start()
    answered, held = answered_while_held(s3_server, mark, remote, t, ranged=False)
    assert set(remote["names"][1:4]) <= answered, f"shards 1-3 not fetched while shard 0 was held: {answered}"
    assert held == 1 and "b" in got
    assert got["b"]["y"].tolist() == [0, 1, 2, 3]
    reqs = since(s3_server, mark, remote)
    # never beyond the window of 4 shards before the reader moved on
    assert remote["names"][5] not in {r["path"].rsplit("/", 1)[-1] for r in reqs}
    if not cached:  # range GETs of the selected columns (x and y are neighbours: one range)
        assert all(r["range"] is not None for r in reqs
                   if r["method"] == "GET" and r["path"].rsplit("/", 1)[-1] in remote["names"])


def test_the_window_reaches_past_a_shuffle_block_that_fills_it():
    """A shuffled epoch's groups each span a whole shuffle block (here 5 shards: more than
    prefetch=4): the next block's first 4 shards are fetched while this block is read (the link
    idled at every block's end when the current block counted against the 4), never a 5th, however
    many messages the block has; with a byte budget the window stops at the first shard that does
    not fit."""
    from safetensors_spark._prefetch import Prefetcher

    def run(block=3, **kw):
        fetched, lock = [], threading.Lock()

        def fetch(s):
            with lock:
                fetched.append(s)
            return s

        groups = [[0, 1, 2, 3, 4]] * block + [[5, 6, 7, 8, 9]] * block + [[10, 11]]
        p = Prefetcher(groups, fetch, 4, 2, **kw)

        def settled(n):
            deadline = time.monotonic() + 10
            while len(fetched) < n and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.1)  # and nothing more comes
            with lock:
                return sorted(fetched)
        return p, settled

    p, settled = run()
    assert settled(9) == list(range(9))  # block 0, then 4 of block 1
    assert p.want(3) == 3 and p.want(5) == 5  # the reader enters block 1: 9, 10, 11 join
    assert settled(12) == list(range(12))
    p.close()
    p, settled = run(size_of=lambda s: 10, byte_budget=70)
    assert settled(7) == list(range(7))  # 7 shards of 10 bytes fit in 70
    p.close()
    # a block of small samples is thousands of messages long: its end is found however far
    p, settled = run(block=3000)
    assert settled(9) == list(range(9))
    assert p.want(4) == 4 and p.want(0) == 0  # moving within the block keeps the window
    assert p.want(6) == 6
    assert settled(12) == list(range(12))
    p.close()
    # a run longer than the window looks (FAR groups): not materialised at the start, and the
    # reader asking for the next shard finds it however far the run went
    fetched = []
    p = Prefetcher([[0]] * (3 * Prefetcher.FAR) + [[1]] * 2 + [[2]], fetched.append, 4, 1)
    assert len(p._groups) <= Prefetcher.FAR + 1
    p.want(1)
    deadline = time.monotonic() + 10
    while 2 not in fetched and time.monotonic() < deadline:
        time.sleep(0.01)
    assert 2 in fetched  # the window moved on with the reader (it stayed on group 0 before)
    p.close()


@pytest.mark.parametrize("cached", [False, True], ids=["ranges", "node-cache"])
def test_missing_shards_fail_the_epoch_at_the_first_one_it_reads(remote, s3_server, tmp_path, cached):
    """The open reads the manifest only (tests/python/package/test_native_client.py counts it);
    shards 2 and 5 missing: the epoch reads shards 0 and 1, then fails naming shard 2, the first
    missing one in its order (the read-ahead may have asked for shard 3 meanwhile, never 5)."""
    import s3fs

    fs = s3fs.S3FileSystem(**s3_server.storage_options())
    for i in (5, 2):
        fs.rm_file(f"{remote['bucket']}/ds/{remote['names'][i]}")
    ds = open_dataset(remote["url"], storage_options=opts_for(s3_server),
                      cache_dir=str(tmp_path / "cache") if cached else None)
    got = []
    with pytest.raises(ShardError, match=f"{remote['names'][2]}: listed in .* but missing"):
        for b in SafetensorsIterableDataset(ds, batch_size=4):
            got.extend(int(v) for v in b["y"])
    assert got == ALL[:2 * PER_SHARD]


def test_two_ranks_share_the_node_cache_and_fetch_each_shard_once(remote, s3_server, tmp_path):
    """Two real processes (rank 0 and 1 of 2) read one shuffled epoch through one cache_dir at the
    same time, every GET slowed so their downloads overlap: each shard is downloaded once on the
    node (counted at the server), and together they read every sample once."""
    cache = str(tmp_path / "cache")
    procs, specs = [], []
    for r in range(2):
        spec = {"url": remote["url"], "opts": opts_for(s3_server, timeout=30), "cache_dir": cache, "rank": r,
                "world": 2, "ready": str(tmp_path / f"ready{r}"), "go": str(tmp_path / "go"),
                "out": str(tmp_path / f"out{r}.json")}
        specs.append(spec)
        procs.append(start_rank(spec))
    try:
        deadline = time.monotonic() + 60
        while not all(os.path.exists(s["ready"]) for s in specs):
            assert all(p.is_alive() for p in procs), "a rank exited before it was ready"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        mark = s3_server.mark()
        # the 8 whole-shard downloads, each answered 0.3 s late: the two ranks' downloads overlap
        s3_server.fail_next("GET", SHARDS, path=f"/{remote['bucket']}/ds/part-", delay=0.3)
        open(specs[0]["go"], "w").close()
        for p in procs:
            p.join(120)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    out = [json.load(open(s["out"])) for s in specs]
    assert sorted(out[0] + out[1]) == ALL
    assert whole_gets(since(s3_server, mark, remote), remote["names"]) == {n: 1 for n in remote["names"]}
    stats = open_dataset(remote["url"], storage_options=opts_for(s3_server), cache_dir=cache,
                         check_headers=False).cache_stats()
    assert stats["fetches"] == SHARDS and stats["fetched_bytes"] == sum(remote["sizes"].values())


def test_a_process_killed_mid_download_leaves_no_partial_entry(remote, s3_server, tmp_path):
    """A process killed while its download of a shard is cut off mid-body holds that shard's lock
    and has a partial file; after SIGKILL the next reader takes the lock, removes the partial
    file, downloads the shard again and reads correct samples; only complete copies remain."""
    cache = str(tmp_path / "cache")
    spec = {"url": remote["url"], "opts": opts_for(s3_server, timeout=30), "cache_dir": cache, "rank": 0,
            "world": 1, "ready": str(tmp_path / "ready"), "go": str(tmp_path / "go"), "out": str(tmp_path / "o")}
    p = start_rank(spec)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(spec["ready"]):
            assert p.is_alive() and time.monotonic() < deadline
            time.sleep(0.05)
        # the whole-shard GETs (4 in flight) send 100 bytes, then wait: the process is mid-download
        s3_server.fail_next("GET", 4, path=f"/{remote['bucket']}/ds/part-", truncate=100, hold=60)
        open(spec["go"], "w").close()
        # a held GET and the download's file open: the process is mid-download
        while s3_server.held() == 0 or not [f for f in cache_files(cache) if f.endswith((".part", ".tmp"))]:
            assert p.is_alive() and time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(p.pid, signal.SIGKILL)
        p.join(30)
    finally:
        if p.is_alive():
            p.kill()
        s3_server.release()  # (a cut left over is retried by the reader below)
    left = cache_files(cache)
    assert any(f.endswith((".part", ".tmp")) for f in left), f"no partial download to recover from: {left}"
    ds = open_dataset(remote["url"], storage_options=opts_for(s3_server), cache_dir=cache, verify_checksums=True)
    assert sorted(ids(SafetensorsIterableDataset(ds, batch_size=4, shuffle=True, seed=3))) == ALL
    left = cache_files(cache)
    assert not [f for f in left if f.endswith(".part") or ".tmp" in f], left
    d = os.path.dirname(os.path.join(cache, left[0]))
    for n in remote["names"]:
        assert os.path.getsize(os.path.join(d, n)) == remote["sizes"][n]


def test_cache_limit_of_a_quarter_evicts_reports_and_refetches_only_evicted(remote, s3_server, tmp_path):
    """cache_limit = 25 % of the dataset: the cache never holds more, evictions are reported with
    their bytes, and the second epoch downloads only shards that were not in the cache when it
    needed them (evicted before or during it); with no limit a second epoch downloads nothing."""
    cache = str(tmp_path / "cache")
    total = sum(remote["sizes"].values())
    limit = total // 4
    ds = open_dataset(remote["url"], storage_options=opts_for(s3_server), cache_dir=cache, cache_limit=limit)
    it = SafetensorsIterableDataset(ds, batch_size=4)
    root = None
    for epoch in range(2):
        it.set_epoch(epoch)
        before = ds.cache_stats()
        present = {f.split(os.sep)[-1] for f in cache_files(cache) if not f.endswith((".lock", ".events"))}
        mark = s3_server.mark()
        got = []
        for b in it:
            got.extend(int(v) for v in b["y"])
            root = root or os.path.dirname(ds._store.node.path("x"))
            assert complete_bytes(root) <= limit
        assert got == ALL
        after = ds.cache_stats()
        fetched = after["fetched"][len(before["fetched"]):]
        evicted = after["evicted"][len(before["evicted"]):]
        assert after["fetched_bytes"] - before["fetched_bytes"] == sum(remote["sizes"][n] for n in fetched)
        assert after["evicted_bytes"] - before["evicted_bytes"] == sum(remote["sizes"][n] for n in evicted)
        assert whole_gets(since(s3_server, mark, remote), remote["names"]) == \
            {n: fetched.count(n) for n in set(fetched)}
        assert sorted(set(fetched)) == sorted(remote["names"]) and len(evicted) >= SHARDS - 2
        if epoch == 1:
            # every download of the second epoch: a shard absent at its start, or evicted before
            there = set(present)
            for what, n in after["events"][len(before["events"]):]:
                if what == "fetched":
                    assert n not in there, f"{n} downloaded again while in the cache"
                    there.add(n)
                elif what == "evicted":
                    there.discard(n)
    # no limit: the second epoch is served by the node cache alone
    ds = open_dataset(remote["url"], storage_options=opts_for(s3_server), cache_dir=str(tmp_path / "c2"))
    it = SafetensorsIterableDataset(ds, batch_size=4, shuffle=True, seed=1)
    assert sorted(ids(it)) == ALL
    mark = s3_server.mark()
    it.set_epoch(1)
    assert sorted(ids(it)) == ALL
    assert whole_gets(since(s3_server, mark, remote), remote["names"]) == {}
    assert ds.cache_stats()["fetches"] == SHARDS and ds.cache_stats()["evictions"] == 0


@pytest.mark.parametrize("cached", [False, True], ids=["ranges", "node-cache"])
def test_throttling_timeouts_and_resets_are_retried(remote, s3_server, tmp_path, no_client_retries, cached):
    """503 SlowDown twice, an answer slower than the read timeout, and a body cut short by a
    dropped connection: retried with backoff, the epoch is exact."""
    ds = open_dataset(remote["url"], storage_options=opts_for(s3_server, timeout=1),
                      cache_dir=str(tmp_path / "cache") if cached else None)
    mark = s3_server.mark()
    n = remote["names"]
    pre = f"/{remote['bucket']}/ds/"
    s3_server.fail_next("GET", 2, status=503, path=pre + n[1])
    s3_server.fail_next("GET", 1, path=pre + n[2], delay=2.5)
    s3_server.fail_next("GET", 1, path=pre + n[3], truncate=10)
    assert ids(SafetensorsIterableDataset(ds, batch_size=4)) == ALL
    faults = [r for r in since(s3_server, mark, remote) if r.get("injected")]
    assert sum(r["status"] == 503 for r in faults) == 2 and any(r.get("truncated") for r in faults)


@pytest.mark.parametrize("mode", ["ranges", "node-cache", "spool"])
def test_loader_workers_retry_faults(remote, s3_server, tmp_path, no_client_retries, mode):
    """loader(num_workers=2) (fork), with throttling and a reset on the workers' GETs: every
    sample exactly once; the workers read ahead (ranges: one GET of both columns per shard;
    the node cache, or the loader's spool without one: whole shards)."""
    cached = mode != "ranges"
    ds = open_dataset(remote["url"], storage_options=opts_for(s3_server, timeout=1),
                      cache_dir=str(tmp_path / "c") if mode == "node-cache" else None)
    pre = f"/{remote['bucket']}/ds/"
    mark = s3_server.mark()
    s3_server.fail_next("GET", 3, status=503, path=pre + "part-")
    s3_server.fail_next("GET", 1, path=pre + remote["names"][5], truncate=10)
    it = SafetensorsIterableDataset(ds, batch_size=4, shuffle=True, seed=2)
    got = ids(loader(it, num_workers=2, multiprocessing_context=multiprocessing.get_context("fork"),
                     share_shards=None if cached else False))
    assert sorted(got) == ALL
    reqs = since(s3_server, mark, remote)
    assert len([r for r in reqs if r.get("injected")]) == 4
    if cached:  # whole shards, each fetched once (and again where the reset cut it)
        whole = [r for r in reqs if "/part-" in r["path"] and r["method"] == "GET" and not r.get("injected")]
        assert {r["response_length"] for r in whole} == set(remote["sizes"].values())
        assert sorted(r["path"] for r in whole) == sorted(pre + n for n in remote["names"])
    if not cached:  # the read-ahead's span of x and y, never a column or a row alone
        # (shard GETs only: the server may log open's GET of the manifest after the mark)
        reqs = [r for r in reqs if "/part-" in r["path"]]
        spans = {r["response_length"] for r in reqs if r["method"] == "GET" and not r.get("injected")}
        # and each shard's header, read by the worker that first uses the shard (these shards
        # are smaller than the 64 KiB read-ahead: read whole)
        headers = set(remote["sizes"].values())
        odd = [r for r in reqs if r["method"] == "GET" and not r.get("injected")
               and r["response_length"] not in {PER_SHARD * (2 * 4 + 8)} | headers]
        assert PER_SHARD * (2 * 4 + 8) in spans and not odd, (spans, odd)


def test_dead_server_fails_naming_the_object_after_bounded_retries(remote, s3_server, tmp_path, no_client_retries):
    from safetensors_spark._storage import RemoteReadError

    ep = StoppableEndpoint(s3_server)
    ep.start()
    ds = open_dataset(remote["url"], storage_options=opts_for(s3_server, endpoint=ep.endpoint, timeout=0.5),
                      cache_dir=str(tmp_path / "cache"), retries=2, prefetch=1)
    it = iter(SafetensorsIterableDataset(ds, batch_size=PER_SHARD))
    assert next(it)["y"].tolist() == list(range(PER_SHARD))
    ep.stop()
    t0 = time.monotonic()
    with pytest.raises(RemoteReadError) as e:
        for _ in it:
            pass
    msg = str(e.value)
    assert f"{remote['bucket']}/ds/part-" in msg and "failed 3 times" in msg and "retries=2" in msg, msg
    assert time.monotonic() - t0 < 60, "bounded (generous: no hang)"


def test_corrupt_object_is_fetched_again_then_fails_naming_the_shard(remote, s3_server, tmp_path):
    """verify_checksums with cache_dir: a copy whose CRC-32C differs is thrown away and fetched
    again (reported as a refetch); an object corrupt on every try fails naming the shard."""
    pre = f"/{remote['bucket']}/ds/"
    n = remote["names"]
    ds = open_dataset(remote["url"], storage_options=opts_for(s3_server), cache_dir=str(tmp_path / "c1"),
                      verify_checksums=True)
    s3_server.fail_next("GET", 1, path=pre + n[2], corrupt=True)
    assert ids(SafetensorsIterableDataset(ds, batch_size=4)) == ALL
    assert ds.cache_stats()["refetches"] == 1
    ds = open_dataset(remote["url"], storage_options=opts_for(s3_server), cache_dir=str(tmp_path / "c2"),
                      verify_checksums=True)
    s3_server.fail_next("GET", 3, path=pre + n[1], corrupt=True)
    with pytest.raises(ShardError) as e:
        ids(SafetensorsIterableDataset(ds, batch_size=4))
    assert f"{remote['bucket']}/ds/{n[1]}: fetched 3 times, never intact" in str(e.value), str(e.value)
    assert "CRC-32C" in str(e.value)
    # nothing of the bad shard stays (other shards' downloads may still be under way)
    assert not [f for f in cache_files(str(tmp_path / "c2")) if n[1] in f and not f.endswith(".lock")]


def test_eviction_is_least_recently_used_first(tmp_path):
    """Issue #39 item 14: the node cache evicts the copy used least recently, not the oldest
    fetched (spec/python.md §2.1): A and B fetched (A's copy older), A used again, then C needs
    room: B goes, A stays. Real files; the copies' times are set apart so the order does not
    depend on the clock's resolution."""
    from safetensors_spark._node_cache import NodeCache

    node = NodeCache(tmp_path / "cache", "d", limit=200)

    def writer(n):
        def download(tmp):
            with open(tmp, "wb") as f:
                f.write(b"x" * n)
            return n
        return download

    for name in ("a", "b"):
        node.get(name, 100, None, writer(100), f"mem://{name}")
    os.utime(node.path("a"), (1000, 1000))
    os.utime(node.path("b"), (2000, 2000))
    assert node.has("a", 100)  # used: now the most recent
    node.get("c", 100, None, writer(100), "mem://c")
    assert node.stats()["evicted"] == ["b"]
    assert os.path.exists(node.path("a")) and not os.path.exists(node.path("b"))


def test_an_object_deleted_mid_epoch_is_named(remote, s3_server, tmp_path):
    """Issue #39 item 9: an S3 object deleted after its header was read fails the read with
    FileNotFoundError naming the object's URL (s3fs alone says only 'The specified key does not
    exist.'), at once (not retried); one deleted before its first use (the open reads no shard)
    fails as a shard listed but missing, naming it, with and without the node cache."""
    gone = remote["names"][-1]

    def restore():
        with open(os.path.join(remote["local"], gone), "rb") as f:
            s3_server.client().put_object(Bucket=remote["bucket"], Key=f"ds/{gone}", Body=f.read())

    ds = open_dataset(remote["url"], storage_options=s3_server.storage_options(), prefetch=0)
    ds._header(ds.shards[-1])
    s3_server.client().delete_object(Bucket=remote["bucket"], Key=f"ds/{gone}")
    try:
        with pytest.raises(FileNotFoundError, match=f"{remote['bucket']}/ds/{gone}: "):
            list(ds)
    finally:
        restore()
    for cache_dir in (None, tmp_path / "cache"):
        ds = open_dataset(remote["url"], storage_options=s3_server.storage_options(), cache_dir=cache_dir,
                          prefetch=0)
        s3_server.client().delete_object(Bucket=remote["bucket"], Key=f"ds/{gone}")
        try:
            with pytest.raises(ShardError, match=f"{remote['bucket']}/ds/{gone}: listed in dataset_manifest.json "
                                                 f"but missing"):
                list(ds)
        finally:
            restore()


def test_a_local_disk_that_refuses_the_copy_is_not_retried_as_a_remote_error():
    """Issue #39 item 9: a full cache disk (ENOSPC), a file size limit (EFBIG) or a quota while
    the copy is written is raised at once as that OSError naming the object, not retried as a
    remote failure."""
    import errno

    from safetensors_spark._storage import RetryPolicy

    for code in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        calls = []

        def copy():
            calls.append(1)
            raise OSError(code, os.strerror(code))

        with pytest.raises(OSError) as e:
            RetryPolicy(retries=5, backoff=0).call(copy, "s3://b/ds/x.safetensors", "GET")
        assert len(calls) == 1 and e.value.errno == code, (calls, e.value)
        assert str(e.value).startswith(f"[Errno {code}] s3://b/ds/x.safetensors: GET: the local copy"), e.value


def test_a_short_object_is_never_kept_in_the_node_cache_without_checksums(remote, s3_server, tmp_path):
    """Issue #39 item 10: with checksums off, an object that comes back shorter than the
    manifest's ``bytes`` (replaced by a truncated copy after open) is fetched again, then fails
    naming the shard; no short copy stays in the cache for later ranks or runs."""
    name = remote["names"][3]
    with open(os.path.join(remote["local"], name), "rb") as f:
        whole = f.read()
    ds = open_dataset(remote["url"], storage_options=opts_for(s3_server), cache_dir=str(tmp_path / "c"))
    s3_server.client().put_object(Bucket=remote["bucket"], Key=f"ds/{name}", Body=whole[:-8])
    try:
        with pytest.raises(ShardError, match=rf"{remote['bucket']}/ds/{name}: fetched 3 times, never intact: "
                                             rf"{len(whole) - 8} bytes instead of {len(whole)}"):
            ids(SafetensorsIterableDataset(ds, batch_size=4))
        assert not [f for f in cache_files(str(tmp_path / "c")) if name in f and not f.endswith(".lock")]
    finally:
        s3_server.client().put_object(Bucket=remote["bucket"], Key=f"ds/{name}", Body=whole)
