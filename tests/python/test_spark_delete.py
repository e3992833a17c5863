"""DELETE through Spark (spec/dataset.md §5.11) with row provenance (spec/reading.md §2.1): a bad
sample found while training (the Python package's ``provenance=True``) is deleted by a predicate
on the provenance columns, both readers then miss it, and after a vacuum with retention 0 no file
of the dataset holds its bytes."""

import os

import numpy as np
from pyspark.sql import Row

import safetensors_spark
import safetensors_spark.spark as sspark
from safetensors_spark import open_dataset


def files_containing(root, needle):
    hits = []
    for d, _, files in os.walk(root):
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                if needle in fh.read():
                    hits.append(os.path.join(d, f))
    return hits


def write(spark, path, ids, mode="errorifexists"):
    df = spark.createDataFrame([Row(id=i, x=[float(i) + 0.125, float(-i) - 0.5]) for i in ids])
    (df.write.format("safetensors").option("batch_size", 4).option("retention", "0")
     .option("dtypes", '{"x": "F32"}').mode(mode).save(path))


def spark_ids(spark, path):
    return sorted(r.id for r in spark.read.format("safetensors").load(path).select("id").collect())


def test_a_sample_traced_by_provenance_is_deleted_by_sql_and_vacuumed_away(spark, tmp_path):
    path = str(tmp_path / "ds")
    write(spark, path, range(10))
    write(spark, path, range(10, 14), mode="append")
    ds = open_dataset(path, provenance=True)
    bad = next(s for s in ds if int(s["id"]) == 7)
    assert bad["_added_version"] == 1
    needle = np.asarray(bad["x"], np.float32).tobytes()
    assert files_containing(path, needle)
    # Spark names the same row by the same provenance
    seen = spark.read.format("safetensors").load(path) \
        .where(f"_file LIKE '%/{bad['_file']}' AND _row_index = {bad['_row_index']}").select("id").collect()
    assert [r.id for r in seen] == [7]
    spark.sql(f"DELETE FROM safetensors.`{path}` WHERE _file LIKE '%/{bad['_file']}' "
              f"AND _row_index = {bad['_row_index']}")
    assert spark_ids(spark, path) == [i for i in range(14) if i != 7]
    assert sorted(int(s["id"]) for s in open_dataset(path)) == [i for i in range(14) if i != 7]
    last = safetensors_spark.history(path)[-1]
    assert last["operation"] == "delete" and last["total_rows"] == 13
    safetensors_spark.vacuum(path, retention="0")
    assert files_containing(path, needle) == []


def test_pyspark_delete_by_condition_and_its_errors(spark, tmp_path):
    path = str(tmp_path / "ds")
    write(spark, path, range(8))
    out = sspark.delete(spark, path, "id % 4 = 1", commit_message="cleanup").collect()
    assert [(r.rows_removed, r.shards_replaced) for r in out] == [(2, 2)]
    assert spark_ids(spark, path) == [0, 2, 3, 4, 6, 7]
    assert safetensors_spark.history(path)[-1]["commit_message"] == "cleanup"
    for bad in ("", "   ", None):
        try:
            sspark.delete(spark, path, bad)
        except ValueError as e:
            assert "condition" in str(e)
        else:
            raise AssertionError(f"condition {bad!r} was accepted")
    assert spark_ids(spark, path) == [0, 2, 3, 4, 6, 7]


