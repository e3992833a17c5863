"""A loader's workers share each remote shard through a spool (spec/python.md §2.1, "Shards
shared by workers"): a shuffled epoch deals every shuffle block's messages to all workers in turn,
so workers fetching for themselves fetched the dataset once per worker. Against the real S3 server
on loopback (moto): the server's request log counts what was fetched."""
import gc
import multiprocessing
import os
import shutil
import sys
import threading

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import handmade  # noqa: E402

from safetensors_spark import open_dataset  # noqa: E402
from safetensors_spark._spool import PREFIX, make_spool  # noqa: E402
from safetensors_spark._storage import CachedStore  # noqa: E402

import torch  # noqa: E402  (a requirement: a broken import fails the run, never skips it)
from safetensors_spark.torch import SafetensorsDataset, SafetensorsIterableDataset, SafetensorsMixture, loader  # noqa: E402


@pytest.fixture(scope="module")
def remote(s3_server, tmp_path_factory):
    """12 shards of 16 samples, x 8 F32 wide, uploaded to the server."""
    local = str(tmp_path_factory.mktemp("spool") / "d")
    handmade.write_batch_dataset(local, [16] * 12, batch_size=16, width=8)
    url, _ = s3_server.upload_dataset(local, "spool")
    sizes = {n: os.path.getsize(os.path.join(local, n)) for n in os.listdir(local) if n.endswith(".safetensors")}
    return local, url, sizes


def shard_gets(s3_server, mark):
    """Bytes the server sent for each shard object since ``mark``."""
    out = {}
    for r in s3_server.requests_since(mark):
        name = r["path"].rsplit("/", 1)[-1]
        if r["method"] == "GET" and name.endswith(".safetensors") and r["status"] < 300:
            out[name] = out.get(name, 0) + (r.get("response_bytes") or 0)
    return out


def epoch(ds, **kw):
    # one batch a message: each shuffle block's messages go to every worker in turn
    it = loader(SafetensorsIterableDataset(ds, batch_size=4, shuffle=True, seed=7), handoff_batches=1, **kw)
    return it, [(b["y"].tolist(), b["x"].tolist()) for b in it]


@pytest.mark.parametrize("client", ["native", "fsspec"])
@pytest.mark.parametrize("workers", [2, 3])
def test_workers_fetch_each_shard_once_and_yield_the_one_process_order(remote, s3_server, client, workers):
    local, url, sizes = remote
    _, want = epoch(local)  # one process, local: the order every loader must yield
    opts = s3_server.storage_options()
    mark = s3_server.mark()
    it, got = epoch(open_dataset(url, storage_options=opts, client=client), num_workers=workers,
                    multiprocessing_context=multiprocessing.get_context("fork"))
    assert got == want
    assert it.spool is not None and it.spool.path.startswith("/dev/shm/" + PREFIX)
    sent = shard_gets(s3_server, mark)
    assert sorted(sent) == sorted(sizes) and sum(sent.values()) <= 1.05 * sum(sizes.values()), sent
    # each worker fetching for itself (as before the spool) fetches the shards once per worker
    mark = s3_server.mark()
    it, got = epoch(open_dataset(url, storage_options=opts, client=client), num_workers=workers,
                    share_shards=False, multiprocessing_context=multiprocessing.get_context("fork"))
    assert got == want and it.spool is None
    unshared = shard_gets(s3_server, mark)
    assert sum(unshared.values()) >= 0.9 * workers * sum(sizes.values())


