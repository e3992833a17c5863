"""A dataset read whole or not at all (spec/reading.md §6): a shard the manifest lists but that is
gone fails the query naming it (also a key lookup through the index), unless ignoreMissingFiles."""
import json
from pathlib import Path

from py4j.protocol import Py4JJavaError


def listed(path):
    return [s["shard_path"] for s in json.loads((Path(path) / "dataset_manifest.json").read_text())["shards"]]


def error_text(action):
    try:
        action()
    except Py4JJavaError as e:
        return str(e.java_exception)
    raise AssertionError("expected the query to fail")


def test_a_missing_listed_shard_fails_batch_reads_naming_it(spark, tmp_path):
    out = tmp_path / "batch"
    spark.createDataFrame([([float(i)],) for i in range(12)], "x array<float>").coalesce(1) \
        .write.format("safetensors").option("batch_size", 4).save(str(out))
    gone = listed(out)[1]
    (out / gone).unlink()
    reader = spark.read.format("safetensors")
    msg = error_text(lambda: reader.load(str(out)).count())
    assert gone in msg and "listed in" in msg and "dataset_manifest.json" in msg, msg
    # opted in: the rest is read, from the headers
    left = reader.option("ignoreMissingFiles", "true").load(str(out))
    assert sorted(r["x"][0] for r in left.collect()) == [float(i) for i in range(12) if not 4 <= i < 8]
    spark.conf.set("spark.sql.files.ignoreMissingFiles", "true")
    try:
        assert spark.read.format("safetensors").load(str(out)).count() == 8
    finally:
        spark.conf.unset("spark.sql.files.ignoreMissingFiles")


def test_a_missing_listed_shard_fails_index_lookups_naming_it(spark, tmp_path):
    out = tmp_path / "kv"
    spark.createDataFrame([(f"k{i}", [float(i)]) for i in range(30)], "k string, v array<float>").repartition(3) \
        .write.format("safetensors").option("name_col", "k").option("generate_index", "true").save(str(out))
    shards = listed(out)
    assert len(shards) == 3
    import pyarrow.parquet as pq
    index = pq.read_table(str(out / "_tensor_index.parquet")).to_pylist()
    holder = next(r["file_name"] for r in index if r["tensor_key"] == "k7__v")
    (out / holder).unlink()
    msg = error_text(lambda: spark.read.format("safetensors").load(str(out)).where("key = 'k7__v'").collect())
    assert holder in msg and "missing" in msg, msg
