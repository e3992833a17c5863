"""Smoke run of one connector jar on one Spark line: write (batch and KV mode) and read back.

Also a DELETE of whole partitions: SQL on 4.x, SafetensorsDataset.delete on 3.5 (where SQL DELETE
cannot reach this source; the smoke checks it fails and changes nothing).

Usage: python smoke.py JAR SPARK_LINE WORK_DIR    (e.g. `smoke.py …/safetensors-spark-0.1.0.jar 4.2 /tmp/x`)

The session has the connector's extensions class: the writes run through its save(path) plan
node (the SQL tab shows the rows written) and the tensor functions are called once. Run by tests/spark-lines/run.sh with the pyspark
of the line under test on sys.path. Exits
non-zero (with the error) when the running Spark is not of SPARK_LINE, when the jar does not load,
or when a write or read fails or gives back other values than were written; every value is
checked both through Spark's read path and in the shards themselves with the `safetensors` package.
"""
import json
import os
import sys
from pathlib import Path

import numpy as np
import pyspark
import safetensors.numpy
from pyspark.sql import SparkSession
from pyspark.sql import types as T

ROWS = 10


def fail(msg):
    raise SystemExit(f"spark-lines smoke FAILED: {msg}")


def check(cond, msg):
    if not cond:
        fail(msg)


def expected_rows():
    """id (long), x (3 floats, exact in F32), y (int), k (the KV key)."""
    return [(i, [i * 0.5, -i * 1.25, i + 0.125], i * 7 - 20, f"key{i:02d}") for i in range(ROWS)]


def shards(path):
    manifest = json.loads((path / "dataset_manifest.json").read_text())
    files = [path / s["shard_path"] for s in manifest["shards"]]
    check(files, f"{path}: the manifest lists no shard")
    check(all(f.is_file() for f in files), f"{path}: a listed shard is missing: {files}")
    return manifest, files


def sql_tab_values(spark, metric):
    """Every value of the SQL metric named `metric` the SQL tab's store holds (py4j; Spark 3.5 and 4.x)."""
    spark._jsc.sc().listenerBus().waitUntilEmpty()
    store = spark._jsparkSession.sharedState().statusStore()
    execs = store.executionsList()
    values = []
    for i in range(execs.size()):
        e = execs.apply(i)
        ids = [e.metrics().apply(j).accumulatorId() for j in range(e.metrics().size())
               if e.metrics().apply(j).name() == metric]
        shown = store.executionMetrics(e.executionId()).iterator()
        while shown.hasNext():
            kv = shown.next()
            if kv._1() in ids:
                values.append(kv._2())
    return values


def batch_mode(spark, df, out):
    df.select("id", "x", "y").write.format("safetensors").option("batch_size", 4).save(str(out))
    # Spark's read path: the rows written come back (per-sample layout).
    back = spark.read.format("safetensors").load(str(out))
    check(back.columns == ["id", "x", "y"], f"batch read: columns {back.columns}")
    got = sorted((r.id, list(r.x), r.y) for r in back.collect())
    want = [(i, x, y) for i, x, y, _ in expected_rows()]
    check(got == want, f"batch read: rows differ\n got  {got}\n want {want}")
    # The shards, opened by the reference package, hold the same values.
    manifest, files = shards(out)
    ids, xs, ys = [], [], []
    for f in files:
        t = safetensors.numpy.load_file(str(f))
        check(t["id"].dtype == np.int64 and t["x"].dtype == np.float32 and t["y"].dtype == np.int32,
              f"{f.name}: dtypes {[(k, v.dtype) for k, v in t.items()]}")
        ids += t["id"].tolist()
        xs += t["x"].tolist()
        ys += t["y"].tolist()
    check(sum(s["samples_count"] for s in manifest["shards"]) == ROWS, "batch: manifest samples_count")
    check(sorted(zip(ids, xs, ys)) == want, "batch: shard contents differ from the rows written")
    return len(files)


