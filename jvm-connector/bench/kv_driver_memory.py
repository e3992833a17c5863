"""KV write of N keys x 8 floats with generate_index=true in a driver of 1 GiB, then a key lookup
through the index (spec/performance.md §11). Not part of CI: 10M keys take minutes.

    SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python jvm-connector/bench/kv_driver_memory.py \\
        --rows 10000000 --out /tmp/kv10m

Prints one JSON object: rows, partitions, write seconds, the driver JVM's peak RSS (VmHWM of
/proc/<pid>/status; local[2], so the tasks run in it too), its max heap, shards, index parts,
and two lookups' seconds (each a new DataFrame, `key = ...`, collect; the second one of a key in
another shard, once the read path is warm). Then the same two keys through the Python package in
a new process (`py_open_s`: `open_dataset(out)`, which checks every header against the manifest;
`py_lookup_s`, `py_lookup2_s`: `ds.get(key)`)."""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time

from pyspark.sql import SparkSession, functions as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--driver-memory", default="1g")
    ap.add_argument("--out", required=True)
    ap.add_argument("--jar", help="the connector jar (default: the one in jvm-connector/target)")
    ap.add_argument("--lookup-only", action="store_true",
                    help="skip the write: only the lookups, on the dataset already at --out")
    args = ap.parse_args()
    jar = [args.jar] if args.jar else glob.glob(
        os.path.join(os.path.dirname(__file__), "..", "target", "safetensors-spark-*.jar"))
    assert len(jar) == 1, jar
    spark = (SparkSession.builder.master("local[2]").appName("kv-driver-memory")
             .config("spark.jars", jar[0]).config("spark.ui.enabled", "false")
             .config("spark.driver.memory", args.driver_memory).config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    jvm = spark.sparkContext._jvm
    pid = jvm.java.lang.ProcessHandle.current().pid()
    write_s = None
    if not args.lookup_only:
        shutil.rmtree(args.out, ignore_errors=True)
        df = spark.range(args.rows, numPartitions=args.partitions).select(
            F.format_string("key-%09d", F.col("id")).alias("k"),
            F.array(*[(F.col("id") + i).cast("float") for i in range(8)]).alias("v"))
        t0 = time.time()
        df.write.format("safetensors").option("name_col", "k").option("generate_index", "true").save(args.out)
        write_s = round(time.time() - t0, 1)
    with open(f"/proc/{pid}/status") as f:
        hwm_kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
    def lookup(key):
        t0 = time.time()
        hit = (spark.read.format("safetensors").load(args.out).where(F.col("key") == key)
               .select("key", "decoded").collect())
        return round(time.time() - t0, 2), [r.key for r in hit]

    # The first lookup right after the write; the second, of a key in another shard, with the
    # read path's classes loaded and compiled.
    lookup_s, hit = lookup(f"key-{args.rows * 7 // 10:09d}__v")
    lookup2_s, hit2 = lookup(f"key-{args.rows * 3 // 10:09d}__v")
    spark.stop()
    py = python_lookups(args.out, [f"key-{args.rows * 7 // 10:09d}", f"key-{args.rows * 3 // 10:09d}"])
    manifest = json.load(open(os.path.join(args.out, "dataset_manifest.json")))
    print(json.dumps({
        "rows": args.rows, "partitions": args.partitions, "write_s": write_s,
        "driver_peak_rss_mib": hwm_kb // 1024,
        "driver_max_heap_mib": jvm.java.lang.Runtime.getRuntime().maxMemory() // 2**20,
        "total_samples": manifest["total_samples"], "shards": len(manifest["shards"]),
        "index_parts": len(os.listdir(os.path.join(args.out, "_tensor_index.parquet"))),
        "lookup_s": lookup_s, "lookup_hit": hit, "lookup2_s": lookup2_s, "lookup2_hit": hit2, **py,
    }))


PYTHON_LOOKUPS = """
import json, sys, time
from safetensors_spark import open_dataset
t0 = time.perf_counter()
ds = open_dataset(sys.argv[1])
t1 = time.perf_counter()
a = ds.get(sys.argv[2])
t2 = time.perf_counter()
b = ds.get(sys.argv[3])
t3 = time.perf_counter()
print(json.dumps({"py_open_s": round(t1 - t0, 2), "py_lookup_s": round(t2 - t1, 2),
                  "py_lookup2_s": round(t3 - t2, 2), "py_hits": [float(a["v"][0]), float(b["v"][0])]}))
"""


def python_lookups(out, keys):
    """`open_dataset` and two `get`s in a new Python process (the package imported before timing)."""
    run = subprocess.run([sys.executable, "-c", PYTHON_LOOKUPS, out, *keys], check=True, capture_output=True, text=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
