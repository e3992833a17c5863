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


def test_kv_get_through_the_index_reads_only_the_holding_shards_header(tmp_path):
    path = str(tmp_path / "kv")
    values = handmade.write_kv_dataset(path, [["a", "b", "c"], ["d", "e"]])
    handmade.write_index(path)
    ds = open_dataset(path, check_headers=False)
    got = ds.get("e")
    assert got["emb"].tolist() == values["e"]["emb"].tolist() and int(got["label"]) == int(values["e"]["label"])
    read = lambda: [s.header is not None for s in ds.shards]  # noqa: E731
    assert read() == [False, True], "the index finds the shard; only its header is read (to check the rows)"
    with pytest.raises(KeyNotFoundError, match="key 'zz' not found"):
        ds.get("zz")
    assert read() == [False, True]
    # one part per listed shard (spec/dataset.md §6.1): other files in the directory are not read
    with open(f"{path}/_tensor_index.parquet/part-00000000000000000000.parquet", "wb") as f:
        f.write(b"a part of the earlier layout that must not be read")
    ds = open_dataset(path, check_headers=False)
    assert ds.get("a")["emb"].tolist() == values["a"]["emb"].tolist()
    assert read() == [True, False]
    # a shard without its part is not covered: its header answers for its keys
    m = handmade.read_manifest(path)
    second = m["shards"][1]["shard_path"]
    os.remove(f"{path}/_tensor_index.parquet/{second[:-len('.safetensors')]}.parquet")
    ds = open_dataset(path, check_headers=False)
    with pytest.raises(KeyNotFoundError, match="key 'zz' not found"):
        ds.get("zz")
    assert read() == [False, True]
    assert ds.get("a")["emb"].tolist() == values["a"]["emb"].tolist()
    assert ds.get("e")["emb"].tolist() == values["e"]["emb"].tolist()
    assert read() == [True, True]


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