def read_stream(spark, src, out, ck):
    """readStream of the batch dataset into a second one (one shard per micro-batch), then an append
    followed after a restart from the checkpoint: every row once (spec/reading.md §8)."""
    def drain():
        q = (spark.readStream.format("safetensors").option("maxFilesPerTrigger", 1).load(str(src))
             .writeStream.format("safetensors").option("checkpointLocation", str(ck))
             .option("batch_size", 4).trigger(availableNow=True).start(str(out)))
        q.awaitTermination()
        return sum(1 for p in q.recentProgress if p["numInputRows"] > 0)
    first = drain()
    spark.createDataFrame([(100, [1.0, 2.0, 3.0], 7)], "id long, x array<float>, y int").write \
        .format("safetensors").option("batch_size", 4).mode("append").save(str(src))
    second = drain()
    got = sorted(r.id for r in spark.read.format("safetensors").load(str(out)).collect())
    want = sorted([i for i, _, _, _ in expected_rows()] + [100])
    check(got == want and second == 1, f"readStream: {first}+{second} batches, ids {got}, want {want}")
    return first


def ragged_read(spark, out):
    """A ragged dataset built by hand (tests/python/ragged_data.py) reads back per sample."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
    from ragged_data import Column, build_dataset
    columns = {"id": Column("fixed", "I64"), "tokens": Column("array", "I32"),
               "boxes": Column("array", "F32", [2]), "text": Column("string")}
    rows = {"id": [np.int64(i) for i in range(5)],
            "tokens": [np.arange(i, dtype=np.int32) for i in range(5)],
            "boxes": [np.full((i % 3, 2), i, np.float32) for i in range(5)],
            "text": ["", "a", "é字", "😀", "xyz"]}
    build_dataset(out, columns, [rows], padded=[2])
    back = spark.read.format("safetensors").option("read_batch_rows", "2").load(str(out))
    types = [f.dataType.simpleString() for f in back.schema.fields]
    check(types == ["bigint", "array<int>", "array<array<float>>", "string"], f"ragged read: types {types}")
    got = sorted((r.id, list(r.tokens), [list(b) for b in r.boxes], r.text) for r in back.collect())
    want = [(i, list(range(i)), [[float(i)] * 2] * (i % 3), rows["text"][i]) for i in range(5)]
    check(got == want, f"ragged read: rows differ\n got  {got}\n want {want}")


def kv_mode(spark, df, out):
    df.select("k", "x", "y").write.format("safetensors").option("name_col", "k").save(str(out))
    # Spark's read path (per-tensor layout): one row per key and column, raw bytes and shape.
    back = spark.read.format("safetensors").load(str(out)).select("key", "dtype", "shape", "data")
    got = {r.key: (r.dtype, list(r.shape), bytes(r.data)) for r in back.collect()}
    want = {}
    for _, x, y, k in expected_rows():
        want[f"{k}__x"] = ("F32", [3], np.array(x, dtype="<f4").tobytes())
        want[f"{k}__y"] = ("I32", [], np.array(y, dtype="<i4").tobytes())
    check(got == want, f"KV read: tensors differ\n got  {sorted(got)}\n want {sorted(want)}")
    # The shards, opened by the reference package.
    _, files = shards(out)
    loaded = {}
    for f in files:
        loaded.update(safetensors.numpy.load_file(str(f)))
    check(sorted(loaded) == sorted(want), f"KV shards: keys {sorted(loaded)}")
    for name, (_, shape, raw) in want.items():
        check(list(loaded[name].shape) == shape and loaded[name].tobytes() == raw, f"KV shards: {name} differs")
    return len(files)


def partition_delete(spark, df, out, line):
    """A DELETE whose condition names the partition column only (spec/dataset.md §5.11) empties the
    matching partition directories from their manifests, reading no shard. Spark 4.x: SQL
    ``DELETE FROM safetensors.`path` `` (the table's SupportsDelete). Spark 3.5 cannot run SQL
    DELETE on this source (no SQL on files there, and its session catalog resolves a `USING
    safetensors` table through the V1 path, which refuses a DataSource V2 source): the SQL fails
    and changes nothing, and ``SafetensorsDataset.delete`` does the same delete."""
    df.select("id", "x", "y").withColumn("split", (df.id % 2).cast("string")).write.format("safetensors") \
        .option("batch_size", 4).partitionBy("split").save(str(out))
    # the shards of split=1 garbled (same size): a DELETE that read them would fail
    for f in (out / "split=1").glob("*.safetensors"):
        f.write_bytes(b"\x7f" * f.stat().st_size)
    statement = f"DELETE FROM safetensors.`{out}` WHERE split = '1'"
    if line.startswith("3."):
        try:
            spark.sql(statement)
        except Exception as e:  # noqa: BLE001 - any refusal; what matters is that nothing changed
            check("UNSUPPORTED_DATASOURCE_FOR_DIRECT_QUERY" in str(e), f"3.5 SQL DELETE: {str(e)[:300]}")
        else:
            fail("SQL DELETE on Spark 3.5 ran; spec/dataset.md §5.11 says it cannot")
        before = json.loads((out / "split=1" / "dataset_manifest.json").read_text())
        check(before.get("operation") != "delete", "3.5: the refused SQL DELETE changed split=1")
        spark._jvm.io.safetensors.spark.SafetensorsDataset.delete(
            spark._jsparkSession, str(out), "split = '1'").collect()
    else:
        spark.sql(statement)
    manifest = json.loads((out / "split=1" / "dataset_manifest.json").read_text())
    check(manifest.get("operation") == "delete" and manifest["shards"] == [],
          f"partition DELETE: split=1's manifest {manifest.get('operation')}, {len(manifest['shards'])} shards")
    got = sorted(r.id for r in spark.read.format("safetensors").load(str(out)).collect())
    want = [i for i, _, _, _ in expected_rows() if i % 2 == 0]
    check(got == want, f"partition DELETE: ids {got}, want {want}")


def main():
    jar, line, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    check(Path(jar).is_file(), f"no jar at {jar}")
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName(f"safetensors-spark-smoke-{line}")
        .config("spark.jars", jar)
        .config("spark.sql.extensions", "io.safetensors.spark.SafetensorsExtensions")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    try:
        spark.sparkContext.setLogLevel("ERROR")
        version = spark.version
        check(version == line or version.startswith(line + "."),
              f"running Spark {version} (pyspark {pyspark.__version__} from {pyspark.__file__}), expected line {line}")
        schema = T.StructType([
            T.StructField("id", T.LongType(), False),
            T.StructField("x", T.ArrayType(T.FloatType(), False), False),
            T.StructField("y", T.IntegerType(), False),
            T.StructField("k", T.StringType(), False),
        ])
        df = spark.createDataFrame(expected_rows(), schema).repartition(2)
        n_batch = batch_mode(spark, df, work / "batch")
        shown = sql_tab_values(spark, "safetensors rows written")
        check(shown == [str(ROWS)], f"SQL tab: 'safetensors rows written' of the batch write: {shown}")
        n_kv = kv_mode(spark, df, work / "kv")
        n_stream = read_stream(spark, work / "batch", work / "stream", work / "stream-ck")
        ragged_read(spark, work / "ragged")
        partition_delete(spark, df, work / "partitioned", line)
        # the extensions class's functions
        (v,) = spark.sql("SELECT st_to_array(arr_to_st(array(array(1.5f, -2.0f), array(0.25f, 8.0f)), 'BF16')) AS v").first()
        check(v == [[1.5, -2.0], [0.25, 8.0]], f"arr_to_st/st_to_array: {v}")
        print(f"spark-lines smoke: Spark {version}, jar {Path(jar).name}: "
              f"batch write+read ({n_batch} shards), KV write+read ({n_kv} shards), readStream "
              f"({n_stream} micro-batches), a ragged read and a partition DELETE OK")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