def test_the_spool_holds_at_most_its_bound_and_goes_with_the_loader(remote, s3_server):
    local, url, sizes = remote
    ds = open_dataset(url, storage_options=s3_server.storage_options(), prefetch=1)
    # a message of one batch of 4 (never two shards): each window holds what the bound counts
    it = loader(SafetensorsIterableDataset(ds, batch_size=4), num_workers=2, handoff_batches=1,
                persistent_workers=True, multiprocessing_context=multiprocessing.get_context("spawn"))
    spool = it.spool
    # 2 workers × (1 read ahead + 1 read) × the largest shard: 4 of the 12 shards
    assert spool.limit == 2 * 2 * max(sizes.values())
    peak, stop = [0], threading.Event()

    def watch():  # the bytes in the spool (copies, downloads in progress), sampled every millisecond
        while not stop.is_set():
            held = 0
            for d, _, files in os.walk(spool.path):
                for f in files:
                    if f.endswith((".safetensors", ".part")):
                        try:
                            held += os.path.getsize(os.path.join(d, f))
                        except OSError:
                            pass
            peak[0] = max(peak[0], held)
            stop.wait(0.001)

    t = threading.Thread(target=watch)
    t.start()
    try:
        for _ in range(2):  # two epochs on the same live workers and spool
            assert sorted(int(y) for b in it for y in b["y"]) == list(range(192))
    finally:
        stop.set()
        t.join()
    assert max(sizes.values()) * 2 <= peak[0] <= spool.limit, (peak[0], spool.limit)
    path = spool.path
    assert os.path.isdir(path)
    del it, spool
    gc.collect()
    assert not os.path.exists(path)


def test_a_copy_evicted_between_its_fetch_and_its_map_is_fetched_again(remote, s3_server, tmp_path, monkeypatch):
    """Another process evicts a shard after this one made sure of it and before it maps it (forced:
    the copy is removed right after each shard's first fetch): the read fetches it again."""
    local, url, sizes = remote
    fetch, evicted = CachedStore.fetch, set()

    def fetch_then_evicted(self, name, size, crc32c=None):
        fetch(self, name, size, crc32c)
        if name not in evicted:
            evicted.add(name)
            os.unlink(self.node.path(name))

    monkeypatch.setattr(CachedStore, "fetch", fetch_then_evicted)
    mark = s3_server.mark()
    ds = open_dataset(url, storage_options=s3_server.storage_options(), cache_dir=str(tmp_path / "c"), prefetch=0)
    got = sorted(int(y) for b in SafetensorsIterableDataset(ds, batch_size=4) for y in b["y"])
    assert got == list(range(192)) and evicted == set(sizes)
    assert sum(shard_gets(s3_server, mark).values()) == 2 * sum(sizes.values())


def test_where_sharing_fetches_more_or_cannot_be_there_is_no_spool_and_asking_says_why(remote, s3_server, tmp_path):
    local, url, sizes = remote
    ds = open_dataset(url, storage_options=s3_server.storage_options())
    # y is 8 of a sample's 40 bytes: two workers' ranges fetch less than whole shards
    few = SafetensorsIterableDataset(ds, batch_size=4, columns=["y"])
    assert loader(few, num_workers=2).spool is None
    with pytest.raises(ValueError, match=r"share_shards=True.*the columns read \(y\) are 8 of every 40 bytes"):
        loader(few, num_workers=2, share_shards=True)
    whole = SafetensorsIterableDataset(ds, batch_size=4)
    assert loader(whole, num_workers=0).spool is None
    with pytest.raises(ValueError, match="fewer than 2 workers"):
        loader(whole, num_workers=1, share_shards=True)
    with pytest.raises(ValueError, match="local or read through cache_dir"):
        loader(SafetensorsIterableDataset(local, batch_size=4), num_workers=2, share_shards=True)
    with pytest.raises(ValueError, match="share_shards must be None"):
        loader(whole, num_workers=2, share_shards="yes")
    mix = SafetensorsMixture([ds], weights=[1.0], batch_size=4)
    assert loader(mix, num_workers=2).spool is None
    with pytest.raises(ValueError, match="mixture.*cache_dir"):
        loader(mix, num_workers=2, share_shards=True)
    assert loader(SafetensorsDataset(ds), batch_size=4, num_workers=2).spool is None
    with pytest.raises(ValueError, match="map-style.*cache_dir"):
        loader(SafetensorsDataset(ds), batch_size=4, num_workers=2, share_shards=True)
    kv_local = str(tmp_path / "kv")
    handmade.write_kv_dataset(kv_local, [["a", "b"], ["c"]])
    kv_url, _ = s3_server.upload_dataset(kv_local, "spoolkv")
    kv = SafetensorsIterableDataset(open_dataset(kv_url, storage_options=s3_server.storage_options()), batch_size=1)
    assert loader(kv, num_workers=2).spool is None
    with pytest.raises(ValueError, match="KV dataset's samples are read on demand"):
        loader(kv, num_workers=2, share_shards=True)
    # no directory with room: none (asked for: a ValueError naming the bytes)
    assert make_spool(1 << 62, dirs=(str(tmp_path),)) is None


