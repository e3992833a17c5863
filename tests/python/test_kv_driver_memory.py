"""The driver of a KV write holds O(shards), not O(keys) (spec/dataset.md §6.1): a write of 1M keys
with generate_index=true, in a driver JVM of 512 MiB (local[2]: the tasks run in it too), succeeds,
and a lookup through its index finds a key. The O(keys) driver of before (every KV tensor in the
task reports, parsed and re-serialised on the driver) ran out of heap here.

The session must start its own JVM (spark.driver.memory applies at launch only), so the write runs
in a child Python process."""
import json
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent('''
    import json, sys
    from pyspark.sql import SparkSession, functions as F
    jar, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    spark = (SparkSession.builder.master("local[2]").appName("kv-driver-memory")
             .config("spark.jars", jar).config("spark.ui.enabled", "false")
             .config("spark.driver.memory", "512m").config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.range(n, numPartitions=2).select(
        F.format_string("key-%08d", F.col("id")).alias("k"),
        F.array(*[(F.col("id") + i).cast("float") for i in range(8)]).alias("v"))
    df.write.format("safetensors").option("name_col", "k").option("generate_index", "true").save(out)
    hit = (spark.read.format("safetensors").option("layout", "tensor").load(out)
           .where(F.col("key") == "key-00123457__v").select("key").collect())
    heap = spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory()
    print(json.dumps({"hit": [r.key for r in hit], "max_heap": heap}))
    spark.stop()
''')


def test_a_kv_write_of_a_million_keys_with_an_index_fits_a_small_driver(connector_jar, tmp_path):
    out = tmp_path / "kv"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    p = subprocess.run([sys.executable, "-c", CHILD, str(connector_jar), str(out), "1000000"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result["max_heap"] < 600 * 2**20, result
    assert result["hit"] == ["key-00123457__v"]
    manifest = json.loads((out / "dataset_manifest.json").read_text())
    assert manifest["total_samples"] == 1_000_000
    # every listed shard has its index part, and together they list every key once
    import pyarrow.parquet as pq
    parts = sorted(p.name for p in (out / "_tensor_index.parquet").iterdir())
    assert parts == sorted(s["shard_path"][: -len(".safetensors")] + ".parquet" for s in manifest["shards"])
    assert pq.read_table(str(out / "_tensor_index.parquet")).num_rows == 1_000_000
