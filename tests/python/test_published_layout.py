"""Datasets written by our Spark connector, read the way consumers of the published dataset layout
read them (spec/dataset.md §5.1, §6): the manifest's published fields, the consumer contract of the
peer connector's Python package (`from_path`, `list_shards`, `get_schema`, `assign_shards`,
`validate`, `describe`: its field names and meanings, written here from its description), and the
index read by name with Spark, pyarrow, pandas, DuckDB and polars."""
import heapq
import json
import struct
from pathlib import Path

import duckdb
import pandas as pd
import polars as pl
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest


class PublishedLayoutConsumer:
    """A consumer written against the published layout only: it knows `shard_path`,
    `samples_count`, `bytes`, `num_tensors`, `schema` and `manifest_version`, nothing of ours."""

    def __init__(self, path, manifest):
        self.path = path
        self.manifest = manifest

    @classmethod
    def from_path(cls, path):
        fs = pafs.LocalFileSystem()
        with fs.open_input_stream(f"{path}/dataset_manifest.json") as f:
            return cls(path, json.loads(f.read()))

    def list_shards(self):
        return [(s["shard_path"], s["samples_count"], s.get("num_tensors", 0)) for s in self.manifest["shards"]]

    def get_schema(self):
        return self.manifest["schema"]

    def assign_shards(self, num_workers, strategy="round_robin"):
        shards = self.list_shards()
        if strategy == "round_robin":
            return [[s[0] for i, s in enumerate(shards) if i % num_workers == w] for w in range(num_workers)]
        heap = [(0, w) for w in range(num_workers)]
        out = [[] for _ in range(num_workers)]
        for name, n, _ in sorted(shards, key=lambda s: -s[1]):
            load, w = heapq.heappop(heap)
            out[w].append(name)
            heapq.heappush(heap, (load + n, w))
        return out

    def validate(self):
        fs = pafs.LocalFileSystem()
        infos = fs.get_file_info([f"{self.path}/{s[0]}" for s in self.list_shards()])
        return {
            "has_manifest": "manifest_version" in self.manifest,
            "has_shards": bool(self.manifest["shards"]),
            "shards_exist": all(i.type == pafs.FileType.File for i in infos),
        }

    def describe(self):
        return f"{len(self.list_shards())} shards, {self.manifest['total_samples']} samples, {self.manifest['total_bytes']} bytes"


def header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def test_batch_dataset_through_the_published_consumer(spark, tmp_path):
    out = tmp_path / "batch"
    df = spark.createDataFrame([([float(i)] * 3, i) for i in range(11)], "x array<float>, y long").coalesce(1)
    df.write.format("safetensors").option("batch_size", 4).option("tail_strategy", "pad").save(str(out))
    c = PublishedLayoutConsumer.from_path(str(out))
    m = c.manifest
    assert (m["format_version"], m["safetensors_version"]) == ("1.0", "1.0")
    assert c.get_schema() == {"x": {"dtype": "F32", "shape": [4, 3]}, "y": {"dtype": "I64", "shape": [4]}}
    shards = c.list_shards()
    assert [s[1] for s in shards] == [4, 4, 3]  # real rows; the padded row is not a sample
    assert m["total_samples"] == 11 and m["total_bytes"] == sum((out / s[0]).stat().st_size for s in shards)
    for name, samples, num_tensors in shards:
        h = header(out / name)
        tensors = {k: v for k, v in h.items() if k != "__metadata__"}
        assert num_tensors == len(tensors) == 2
        # a consumer reading samples_count rows from the front of a shard reads only real rows
        assert all(t["shape"][0] >= samples for t in tensors.values())
        assert h["__metadata__"]["safetensors_spark.samples"] == str(samples)
    assert c.validate() == {"has_manifest": True, "has_shards": True, "shards_exist": True}
    assert sorted(sum(c.assign_shards(2), [])) == sorted(s[0] for s in shards)
    assert sorted(sum(c.assign_shards(2, "balance"), [])) == sorted(s[0] for s in shards)
    assert c.describe() == f"3 shards, 11 samples, {m['total_bytes']} bytes"


def test_kv_dataset_through_the_published_consumer(spark, tmp_path):
    out = tmp_path / "kv"
    df = spark.createDataFrame([(f"k{i}", [float(i)] * (1 + i % 2)) for i in range(6)], "k string, v array<double>")
    df.write.format("safetensors").option("name_col", "k").save(str(out))
    c = PublishedLayoutConsumer.from_path(str(out))
    assert c.get_schema() == {"v": {"dtype": "F64", "shape": None}}  # rows differ in shape
    assert c.manifest["total_samples"] == 6 == sum(s[1] for s in c.list_shards())
    assert c.validate()["shards_exist"]


@pytest.fixture(scope="module")
def indexed(spark, tmp_path_factory):
    out = tmp_path_factory.mktemp("indexed") / "ds"
    df = spark.createDataFrame([(f"k{i:03d}", [float(i)] * 4) for i in range(40)], "k string, v array<float>")
    df.repartition(3).write.format("safetensors").option("name_col", "k").option("generate_index", "true").save(str(out))
    return out


def expected_rows(out):
    rows = set()
    for s in json.loads((out / "dataset_manifest.json").read_text())["shards"]:
        h = header(out / s["shard_path"])
        rows |= {(k, s["shard_path"]) for k in h if k != "__metadata__"}
    return rows


def test_index_is_read_by_name_by_spark(spark, indexed):
    df = spark.read.parquet(str(indexed / "_tensor_index.parquet"))
    assert {(r["tensor_key"], r["file_name"]) for r in df.select("tensor_key", "file_name").collect()} == expected_rows(indexed)
    assert df.columns[:2] == ["tensor_key", "file_name"] and "dtype" in df.columns and "shape" in df.columns


def test_index_is_read_by_name_by_pyarrow_and_pandas(indexed):
    path = str(indexed / "_tensor_index.parquet")
    t = pq.read_table(path)
    assert set(zip(t["tensor_key"].to_pylist(), t["file_name"].to_pylist())) == expected_rows(indexed)
    p = pd.read_parquet(path)
    assert set(zip(p["tensor_key"], p["file_name"])) == expected_rows(indexed)


def test_index_is_read_by_duckdb_and_polars(indexed):
    parts = str(indexed / "_tensor_index.parquet" / "*.parquet")
    got = duckdb.sql(f"select tensor_key, file_name from read_parquet('{parts}')").fetchall()
    assert set(got) == expected_rows(indexed) and len(got) == len(expected_rows(indexed))
    df = pl.read_parquet(parts)
    assert set(zip(df["tensor_key"].to_list(), df["file_name"].to_list())) == expected_rows(indexed)
    # one part per listed shard, named after it (spec/dataset.md §6.1), and nothing else
    shards = [s["shard_path"] for s in json.loads((indexed / "dataset_manifest.json").read_text())["shards"]]
    assert sorted(p.name for p in (indexed / "_tensor_index.parquet").iterdir()) == \
        sorted(s[: -len(".safetensors")] + ".parquet" for s in shards)
