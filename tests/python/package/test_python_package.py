"""The Python package safetensors_spark (rust-core/python, spec/python.md) on hand-made datasets
(handmade.py): opening, KV lookups with and without the index, published-only manifests, remote
reads through fsspec, every open-time error, pickling and import cost. Datasets written by the
Spark connector and the PySpark helper: ../test_spark_python_package.py."""

import json
import os
import pickle
import shutil

import fsspec
from fsspec.implementations.memory import MemoryFileSystem
import pytest

import handmade
import safetensors_spark
from safetensors_spark import (
    ColumnNotFoundError,
    KeyNotFoundError,
    ManifestError,
    SafetensorsSparkError,
    ShardError,
    open_dataset,
)
from safetensors_spark._storage import HEADER_READ_AHEAD
from safetensors_spark.torch import SafetensorsDataset, SafetensorsIterableDataset, loader

# -- opening, published-only manifests, iteration over shards --------------------------------

def test_open_dataset_len_columns_items_and_shards(tmp_path):
    path = str(tmp_path / "d")
    handmade.write_batch_dataset(path, [3, 4], padded=[1, 0], batch_size=4)
    ds = open_dataset(path)
    assert len(ds) == 7 and ds.columns == ["x", "y"] and ds.manifest["total_samples"] == 7
    assert [int(ds[i]["y"]) for i in range(7)] == list(range(7))
    assert int(ds[-1]["y"]) == 6 and ds[3]["x"].tolist() == [3.0, 30.0]
    for bad in (7, -8):
        with pytest.raises(IndexError, match=f"sample index {bad} is out of range"):
            ds[bad]
    shards = list(ds.iter_shards())
    assert [d["y"].tolist() for _, d in shards] == [[0, 1, 2], [3, 4, 5, 6]], "pad rows never appear"
    assert [int(s["y"]) for s in ds] == list(range(7))


def test_a_dataset_without_shards_opens_empty(tmp_path):
    path = str(tmp_path / "empty")
    os.makedirs(path)
    manifest = handmade._manifest([], {})
    manifest.update(format="safetensors-spark-dataset", created_by="tests", manifest_version=1, layout="batch",
                    batch_size=4, tail_strategy="write", kv_separator=None, padded_samples=0, dropped_samples=0)
    handmade.write_manifest(path, manifest)
    ds = open_dataset(path)
    assert (len(ds), ds.columns, list(ds.iter_shards())) == (0, [], [])
    it = SafetensorsIterableDataset(path, batch_size=2, shuffle=True)
    assert (len(it), list(loader(it)), it.state_dict()["position"]) == (0, [], 0)
    with pytest.raises(IndexError, match="out of range for dataset .* with 0 samples"):
        SafetensorsDataset(path)[0]


@pytest.mark.parametrize("metadata", [True, False])
def test_published_only_manifests_open(tmp_path, metadata):
    """Only the published fields: the layout comes from the shards' __metadata__, else from their
    shapes (spec/python.md §2)."""
    path = str(tmp_path / "pub")
    handmade.write_batch_dataset(path, [3, 4], batch_size=4, published_only=True, metadata=metadata)
    ds = open_dataset(path)
    assert ds.layout == "batch" and ds.batch_size == 4 and len(ds) == 7
    assert [int(ds[i]["y"]) for i in range(7)] == list(range(7))
    padded = str(tmp_path / "padded")
    handmade.write_batch_dataset(padded, [3, 4], padded=[1, 0], batch_size=4, published_only=True, metadata=metadata)
    if metadata:  # the pad row is known from the shard's __metadata__ and never returned
        assert [int(open_dataset(padded)[i]["y"]) for i in range(7)] == list(range(7))
    else:  # 4 rows for samples_count 3 and nothing saying why: not a batch shard, and not KV names
        with pytest.raises(ShardError, match=r"tensor '[xy]' is not <key>__<column>"):
            open_dataset(padded)
    kv = str(tmp_path / "pubkv")
    values = handmade.write_kv_dataset(kv, [["a", "b"], ["c"]], published_only=True, metadata=metadata)
    ds = open_dataset(kv)
    assert ds.layout == "kv" and ds.kv_separator == "__"
    assert ds.get("c")["emb"].tolist() == values["c"]["emb"].tolist()


