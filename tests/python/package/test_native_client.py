"""The native object-store client (spec/python.md §2.1, issue 38 item 4) and the open that reads
one object (item 3), against the real moto S3 server on loopback (tests/python/s3_server.py,
which logs every request it answers): reads, range reads, listings and whole-object downloads
through ``_native.ObjectStoreClient``; its errors naming the URL (404, 403, a timeout, a refused
connection); the ``client`` option and the fsspec fallback; the requests an open makes at two
dataset sizes; each shard's header checked against the manifest when the shard is first used,
and shards never used never read."""
import json
import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import handmade  # noqa: E402

from conftest import free_port  # noqa: E402
from safetensors_spark import ShardError, open_dataset  # noqa: E402
from safetensors_spark._storage import (  # noqa: E402
    HEADER_READ_AHEAD,
    CachedStore,
    FsspecStore,
    NativeStore,
    RemoteReadError,
    open_store,
)

import torch  # noqa: E402,F401  (a requirement: a broken import fails the run, never skips it)
from safetensors_spark.torch import SafetensorsIterableDataset  # noqa: E402


def upload(s3_server, shards, prefix, edit=None):
    """A batch dataset of ``shards`` shards (4 samples each) uploaded to a new bucket; ``edit``
    changes its manifest first. Returns ``(url, bucket, local dir, shard names)``."""
    import tempfile

    local = os.path.join(tempfile.mkdtemp(prefix="native-"), "d")
    handmade.write_batch_dataset(local, [4] * shards, batch_size=4)
    m = handmade.read_manifest(local)
    if edit is not None:
        edit(m)
        handmade.write_manifest(local, m)
    url, bucket = s3_server.upload_dataset(local, prefix)
    return url, bucket, local, [s["shard_path"] for s in m["shards"]]


def on_bucket(s3_server, mark, bucket):
    """The reads of ``bucket`` logged since ``mark`` (the server logs a request when it has
    answered it: an upload's last PUT may come after a mark, and is left out)."""
    return [r for r in s3_server.requests_since(mark) if r["path"].startswith(f"/{bucket}/")
            and r["method"] != "PUT"]


@pytest.fixture(scope="module")
def small(s3_server):
    return upload(s3_server, 3, "nat")


# -- the client ----------------------------------------------------------------------------------

def test_native_store_reads_ranges_objects_listings_and_downloads(s3_server, small, tmp_path):
    url, bucket, local, names = small
    store = open_store(url, s3_server.storage_options())
    assert type(store) is NativeStore
    raw = open(os.path.join(local, names[1]), "rb").read()
    assert bytes(store.read_range(names[1], 10, 110)) == raw[10:110]
    head, size = store.header_bytes(names[1], 64, len(raw))
    assert (bytes(head), size) == (raw[:64], len(raw))
    assert json.loads(store.read_manifest("dataset_manifest.json")) == handmade.read_manifest(local)
    assert store.sizes(names + ["nope.safetensors"]) == {n: os.path.getsize(os.path.join(local, n)) for n in names}
    assert store.exists(names[0]) and not store.exists("nope") and not store.isdir(names[0])
    dest = str(tmp_path / "copy")
    assert store.download(names[2], dest) == os.path.getsize(os.path.join(local, names[2]))
    assert open(dest, "rb").read() == open(os.path.join(local, names[2]), "rb").read()
    c = store.io_counters()  # the GETs: a range, a header, the manifest, a whole object
    manifest = os.path.getsize(os.path.join(local, "dataset_manifest.json"))
    assert (c["requests"], c["bytes_fetched"]) == (4, 100 + 64 + manifest + os.path.getsize(dest)), c


