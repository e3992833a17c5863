"""loader().stats() and the periodic report (spec/python.md §3.1.2): what it counts is checked
against what the loop received, the workers' and the remote reads' counters against real worker
processes and the S3 server on loopback; the waiting share against a slow source and a slow
step (margins of 10× and more: these check what is measured, not how fast)."""

import logging
import os
import time

import pytest
import torch

import handmade
from safetensors_spark import open_dataset
from safetensors_spark.torch import SafetensorsDataset, SafetensorsIterableDataset, SafetensorsMixture, loader
from safetensors_spark.torch._stats import batch_bytes

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = str(tmp_path_factory.mktemp("stats") / "ds")
    handmade.write_batch_dataset(p, [150, 150, 100], width=4)
    return p


def _epoch(dl, step=None):
    n = nbytes = 0
    for b in dl:
        n += 1
        nbytes += sum(v.numel() * v.element_size() for v in b.values())
        if step:
            step()
    return n, nbytes


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["iterable", "map_style", "mixture"])
def test_stats_count_what_the_loop_received(path, workers, kind):
    if kind == "iterable":
        dl = loader(SafetensorsIterableDataset(path, batch_size=8, shuffle=True), num_workers=workers)
    elif kind == "map_style":
        dl = loader(SafetensorsDataset(path), batch_size=8, shuffle=True, num_workers=workers)
    else:
        dl = loader(SafetensorsMixture([path, path], batch_size=8, num_samples=400), num_workers=workers)
    assert dl.stats() is None  # no iterator yet
    n, nbytes = _epoch(dl)
    s = dl.stats()
    assert (s["batches"], s["bytes"]) == (n, nbytes) == (50, 400 * (4 * 4 + 8))
    assert s["first_batch_s"] > 0 and s["elapsed_s"] >= s["first_batch_s"]
    assert s["batches_per_s"] > 0 and s["bytes_per_s"] > 0
    assert 0 < s["wait_s"] <= s["elapsed_s"] and 0 < s["wait_fraction"] <= 1
    assert s["loader_cpu_s"] > 0 and s["loader_cpu_per_batch_us"] == pytest.approx(s["loader_cpu_s"] / n * 1e6)
    assert s["workers"] == workers and s["device"] is None and s["device_bytes_per_s"] is None
    if workers:
        assert s["worker_busy_s"] > 0 and 0 < s["worker_busy_fraction"] <= 1
    else:
        assert s["worker_busy_s"] is None
    assert (s["bytes_fetched"], s["requests"], s["cache_hits"], s["get_latency_ms"]) == (0, 0, 0, None)
    first = dl.stats()
    _epoch(dl)
    assert dl.stats()["batches"] == 50 and first["batches"] == 50, "each iterator counts its own"


def test_persistent_workers_count_each_iterator_from_its_start(path):
    dl = loader(SafetensorsIterableDataset(path, batch_size=8), num_workers=2, persistent_workers=True)
    _epoch(dl)
    busy = dl.stats()["worker_busy_s"]
    _epoch(dl)
    s = dl.stats()
    assert s["batches"] == 50 and 0 < s["worker_busy_s"] < busy * 20 and s["worker_busy_fraction"] <= 1


def _slow(batch):
    time.sleep(0.03)
    return batch


def test_the_wait_share_tells_a_slow_source_from_a_slow_step(path):
    slow_data = loader(SafetensorsIterableDataset(path, batch_size=8, transform=_slow), num_workers=1,
                       handoff_batches=1)
    _epoch(slow_data)
    slow_step = loader(SafetensorsIterableDataset(path, batch_size=8), num_workers=1)
    _epoch(slow_step, step=lambda: time.sleep(0.03))
    data_bound, step_bound = slow_data.stats(), slow_step.stats()
    # 30 ms per batch in the worker, none in the loop: the loop waits nearly all the time
    assert data_bound["wait_fraction"] > 0.7 and data_bound["worker_busy_fraction"] > 0.7
    # 30 ms per batch in the loop, the batch ready long before: it hardly waits
    assert step_bound["wait_fraction"] < 0.2 and step_bound["worker_busy_fraction"] < 0.2