def test_kv_get_through_the_index_reads_no_shard_header(tmp_path):
    path = str(tmp_path / "kv")
    values = handmade.write_kv_dataset(path, [["a", "b", "c"], ["d", "e"]])
    handmade.write_index(path)
    ds = open_dataset(path, check_headers=False)
    got = ds.get("e")
    assert got["emb"].tolist() == values["e"]["emb"].tolist() and int(got["label"]) == int(values["e"]["label"])
    assert all(s.tensors is None for s in ds.shards), "a lookup through the index must not parse shard headers"
    with pytest.raises(KeyNotFoundError, match="key 'zz' not found"):
        ds.get("zz")
    assert all(s.tensors is None for s in ds.shards)
    # one part per listed shard (spec/dataset.md §6.1): other files in the directory are not read
    with open(f"{path}/_tensor_index.parquet/part-00000000000000000000.parquet", "wb") as f:
        f.write(b"a part of the earlier layout that must not be read")
    ds = open_dataset(path, check_headers=False)
    assert ds.get("a")["emb"].tolist() == values["a"]["emb"].tolist()
    assert all(s.tensors is None for s in ds.shards)
    # a shard without its part is not covered: its header answers for its keys
    m = handmade.read_manifest(path)
    second = m["shards"][1]["shard_path"]
    os.remove(f"{path}/_tensor_index.parquet/{second[:-len('.safetensors')]}.parquet")
    ds = open_dataset(path, check_headers=False)
    assert ds.get("a")["emb"].tolist() == values["a"]["emb"].tolist()
    assert all(s.tensors is None for s in ds.shards)
    assert ds.get("e")["emb"].tolist() == values["e"]["emb"].tolist()
    assert [s.tensors is not None for s in ds.shards] == [False, True]


def test_an_index_part_with_rows_of_another_shard_is_an_error(tmp_path):
    import pyarrow.parquet as pq

    path = str(tmp_path / "kv")
    handmade.write_kv_dataset(path, [["a"], ["b"]])
    handmade.write_index(path)
    m = handmade.read_manifest(path)
    first, second = (s["shard_path"][: -len(".safetensors")] for s in m["shards"])
    # the second shard's part replaced by the first's (rows naming the first shard)
    os.replace(f"{path}/_tensor_index.parquet/{first}.parquet", f"{path}/_tensor_index.parquet/{second}.parquet")
    assert pq.read_table(f"{path}/_tensor_index.parquet/{second}.parquet").num_rows > 0
    with pytest.raises(safetensors_spark.IndexFileError,
                       match=f"the index part of {second}.safetensors has a row for tensor 'a__.*' of shard {first}"):
        open_dataset(path).get("a")


def test_get_on_a_batch_dataset_and_unknown_columns_are_errors(tmp_path):
    path = str(tmp_path / "d")
    handmade.write_batch_dataset(path, [3])
    ds = open_dataset(path)
    with pytest.raises(ManifestError, match="needs a KV dataset"):
        ds.get("a")
    with pytest.raises(ColumnNotFoundError, match=r"column 'z' is not in dataset .*\['x', 'y'\]"):
        SafetensorsDataset(path, columns=["z"])


# -- remote storage through fsspec -----------------------------------------------------------

class CountingMemoryFS(MemoryFileSystem):
    """fsspec's in-memory file system, counting the bytes every read returns."""

    protocol = "countmem"
    bytes_read = 0

    def cat_file(self, path, start=None, end=None, **kw):
        data = super().cat_file(path, start=start, end=end, **kw)
        CountingMemoryFS.bytes_read += len(data)
        return data


fsspec.register_implementation("countmem", CountingMemoryFS, clobber=True)