def tamper_index(path, shard, fn):
    """Rewrites one index part: ``fn(rows)`` edits ``{tensor_key: row dict}`` in place (or drops
    rows from it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    part = f"{path}/_tensor_index.parquet/{shard[: -len('.safetensors')]}.parquet"
    table = pq.read_table(part)
    rows = {r["tensor_key"]: r for r in table.to_pylist()}
    fn(rows)
    pq.write_table(pa.Table.from_pylist(list(rows.values()), schema=table.schema), part)
    return part


@pytest.mark.parametrize("tamper", ["another_key", "header_bytes", "past_the_end", "dtype", "shape", "name",
                                    "negative_start", "negative_dim"])
def test_index_rows_are_checked_against_the_shard_header(tmp_path, tamper):
    """A damaged or tampered index part never makes get() return other bytes: every row of the key
    is checked against the holding shard's header (spec/python.md §2), and a disagreement names
    the dataset, the part, the key and what disagrees."""
    path = str(tmp_path / "kv")
    values = handmade.write_kv_dataset(path, [["a", "b", "c"], ["d"]])
    handmade.write_index(path)
    shard = handmade.read_manifest(path)["shards"][0]
    size = shard["bytes"]

    def edit(rows):
        b, a = rows["b__emb"], rows["a__emb"]
        if tamper == "another_key":
            b["data_start"], b["data_end"] = a["data_start"], a["data_end"]
        elif tamper == "header_bytes":
            b["data_start"], b["data_end"] = 8, 16
        elif tamper == "past_the_end":
            b["data_start"], b["data_end"] = size, size + 8
        elif tamper == "dtype":  # same size, another type: the bytes would be read as I32
            b["dtype"] = "I32"
        elif tamper == "shape":
            b["shape"] = [1, 2]
        elif tamper == "negative_start":  # issue #39 item 9: was an OverflowError naming nothing
            b["data_start"] = -5
        elif tamper == "negative_dim":
            b["shape"] = [-2]
        else:  # the row of key b points at key a's tensor, range and all
            b.update(tensor_key="a__emb", data_start=a["data_start"], data_end=a["data_end"])

    part = tamper_index(path, shard["shard_path"], edit)
    what = {"another_key": r"byte range \[\d+, \d+\) \(header: \[\d+, \d+\)\)", "header_bytes": r"byte range \[8, 16\)",
            "past_the_end": rf"byte range \[{size}, {size + 8}\)", "dtype": r"dtype I32 \(header: F32\)",
            "shape": r"shape \[1, 2\] \(header: \[2\]\)",
            "name": r"the row for tensor 'a__emb' has sample_key 'b' and column 'emb'",
            "negative_start": r"tensor 'b__emb': data_start -5 is negative",
            "negative_dim": r"tensor 'b__emb': shape \[-2\] has a negative dimension"}[tamper]
    for check_headers in (False, True):
        ds = open_dataset(path, check_headers=check_headers)
        with pytest.raises(safetensors_spark.IndexFileError) as e:
            ds.get("b")
        msg = str(e.value)
        assert msg.startswith(f"{part}: key 'b' of dataset {path} disagrees with the header of {shard['shard_path']}"), msg
        assert __import__("re").search(what, msg), msg
        # the other keys' rows still agree with the header
        assert ds.get("a")["emb"].tolist() == values["a"]["emb"].tolist()
        assert ds.get("d", columns="label")["label"].tolist() == values["d"]["label"].tolist()


def test_an_index_part_that_lost_rows_or_claims_another_shards_key(tmp_path):
    """A part without the manifest's num_tensors rows does not cover its shard (its header answers,
    as in Spark); a key with rows in the parts of two shards is an error naming both."""
    path = str(tmp_path / "kv")
    values = handmade.write_kv_dataset(path, [["a", "b", "c"], ["d"]])
    handmade.write_index(path)
    first, second = (s["shard_path"] for s in handmade.read_manifest(path)["shards"])
    tamper_index(path, first, lambda rows: [rows.pop(k) for k in ("b__emb", "b__label")])
    ds = open_dataset(path)
    assert ds.get("b")["emb"].tolist() == values["b"]["emb"].tolist()
    assert [s.name in ds._index_parts() for s in ds.shards] == [False, True]
    handmade.write_index(path)

    def claim_a(rows):
        for r in rows.values():
            r.update(sample_key="a", tensor_key=f"a__{r['column']}")

    part = tamper_index(path, second, claim_a)
    with pytest.raises(safetensors_spark.IndexFileError, match=f"key 'a' has rows in the index parts of several "
                       f"shards: .*{first[:-12]}.parquet.*{part}"):
        open_dataset(path).get("a")


def test_an_index_row_whose_sample_key_was_changed_is_an_index_error_not_a_missing_key(tmp_path):
    """Issue #39 item 9: a part whose rows of key b now say sample_key 'zz' (row count intact, so
    it still covers its shard): get('b') is an IndexFileError naming the part, not "not found";
    a key no shard holds is still KeyNotFoundError."""
    path = str(tmp_path / "kv")
    handmade.write_kv_dataset(path, [["a", "b", "c"], ["d"]])
    handmade.write_index(path)
    first = handmade.read_manifest(path)["shards"][0]["shard_path"]

    def rename_b(rows):
        for k in ("b__emb", "b__label"):
            rows[k]["sample_key"] = "zz"

    part = tamper_index(path, first, rename_b)
    ds = open_dataset(path)
    with pytest.raises(safetensors_spark.IndexFileError,
                       match=rf"{part}: key 'b' of dataset {path} disagrees with the header of {first}: the row "
                             r"for tensor 'b__emb' has sample_key 'zz'"):
        ds.get("b")
    with pytest.raises(KeyNotFoundError, match="key 'e' not found"):
        ds.get("e")


@pytest.mark.parametrize("group_rows", [6, 5])
def test_kv_get_reads_only_the_row_groups_that_can_hold_the_key(tmp_path, monkeypatch, group_rows):
    """Hits and misses across several row groups and parts: per part only the row groups whose
    sample_key statistics can hold the key are read (with 5 rows a group, some keys' two rows
    straddle two groups, and both are read)."""
    import pyarrow.parquet as pq

    path = str(tmp_path / "kv")
    keys = [f"k{i:03d}" for i in range(40)]
    values = handmade.write_kv_dataset(path, [keys[:25], keys[25:]])
    handmade.write_index(path, row_group_size=group_rows)  # 2 rows a key
    groups = pq.ParquetFile(f"{path}/_tensor_index.parquet/{handmade.shard_name(0)[:-12]}.parquet").num_row_groups
    assert groups == -(-50 // group_rows)
    reads = []
    real = pq.ParquetFile.read_row_groups
    monkeypatch.setattr(pq.ParquetFile, "read_row_groups",
                        lambda self, groups, *a, **kw: reads.append(list(groups)) or real(self, groups, *a, **kw))
    ds = open_dataset(path)
    for key in keys:
        reads.clear()
        got = ds.get(key)
        assert got["emb"].tolist() == values[key]["emb"].tolist()
        assert int(got["label"]) == int(values[key]["label"])
        straddles = group_rows % 2 and (2 * (keys.index(key) % 25)) % group_rows == group_rows - 1
        assert len(reads) == 1 and len(reads[0]) == (2 if straddles else 1), (key, reads)  # one part
    for miss in ["a", "k", "k0245", "k024a", "k1", "zz"]:
        reads.clear()
        with pytest.raises(KeyNotFoundError, match=f"key '{miss}' not found"):
            ds.get(miss)
        assert sum(len(r) for r in reads) <= 1, (miss, reads)
    assert all(s.kv is None for s in ds.shards), "no lookup split a header into Python objects"


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
    it = SafetensorsIterableDataset(open_dataset("countmem://remote1", prefetch=0), batch_size=16, columns=["y"])
    CountingMemoryFS.bytes_read = 0
    first = next(iter(it))
    assert first["y"].tolist() == list(range(16))
    # the shard's header comes with its first use (checked against the manifest then; the open
    # read only the manifest), then an unshuffled batch of one column is one range read of its rows
    assert CountingMemoryFS.bytes_read == HEADER_READ_AHEAD + 16 * 8, CountingMemoryFS.bytes_read
    # with read-ahead (the default): the selected column of the shards the epoch reads next, one
    # range GET per shard, never the other column (spec/python.md §2.1)
    it = SafetensorsIterableDataset("countmem://remote1", batch_size=1000, columns=["y"])
    CountingMemoryFS.bytes_read = 0
    assert [v for b in it for v in b["y"].tolist()] == list(range(2 * rows))
    assert CountingMemoryFS.bytes_read == 2 * (HEADER_READ_AHEAD + rows * 8)


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
    """The open reads the manifest only; each shard's header is checked against it the first
    time the shard is used in this process (spec/python.md §2): a disagreement is a ShardError
    naming the shard, raised at that use and at every later one, never data. A shard that agrees
    reads as usual beside it."""
    def fresh(name):
        p = str(tmp_path / name)
        shutil.copytree(good, p)
        return p

    def fails_when_touched(p, i, match):
        ds = open_dataset(p)  # no header read: nothing fails yet
        for _ in range(2):
            with pytest.raises(ShardError, match=match):
                ds[i]
        with pytest.raises(ShardError, match=match):
            list(SafetensorsIterableDataset(ds, batch_size=2))
        return ds

    p = fresh("dtype")
    edit_manifest(p, lambda m: m["schema"]["x"].update(dtype="F64"))
    fails_when_touched(p, 0, r"tensor 'x' has dtype F32 but dataset_manifest.json schema says F64")
    p = fresh("shape")
    edit_manifest(p, lambda m: m["schema"]["x"].update(shape=[4, 3]))
    fails_when_touched(p, 0, r"tensor 'x' has sample shape \[2\] but .* says \[3\]")
    p = fresh("rows")
    edit_manifest(p, lambda m: (m["shards"][1].update(samples_count=3), m.update(total_samples=6)))
    ds = fails_when_touched(p, 5, rf"{handmade.shard_name(1)}: tensor 'x' has shape \[4, 2\]; .* says 3 samples "
                                  rf"\+ 0 padded = 3 rows")
    assert int(ds[1]["y"]) == 1  # shard 0 agrees with the manifest
    p = fresh("missing")
    edit_manifest(p, lambda m: m["schema"].update(z={"dtype": "F32", "shape": [4]}))
    fails_when_touched(p, 0, r"no tensor 'z', a column of dataset_manifest.json schema")
    p = fresh("garbage")
    shard = os.path.join(p, handmade.shard_name(0))
    size = os.path.getsize(shard)
    with open(shard, "r+b") as f:
        f.write(b"\xff" * 16)
    assert os.path.getsize(shard) == size
    ds = fails_when_touched(p, 0, rf"{handmade.shard_name(0)}: invalid safetensors file: header too large")
    assert int(ds[len(ds) - 1]["y"]) == len(ds) - 1


def test_errors_share_one_base_class():
    for cls in (ManifestError, ShardError, KeyNotFoundError, ColumnNotFoundError):
        assert issubclass(cls, SafetensorsSparkError)
    assert issubclass(KeyNotFoundError, KeyError) and issubclass(ShardError, ValueError)


# -- pickling and import cost -------------------------------------------------------------

def test_datasets_pickle_as_paths_and_manifest(good):
    ds = open_dataset(good)
    ds[0]  # opens a memory map
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
