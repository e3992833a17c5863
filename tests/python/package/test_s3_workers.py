"""Remote datasets read by DataLoader workers from the real S3 server on loopback (moto, through
s3fs), under every start method: each worker process gets its own file system instance
(spec/python.md §remote reads); a server that goes away mid-epoch fails naming the object."""
import multiprocessing
import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import handmade  # noqa: E402

from conftest import StoppableEndpoint  # noqa: E402
from safetensors_spark import open_dataset  # noqa: E402

import torch  # noqa: E402  (a requirement: a broken import fails the run, never skips it)
from safetensors_spark.torch import SafetensorsIterableDataset, loader  # noqa: E402


@pytest.fixture(scope="module")
def remote(s3_server, tmp_path_factory):
    """A batch dataset (3 shards, 30 samples) written locally and copied to a bucket with s3fs."""
    local = str(tmp_path_factory.mktemp("s3w") / "d")
    handmade.write_batch_dataset(local, [10, 12, 8], batch_size=12)
    url, _ = s3_server.upload_dataset(local, "w")
    return local, url, s3_server.storage_options()


def rows(batches):
    return sorted((int(y), x.tolist()) for b in batches for y, x in zip(b["y"], b["x"]))


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_loader_workers_read_s3_under_every_start_method(remote, method, shuffle):
    local, url, opts = remote
    ds = open_dataset(url, storage_options=opts)
    ds.manifest  # the parent has used its s3fs instance (its loop and session) before the fork
    want = rows(loader(SafetensorsIterableDataset(local, batch_size=4, shuffle=shuffle, seed=5)))
    assert len(want) == 30
    it = SafetensorsIterableDataset(ds, batch_size=4, shuffle=shuffle, seed=5)
    got = rows(loader(it, num_workers=2, multiprocessing_context=multiprocessing.get_context(method)))
    assert got == want  # every sample exactly once, equal to the local read


def test_bytes_fetched_counts_this_process_reads(remote):
    local, url, opts = remote
    ds = open_dataset(url, storage_options=opts)
    opened = ds.bytes_fetched
    assert opened > 0  # manifest and headers
    batches = list(loader(SafetensorsIterableDataset(ds, batch_size=30)))
    assert rows(batches) == rows(loader(SafetensorsIterableDataset(local, batch_size=30)))
    x_y = 30 * (2 * 4 + 8)
    assert ds.bytes_fetched - opened >= x_y  # the sample bytes of one epoch, at least
    assert open_dataset(local).bytes_fetched == 0


def test_server_stops_mid_epoch_fails_naming_the_object(remote, s3_server, tmp_path):
    import s3fs

    local = str(tmp_path / "many")
    handmade.write_batch_dataset(local, [8] * 16, batch_size=8)
    url = remote[1] + "-many"
    fs = s3fs.S3FileSystem(**s3_server.storage_options())
    for name in os.listdir(local):
        fs.put_file(os.path.join(local, name), f"{url[5:]}/{name}")
    ep = StoppableEndpoint(s3_server)
    ep.start()
    opts = {**s3_server.storage_options(), "config_kwargs": {"connect_timeout": 0.5, "read_timeout": 0.5,
                                                              "retries": {"max_attempts": 1}}}
    opts["client_kwargs"] = {**opts["client_kwargs"], "endpoint_url": ep.endpoint}
    ds = open_dataset(url, storage_options=opts, retries=0)  # s3fs's own retries only: ~30 s here already
    it = iter(loader(SafetensorsIterableDataset(ds, batch_size=4), num_workers=2, handoff_batches=1,
                     prefetch_factor=1, multiprocessing_context=multiprocessing.get_context("fork")))
    next(it)
    ep.stop()
    t0 = time.monotonic()
    with pytest.raises(Exception) as e:
        for _ in it:
            pass
    last = str(e.value).strip().splitlines()[-1]  # the worker's error, with the object's URL
    assert "/ds-many/part-" in last and ".safetensors" in last, last
    assert time.monotonic() - t0 < 120, "bounded (generous: no hang)"