def test_downloads_with_writeback_write_every_byte(s3_server, small, tmp_path):
    """A node-cache download asks the kernel to write each MiB back as it comes
    (``writeback=True``, spec/python.md §2.1): the copy is the object, byte for byte, across
    several MiB-sized write batches and a last partial one, as without it; the node cache of a
    native store asks for it, the spool does not."""
    url, bucket, local, names = small
    payload = os.urandom(3 * (1 << 20) + 12345)
    s3_server.client().put_object(Bucket=bucket, Key="ds/big.bin", Body=payload)
    store = open_store(url, s3_server.storage_options())
    for writeback in (True, False):
        dest = str(tmp_path / f"big-{writeback}")
        assert store.download("big.bin", dest, writeback=writeback) == len(payload)
        assert open(dest, "rb").read() == payload
    asked = []
    real = store.download
    store.download = lambda name, local, writeback=False: asked.append(writeback) or real(name, local, writeback)
    for spool in (False, True):
        base = tmp_path / f"cache-{spool}"
        base.mkdir()  # (a spool's directory is made by its owner, never by the cache)
        cached = CachedStore(store, str(base), spool=spool)
        cached.fetch_now(names[0], os.path.getsize(os.path.join(local, names[0])))
    assert asked == [True, False]


def test_range_buffers_are_reused_only_when_nothing_holds_them(s3_server, small):
    """The client's range buffers (spec/performance.md §13.7): a buffer is handed out again only
    once nothing holds it or a view of it — an array, a memoryview, a read-only slice — so no byte
    anyone can still see is overwritten; a free one is reused (the same object), resized to a
    smaller range in place, a range longer than any free buffer gets a fresh one, and a range
    under 1 MiB (a header) never takes a pooled one."""
    import numpy as np

    url, bucket, local, names = small
    mb = 1 << 20
    raw = os.urandom(3 * mb)
    s3_server.client().put_object(Bucket=bucket, Key="ds/big.bin", Body=raw)
    client = open_store(url, s3_server.storage_options()).fs  # a client of its own: an empty pool
    a, size = client.get_range("ds/big.bin", 0, 3 * mb // 2)
    first, arr = id(a), np.frombuffer(a, np.uint8)
    del a
    b, _ = client.get_range("ds/big.bin", 3 * mb // 2, 3 * mb)  # `a` is held by the array: not reused
    assert id(b) != first and bytes(b) == raw[3 * mb // 2:] and arr.tobytes() == raw[:3 * mb // 2]
    view = memoryview(b).toreadonly()[10:20]
    del b, arr
    small_range, _ = client.get_range("ds/big.bin", 0, 100)  # a header's size: never a pooled buffer
    assert id(small_range) != first and bytes(small_range) == raw[:100]
    c, _ = client.get_range("ds/big.bin", mb // 5, mb // 5 + 3 * mb // 2)  # `a` is free again, `b` is viewed
    assert id(c) == first and bytes(c) == raw[mb // 5: mb // 5 + 3 * mb // 2]
    assert bytes(view) == raw[3 * mb // 2 + 10: 3 * mb // 2 + 20]
    del c
    d, _ = client.get_range("ds/big.bin", mb, mb + 6 * mb // 5)  # shorter: the free one, resized
    assert id(d) == first and bytes(d) == raw[mb: mb + 6 * mb // 5]
    assert bytes(view) == raw[3 * mb // 2 + 10: 3 * mb // 2 + 20]
    e, _ = client.get_range("ds/big.bin", 0, 2 * mb)  # longer than any free one: fresh
    assert id(e) != first and bytes(e) == raw[:2 * mb] and size == len(raw)
    # an object shorter than the range: its bytes only, from a reused buffer too
    del d, e, view
    tail = 6 * mb // 5
    f, got = client.get_range("ds/big.bin", len(raw) - tail, len(raw) + 3 * mb // 10)
    assert bytes(f) == raw[len(raw) - tail:] and got == len(raw)


def test_an_epoch_reusing_range_buffers_never_changes_a_held_batch(s3_server, tmp_path, monkeypatch):
    """Shards whose column spans take the client's pooled range buffers (>= 1 MiB; written to
    each fresh one with streaming stores after one madvise, spec/performance.md §13.7): the
    epoch hands buffers out again while every batch taken so far is still held (seen: one
    `bytearray` returned for two ranges), and at the end every held batch still equals the
    local read — in this process and in two DataLoader workers (each fetching its
    ranges, and sharing whole shards through the loader's spool), shuffled or not."""
    import numpy as np
    from safetensors.numpy import save_file

    from safetensors_spark.torch import loader

    local = str(tmp_path / "d")
    rows, width = 300, 1024  # x: 1.2 MB a shard, random F32 (a stale byte shows)
    handmade.write_batch_dataset(local, [rows] * 16, batch_size=rows)
    m = handmade.read_manifest(local)
    for k, sh in enumerate(m["shards"]):
        p = os.path.join(local, sh["shard_path"])
        x = np.random.default_rng(k).random((rows, width), dtype=np.float32)
        save_file({"x": x, "y": np.arange(k * rows, (k + 1) * rows, dtype=np.int64)}, p,
                  metadata={"safetensors_spark.layout": "batch", "safetensors_spark.samples": str(rows),
                            "safetensors_spark.padded_samples": "0"})
        sh["bytes"] = os.path.getsize(p)
    m["schema"]["x"]["shape"] = [rows, width]
    m["total_bytes"] = sum(sh["bytes"] for sh in m["shards"])
    handmade.write_manifest(local, m)
    url, _ = s3_server.upload_dataset(local, "pool")

    handed = []  # ids of the pooled-size ranges the client returned (no reference kept)
    read_range = NativeStore.read_range

    def spy(self, name, start, end):
        data = read_range(self, name, start, end)
        if end - start >= 1 << 20:
            handed.append(id(data))
        return data

    monkeypatch.setattr(NativeStore, "read_range", spy)
    for shuffle in (True, False):
        def epoch(path, workers, share=None):
            it = SafetensorsIterableDataset(path, batch_size=64, shuffle=shuffle, seed=3, shuffle_block_size=rows)
            return list(loader(it, num_workers=workers, share_shards=share) if workers else it)

        want = epoch(local, 0)
        # workers fetching ranges each (share_shards=False), and sharing whole shards in a spool
        for workers, share in ((0, None), (2, False), (2, None)):
            handed.clear()
            held = epoch(open_dataset(url, storage_options=s3_server.storage_options(), client="native",
                                      prefetch=2), workers, share)
            if workers == 0:
                assert len(handed) == 16 and len(set(handed)) < len(handed), "no buffer was reused"
            assert len(held) == len(want)
            for got, exp in zip(held, want):
                assert torch.equal(got["y"], exp["y"]) and torch.equal(got["x"], exp["x"]), (shuffle, workers)


@pytest.mark.parametrize("client", ["native", "fsspec"])
def test_batches_gathered_from_the_read_ahead_are_the_users_own(s3_server, small, client):
    """A batch reader gathers from read-only views of the read-ahead's buffers (no copy of its
    own; spec/performance.md §13.7): every batch it hands out — one run as it is, runs across
    shards, shuffled rows — is a writable tensor of its own, so writing into it changes no later
    read, and no read-only array reaches the user (torch would warn)."""
    import warnings

    url, bucket, local, names = small
    want = sorted(y for b in SafetensorsIterableDataset(local, batch_size=4) for y in b["y"].tolist())
    ds = open_dataset(url, storage_options=s3_server.storage_options(), client=client)
    for batch_size, shuffle in ((4, False), (3, False), (5, True)):
        it = SafetensorsIterableDataset(ds, batch_size=batch_size, shuffle=shuffle, seed=0)
        first = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "The given NumPy array is not writable" would fail here
            for b in it:
                first.append((b["x"].clone(), b["y"].clone()))
                b["x"] += 1000
                b["y"] += 1000
        again = [(b["x"], b["y"]) for b in it]
        assert len(again) == len(first) and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                                                for a, b in zip(first, again)), (batch_size, shuffle)
        assert sorted(y for _, ys in first for y in ys.tolist()) == want


def test_native_counts_and_cache_key_match_fsspec(s3_server, small):
    url, bucket, local, names = small
    native = open_store(url, s3_server.storage_options())
    fs = open_store(url, s3_server.storage_options(), client="fsspec")
    assert type(fs) is FsspecStore
    assert native.cache_key == fs.cache_key  # one node cache, whichever client fills it
    for st in (native, fs):
        st.read_range(names[0], 0, 100)
        st.read_range(names[0], 100, 150)
        assert st.io_counters()["requests"] == 2 and st.io_counters()["bytes_fetched"] == 150


def test_native_errors_name_the_url(s3_server, small):
    url, bucket, local, names = small
    store = open_store(url, s3_server.storage_options(), retries=0)
    with pytest.raises(FileNotFoundError, match=rf"s3://{bucket}/ds/nope.safetensors: GET bytes \[0, 8\)"):
        store.read_range("nope.safetensors", 0, 8)
    mark = s3_server.mark()
    s3_server.fail_next("GET", 1, status=403, path=f"/{bucket}/ds/{names[0]}")
    with pytest.raises(PermissionError, match=rf"s3://{bucket}/ds/{names[0]}: GET bytes \[0, 8\)"):
        open_store(url, s3_server.storage_options(), retries=3).read_range(names[0], 0, 8)
    assert len([r for r in on_bucket(s3_server, mark, bucket)
                if r["method"] == "GET" and r["path"].endswith(names[0])]) == 1, "403: not retried"
    s3_server.fail_next("GET", 1, path=f"/{bucket}/ds/{names[0]}", delay=2.5)
    opts = {**s3_server.storage_options(), "config_kwargs": {"read_timeout": 0.5, "connect_timeout": 0.5}}
    with pytest.raises(RemoteReadError, match=rf"s3://{bucket}/ds/{names[0]}: GET bytes \[0, 8\) failed 1 times"
                                              rf".*TimeoutError"):
        open_store(url, opts, retries=0).read_range(names[0], 0, 8)
    dead = {**s3_server.storage_options(), "endpoint_url": f"http://127.0.0.1:{free_port()}"}
    dead.pop("client_kwargs")
    dead["region"] = s3_server.REGION
    with pytest.raises(RemoteReadError, match=rf"s3://{bucket}/ds/{names[0]}: GET bytes \[0, 8\) failed 2 times"):
        open_store(url, dead, retries=1).read_range(names[0], 0, 8)
    s3_server.fail_next("GET", 2, status=503, path=f"/{bucket}/ds/{names[1]}")
    raw = open(os.path.join(local, names[1]), "rb").read()
    assert bytes(open_store(url, s3_server.storage_options(), retries=2).read_range(names[1], 0, 8)) == raw[:8]


def test_client_option_and_the_fsspec_fallback(s3_server, small):
    url, bucket, local, names = small
    opts = s3_server.storage_options()
    assert type(open_store(url, opts)) is NativeStore
    assert type(open_store(url, opts, client="native")) is NativeStore
    assert type(open_store(url, opts, client="fsspec")) is FsspecStore
    assert type(open_store(url, opts, cache_dir="/tmp/x").remote) is NativeStore
    # an option the native client does not understand: fsspec under "auto", refused by name under "native"
    odd = {**opts, "requester_pays": False}
    assert type(open_store(url, odd)) is FsspecStore
    with pytest.raises(ValueError, match="storage option 'requester_pays' is not one the native client understands"):
        open_store(url, odd, client="native")
    with pytest.raises(ValueError, match="storage option 'client_kwargs.verify'"):
        open_store(url, {**opts, "client_kwargs": {"verify": False}}, client="native")
    with pytest.raises(ValueError, match="client='native' reads s3:// URLs; memory://x"):
        open_store("memory://x", None, client="native")
    with pytest.raises(ValueError, match="client must be one of auto, native, fsspec, got 'boto'"):
        open_store(url, opts, client="boto")
    with pytest.raises(ValueError, match="client must be one of"):
        open_dataset(url, storage_options=opts, client="boto")
    # both clients read the same samples
    want = [b["y"].tolist() for b in SafetensorsIterableDataset(local, batch_size=4)]
    for client in ("native", "fsspec"):
        ds = open_dataset(url, storage_options=opts, client=client)
        assert [b["y"].tolist() for b in SafetensorsIterableDataset(ds, batch_size=4)] == want, client


# -- the open: one request whatever the number of shards -------------------------------------------

@pytest.mark.parametrize("client", ["native", "fsspec"])
@pytest.mark.parametrize("cached", [False, True], ids=["ranges", "node-cache"])
def test_open_reads_one_object_at_any_size_and_a_sample_reads_its_shard_only(s3_server, tmp_path, client, cached):
    per_size = {}
    for shards in (4, 40):
        url, bucket, local, names = upload(s3_server, shards, f"open{shards}")
        mark = s3_server.mark()
        ds = open_dataset(url, storage_options=s3_server.storage_options(), client=client,
                          cache_dir=str(tmp_path / f"c{shards}") if cached else None)
        i = 4 * (shards // 2) + 1  # a sample of the middle shard
        assert int(ds[i]["y"]) == i
        reqs = [(r["method"], r["path"].rsplit("/", 1)[-1]) for r in on_bucket(s3_server, mark, bucket)]
        per_size[shards] = [r for r in reqs if r[1] not in names]  # the open's
        assert {n for _, n in reqs if n in names} == {names[shards // 2]}, reqs  # the sample's
    # native: one GET; s3fs: a HEAD and a GET of the manifest
    want = [("GET", "dataset_manifest.json")] if client == "native" else \
        [("HEAD", "dataset_manifest.json"), ("GET", "dataset_manifest.json")]
    assert per_size[4] == per_size[40] == want, per_size


# -- lazy header checks ------------------------------------------------------------------------------

@pytest.mark.parametrize("cached", [False, True], ids=["ranges", "node-cache"])
def test_a_shard_disagreeing_with_the_manifest_fails_when_used_and_others_are_never_read(s3_server, tmp_path,
                                                                                       cached):
    def edit(m):
        m["shards"][2]["num_tensors"] = 5

    url, bucket, local, names = upload(s3_server, 6, "lazy", edit)
    mark = s3_server.mark()
    ds = open_dataset(url, storage_options=s3_server.storage_options(),
                      cache_dir=str(tmp_path / "c") if cached else None)
    assert [int(ds[i]["y"]) for i in range(8)] == list(range(8))  # shards 0 and 1
    for _ in range(2):
        with pytest.raises(ShardError, match=rf"/{names[2]}: the header has 2 tensors but "
                                             rf"dataset_manifest.json says 5 \(shards\[\].num_tensors\)"):
            ds[9]
    for _ in range(100):  # (the server logs a request once answered: shard 2's may come late)
        touched = {r["path"].rsplit("/", 1)[-1] for r in on_bucket(s3_server, mark, bucket)}
        if names[2] in touched:
            break
        time.sleep(0.05)
    assert touched == {"dataset_manifest.json", *names[:3]}, touched  # shards 3-5: never read
    assert not any(r["method"] == "LIST" or "list-type" in (r.get("query") or "")
                   for r in on_bucket(s3_server, mark, bucket)), "no listing"
    with pytest.raises(ShardError, match=rf"{names[2]}: the header has 2 tensors"):
        list(SafetensorsIterableDataset(ds, batch_size=4))


def test_a_shard_missing_or_of_another_size_fails_when_used(s3_server):
    def edit(m):
        m["shards"][1]["bytes"] += 1
        m["total_bytes"] += 1

    url, bucket, local, names = upload(s3_server, 3, "size", edit)
    s3_server.client().delete_object(Bucket=bucket, Key=f"ds/{names[2]}")
    for client in ("native", "fsspec"):
        ds = open_dataset(url, storage_options=s3_server.storage_options(), client=client)
        assert int(ds[0]["y"]) == 0
        with pytest.raises(ShardError, match=rf"{names[1]}: the file has \d+ bytes but dataset_manifest.json says"):
            ds[4]
        with pytest.raises(ShardError, match=rf"{names[2]}: listed in dataset_manifest.json but missing"):
            ds[8]


def test_the_first_read_of_a_shard_costs_its_header_and_its_rows(s3_server, small):
    """Native ranges: a shard's first use is one range GET of its header (64 KiB read-ahead, or
    the whole shard when smaller), whose answer also states the object's size, then the rows."""
    url, bucket, local, names = small
    ds = open_dataset(url, storage_options=s3_server.storage_options(), prefetch=0)
    mark = s3_server.mark()
    ds[0]
    for _ in range(100):  # (the server logs a request once answered: the last may come late)
        reqs = [r for r in on_bucket(s3_server, mark, bucket) if r["path"].endswith(names[0])]
        if len(reqs) >= 3:
            break
        time.sleep(0.05)
    size = os.path.getsize(os.path.join(local, names[0]))
    assert reqs[0]["method"] == "GET" and reqs[0]["range"] == f"bytes=0-{min(size, HEADER_READ_AHEAD) - 1}", reqs[0]
    assert all(r["method"] == "GET" for r in reqs) and len(reqs) == 3, reqs  # header, x, y
    assert not isinstance(ds._store, CachedStore)