def test_pyspark_delete_keys_and_its_errors(spark, tmp_path):
    path = str(tmp_path / "kv")
    df = spark.createDataFrame([Row(name=f"k{i}", x=[float(i) + 0.125, 1.0]) for i in range(6)]).repartition(2)
    df.write.format("safetensors").option("name_col", "name").option("generate_index", "true").save(path)
    [r] = sspark.delete_keys(spark, path, ("k1", "k4"), commit_message="drop two").collect()
    assert (r.rows_removed, r.version) == (2, 2)
    assert sorted(open_dataset(path).keys()) == ["k0", "k2", "k3", "k5"]
    assert safetensors_spark.history(path)[-1]["commit_message"] == "drop two"
    for bad, what in (([], "empty"), ("k0", "list of key strings"), (["k0", 7], "key 1 is 7"),
                      (None, "list of key strings")):
        try:
            sspark.delete_keys(spark, path, bad)
        except ValueError as e:
            assert what in str(e), (bad, str(e))
        else:
            raise AssertionError(f"keys {bad!r} were accepted")
    batch = str(tmp_path / "batch")
    write(spark, batch, range(4))
    try:
        sspark.delete_keys(spark, batch, ["k0"])
    except Exception as e:  # py4j's error carries the JVM's message
        assert "batch layout" in str(e), str(e)
    else:
        raise AssertionError("a batch dataset was accepted")
    assert sorted(open_dataset(path).keys()) == ["k0", "k2", "k3", "k5"]


CLUSTER_SCRIPT = r"""
import sys
from pyspark.sql import SparkSession
import safetensors_spark.spark as sspark
jar, out = sys.argv[1], sys.argv[2]
spark = (SparkSession.builder.master("local-cluster[2,1,1024]").config("spark.jars", jar)
         .config("spark.sql.extensions", "io.safetensors.spark.SafetensorsExtensions")
         .config("spark.ui.enabled", "false").config("spark.executor.memory", "512m").getOrCreate())
df = spark.range(0, 40, numPartitions=4).selectExpr("id", "array(cast(id AS float), cast(-id AS float)) AS x")
df.write.format("safetensors").option("batch_size", 4).save(out)
spark.sql(f"DELETE FROM safetensors.`{out}` WHERE id % 10 = 3")
sspark.delete(spark, out, "id = 20").collect()
print(sorted(r.id for r in spark.read.format("safetensors").load(out).select("id").collect()))
spark.stop()
"""


def test_delete_on_a_local_cluster_runs_its_writers_and_rewrites_in_executors(connector_jar, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "cluster"
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    result = subprocess.run([sys.executable, "-c", CLUSTER_SCRIPT, str(connector_jar), str(out)], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    want = [i for i in range(40) if i % 10 != 3 and i != 20]
    assert result.stdout.strip().splitlines()[-1] == str(want)
    assert sorted(int(s["id"]) for s in open_dataset(str(out))) == want
    h = safetensors_spark.history(str(out))
    assert [v["operation"] for v in h] == ["create", "delete", "delete"]


def test_cli_delete_keys_of_an_indexed_kv_dataset_rebuilds_the_index_parts(spark, tmp_path, cli):
    path = str(tmp_path / "kv")
    df = spark.createDataFrame([Row(name=f"k{i}", v=[float(i), float(i) * 2]) for i in range(6)])
    (df.write.format("safetensors").option("name_col", "name").option("generate_index", "true")
     .option("dtypes", '{"v": "F32"}').save(path))
    keys = tmp_path / "keys.txt"
    keys.write_text("k1\nk4\n")
    r = cli("delete", "--keys", keys, path)
    assert r.returncode == 0, r.stderr
    m = safetensors_spark.open_dataset(path).manifest
    assert m["operation"] == "delete" and m["total_samples"] == 4
    parts = set(os.listdir(os.path.join(path, "_tensor_index.parquet")))
    assert all(s["shard_path"][: -len(".safetensors")] + ".parquet" in parts for s in m["shards"])

    def lookup(key):
        return [list(x["decoded"]) for x in spark.read.format("safetensors").load(path)
                .where(f"key = '{key}__v'").collect()]
    assert lookup("k1") == [] and lookup("k4") == []
    assert lookup("k5") == [[5.0, 10.0]]
    ds = open_dataset(path)
    assert sorted(ds.keys()) == ["k0", "k2", "k3", "k5"]
    np.testing.assert_array_equal(ds.get("k2")["v"], np.array([2.0, 4.0], np.float32))