def upload(local, url):
    fs, root = fsspec.core.url_to_fs(url)
    for name in os.listdir(local):
        if os.path.isfile(os.path.join(local, name)):
            fs.pipe_file(f"{root}/{name}", open(os.path.join(local, name), "rb").read())


def test_remote_reads_only_the_byte_ranges_they_need(tmp_path):
    local = str(tmp_path / "d")
    rows = 20000
    handmade.write_batch_dataset(local, [rows, rows], batch_size=rows)
    upload(local, "countmem://remote1")
    shard_bytes = os.path.getsize(os.path.join(local, handmade.shard_name(0)))
    CountingMemoryFS.bytes_read = 0
    ds = open_dataset("countmem://remote1", check_headers=False)
    manifest_bytes = CountingMemoryFS.bytes_read
    CountingMemoryFS.bytes_read = 0
    sample = ds[rows + 5]
    assert sample["x"].tolist() == [rows + 5.0, (rows + 5) * 10.0] and int(sample["y"]) == rows + 5
    # one header read (64 KiB read-ahead) + one row of x (8 B) and of y (8 B); never the shard
    assert CountingMemoryFS.bytes_read == HEADER_READ_AHEAD + 16 < shard_bytes / 4, CountingMemoryFS.bytes_read
    assert manifest_bytes < 2000
    # torch datasets over the same URL: iterable batches equal the local ones
    want = [b["y"].tolist() for b in loader(SafetensorsIterableDataset(local, batch_size=1000, shuffle=True, seed=1))]
    got = [b["y"].tolist() for b in loader(SafetensorsIterableDataset("countmem://remote1", batch_size=1000,
                                                                       shuffle=True, seed=1), num_workers=2)]
    assert got == want
    it = SafetensorsIterableDataset("countmem://remote1", batch_size=16, columns=["y"])  # reads the headers
    CountingMemoryFS.bytes_read = 0
    first = next(iter(it))
    assert first["y"].tolist() == list(range(16))
    assert CountingMemoryFS.bytes_read == 16 * 8, "an unshuffled batch of one column is one range read of its rows"


def test_remote_with_cache_dir_copies_whole_shards_once(tmp_path):
    local = str(tmp_path / "d")
    handmade.write_batch_dataset(local, [5, 6])
    upload(local, "countmem://remote2")
    cache = tmp_path / "cache"
    ds = open_dataset("countmem://remote2", cache_dir=str(cache))
    assert [int(ds[i]["y"]) for i in range(11)] == list(range(11))
    cached = [p.name for p in cache.rglob("*.safetensors")]
    assert sorted(cached) == sorted(s.name for s in ds.shards)
    t = SafetensorsDataset("countmem://remote2", cache_dir=str(cache))
    assert t[7]["x"].tolist() == [7.0, 70.0]


# -- errors at open time -----------------------------------------------------------------------

@pytest.fixture
def good(tmp_path):
    path = str(tmp_path / "good")
    handmade.write_batch_dataset(path, [3, 4], padded=[1, 0], batch_size=4)
    return path


def edit_manifest(path, fn):
    m = handmade.read_manifest(path)
    fn(m)
    handmade.write_manifest(path, m)


def test_missing_and_corrupt_manifest(tmp_path, good):
    with pytest.raises(ManifestError, match=r"dataset_manifest.json: not found"):
        open_dataset(str(tmp_path / "nothing"))
    with open(os.path.join(good, "dataset_manifest.json"), "w") as f:
        f.write('{"format_version": "1.0", "shards": [')
    with pytest.raises(ManifestError, match=r"good/dataset_manifest.json: invalid dataset manifest"):
        open_dataset(good)
    with open(os.path.join(good, "dataset_manifest.json"), "w") as f:
        json.dump({"format_version": "2.0"}, f)
    with pytest.raises(ManifestError, match="format_version"):
        open_dataset(good)