def test_without_room_for_a_spool_there_is_none_and_asking_names_the_bytes(remote, s3_server, monkeypatch):
    import safetensors_spark.torch._loader as loader_module

    local, url, sizes = remote
    monkeypatch.setattr(loader_module, "make_spool", lambda limit: None)  # no directory has room
    whole = SafetensorsIterableDataset(open_dataset(url, storage_options=s3_server.storage_options()), batch_size=4)
    assert loader(whole, num_workers=2).spool is None
    bound = 2 * 5 * max(sizes.values())  # 2 workers × (prefetch 4 + 1) × the largest shard
    with pytest.raises(ValueError, match=f"neither /dev/shm nor the temporary directory has {4 * bound} bytes free"):
        loader(whole, num_workers=2, share_shards=True)


def test_a_dead_process_spool_is_removed_by_the_next_one(tmp_path):
    p = multiprocessing.get_context("fork").Process(target=os._exit, args=(0,))
    p.start()
    p.join()
    dead = tmp_path / f"{PREFIX}{p.pid}-abc"
    (dead / "x").mkdir(parents=True)
    mine = tmp_path / f"{PREFIX}{os.getpid()}-def"
    mine.mkdir()
    spool = make_spool(1 << 20, dirs=(str(tmp_path),))
    assert spool is not None and os.path.isdir(spool.path)
    assert not dead.exists() and mine.exists()
    path = spool.path
    del spool
    gc.collect()
    assert not os.path.exists(path)


def test_an_iterator_outliving_its_loader_keeps_the_spool_and_leaves_nothing(remote, s3_server):
    """`it = iter(loader(...))` drops the loader at once: the spool lives while the iterator does
    (it was removed under the running workers, which then made parts of it again and left them)."""
    local, url, sizes = remote
    ds = open_dataset(url, storage_options=s3_server.storage_options())
    dl = loader(SafetensorsIterableDataset(ds, batch_size=4, shuffle=True, seed=3), num_workers=2,
                handoff_batches=1, multiprocessing_context=multiprocessing.get_context("fork"))
    path = dl.spool.path
    it = iter(dl)
    del dl
    gc.collect()
    assert os.path.isdir(path)
    assert sorted(int(y) for b in it for y in b["y"]) == list(range(192))
    del it
    gc.collect()
    assert not os.path.exists(path)


def test_a_removed_spool_is_never_made_again(tmp_path):
    """A worker still finishing after its spool was removed fails to write there instead of
    leaving a directory behind; a node cache (cache_dir) is made on demand as before."""
    from safetensors_spark._node_cache import NodeCache

    base = tmp_path / "spool"
    base.mkdir()
    node = NodeCache(str(base), "d", spool=True)
    shutil.rmtree(base)
    with pytest.raises(FileNotFoundError):
        node.get("s", 3, None, lambda tmp: open(tmp, "wb").write(b"abc"), "s3://b/s")
    with pytest.raises(FileNotFoundError):
        node.set_needs(["s"])
    assert not base.exists()
    cache = NodeCache(str(tmp_path / "cache"), "d")
    assert cache.get("s", 3, None, lambda tmp: open(tmp, "wb").write(b"abc"), "s3://b/s")[1] == 3