def test_stats_every_reports_to_the_callback_or_the_log_and_options_are_checked(path, caplog):
    got = []
    dl = loader(SafetensorsIterableDataset(path, batch_size=8), num_workers=2, stats_every=0.01,
                stats_callback=got.append)
    _epoch(dl, step=lambda: time.sleep(0.002))
    assert got and [g["batches"] for g in got] == sorted(g["batches"] for g in got)
    assert set(got[-1]) == set(dl.stats())
    with caplog.at_level(logging.INFO, logger="safetensors_spark.loader"):
        _epoch(loader(SafetensorsIterableDataset(path, batch_size=8), stats_every=0.001),
               step=lambda: time.sleep(0.002))
    assert any(r.name == "safetensors_spark.loader" and "batches/s" in r.getMessage() and "waited" in r.getMessage()
               for r in caplog.records)
    ds = SafetensorsIterableDataset(path, batch_size=8)
    for bad in (0, -1, "10", True):
        with pytest.raises(ValueError, match=r"stats_every must be a number of seconds > 0 or None \(no periodic report\), got"):
            loader(ds, stats_every=bad)
    with pytest.raises(TypeError, match="stats_callback must be callable"):
        loader(ds, stats_every=1, stats_callback="print")
    with pytest.raises(ValueError, match="give stats_every too"):
        loader(ds, stats_callback=print)


def test_device_stats_give_the_host_to_device_rate(path, monkeypatch):
    from late_cuda import LateCuda
    from safetensors_spark.torch import _device

    monkeypatch.setattr(_device, "BACKEND", LateCuda(lag=0))
    dl = loader(SafetensorsIterableDataset(path, batch_size=8), num_workers=2, device="cuda")
    n, nbytes = _epoch(dl)
    s = dl.stats()
    assert s["device"] == "cuda" and s["bytes"] == nbytes and s["device_bytes_per_s"] > 0


def test_remote_reads_bytes_gets_latency_and_node_cache_hits(s3_server, tmp_path):
    local = str(tmp_path / "d")
    handmade.write_batch_dataset(local, [40, 40, 40], width=4)
    url, _ = s3_server.upload_dataset(local, "st")
    opts = s3_server.storage_options()
    sample = 4 * 4 + 8
    # range reads in two workers: every sample's bytes, in GETs whose latency is timed
    dl = loader(SafetensorsIterableDataset(open_dataset(url, storage_options=opts), batch_size=8), num_workers=2,
                share_shards=False)
    _epoch(dl)
    s = dl.stats()
    assert s["bytes_fetched"] >= 120 * sample and s["requests"] >= 2 and s["get_latency_ms"] > 0
    assert s["cache_hits"] == s["cache_misses"] == 0
    # the workers' spool (the default): each shard fetched whole once, by one of them
    dl = loader(SafetensorsIterableDataset(open_dataset(url, storage_options=opts), batch_size=8), num_workers=2)
    _epoch(dl)
    s = dl.stats()
    assert s["cache_misses"] == 3 and s["requests"] >= 3 and s["bytes_fetched"] >= sum(
        os.path.getsize(os.path.join(local, n)) for n in os.listdir(local) if n.endswith(".safetensors"))
    # the node cache: the first epoch downloads each shard once, the second finds them all
    cache = str(tmp_path / "cache")
    cached = SafetensorsIterableDataset(open_dataset(url, storage_options=opts, cache_dir=cache), batch_size=8)
    dl = loader(cached, num_workers=2)
    _epoch(dl)
    first = dl.stats()
    assert first["cache_misses"] == 3 and first["bytes_fetched"] >= sum(
        os.path.getsize(os.path.join(local, n)) for n in os.listdir(local) if n.endswith(".safetensors"))
    _epoch(dl)
    second = dl.stats()
    assert second["cache_misses"] == 0 and second["cache_hits"] >= 3 and second["bytes_fetched"] == 0


def test_batch_bytes_counts_nested_values_and_offsets():
    nested = torch.nested.nested_tensor_from_jagged(torch.arange(7, dtype=torch.int32), torch.tensor([0, 3, 7]))
    assert batch_bytes({"a": torch.zeros(3, 2, dtype=torch.float16), "t": nested, "s": "x"}) == 12 + 28 + 24