@pytest.mark.parametrize("bad", ["../x.safetensors", "/abs/x.safetensors", "s3://bucket/x.safetensors",
                                 "sub/x.safetensors", "a\x00.safetensors", "..\\x.safetensors"])
def test_manifest_entries_that_are_not_plain_shard_names(good, bad):
    def rename(m):
        m["shards"][0]["shard_path"] = bad
        m["shards"].sort(key=lambda s: s["shard_path"])

    edit_manifest(good, rename)
    with pytest.raises(ManifestError, match="shard"):
        open_dataset(good)


def test_listed_shard_missing_or_of_another_size(good):
    name = handmade.shard_name(1)
    edit_manifest(good, lambda m: m["shards"][1].update(bytes=m["shards"][1]["bytes"] + 1) or m.update(
        total_bytes=m["total_bytes"] + 1))
    with pytest.raises(ShardError, match=rf"{name}: the file has \d+ bytes but dataset_manifest.json says \d+"):
        open_dataset(good)
    os.unlink(os.path.join(good, name))
    with pytest.raises(ShardError, match=rf"{name}: listed in dataset_manifest.json but missing"):
        open_dataset(good)


def test_header_disagreeing_with_the_manifest(tmp_path, good):
    def fresh(name):
        p = str(tmp_path / name)
        shutil.copytree(good, p)
        return p

    p = fresh("dtype")
    edit_manifest(p, lambda m: m["schema"]["x"].update(dtype="F64"))
    with pytest.raises(ShardError, match=r"tensor 'x' has dtype F32 but dataset_manifest.json schema says F64"):
        open_dataset(p)
    p = fresh("shape")
    edit_manifest(p, lambda m: m["schema"]["x"].update(shape=[4, 3]))
    with pytest.raises(ShardError, match=r"tensor 'x' has sample shape \[2\] but .* says \[3\]"):
        open_dataset(p)
    p = fresh("rows")
    edit_manifest(p, lambda m: (m["shards"][1].update(samples_count=3), m.update(total_samples=6)))
    with pytest.raises(ShardError, match=r"tensor 'x' has shape \[4, 2\]; .* says 3 samples \+ 0 padded = 3 rows"):
        open_dataset(p)
    p = fresh("missing")
    edit_manifest(p, lambda m: m["schema"].update(z={"dtype": "F32", "shape": [4]}))
    with pytest.raises(ShardError, match=r"no tensor 'z', a column of dataset_manifest.json schema"):
        open_dataset(p)
    p = fresh("garbage")
    shard = os.path.join(p, handmade.shard_name(0))
    size = os.path.getsize(shard)
    with open(shard, "r+b") as f:
        f.write(b"\xff" * 16)
    assert os.path.getsize(shard) == size
    with pytest.raises(ShardError, match=rf"{handmade.shard_name(0)}: invalid safetensors file: header too large"):
        open_dataset(p)


def test_errors_share_one_base_class():
    for cls in (ManifestError, ShardError, KeyNotFoundError, ColumnNotFoundError):
        assert issubclass(cls, SafetensorsSparkError)
    assert issubclass(KeyNotFoundError, KeyError) and issubclass(ShardError, ValueError)


# -- pickling and import cost -------------------------------------------------------------

def test_datasets_pickle_as_paths_and_manifest(good):
    ds = open_dataset(good)
    ds[0]  # opens the shard
    state = pickle.dumps(ds)
    assert b"mmap" not in state
    again = pickle.loads(state)
    assert again.manifest == ds.manifest and [int(again[i]["y"]) for i in range(7)] == list(range(7))
    it = pickle.loads(pickle.dumps(SafetensorsIterableDataset(good, batch_size=2, shuffle=True)))
    assert sorted(v for b in it for v in b["y"].tolist()) == list(range(7))


def test_import_starts_no_thread_and_does_not_import_torch_or_pyspark():
    import subprocess
    import sys

    code = ("import threading, sys, safetensors_spark; "
            "assert threading.active_count() == 1; "
            "assert 'torch' not in sys.modules and 'pyspark' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)
