"""A/B of the per-sample read: sum over all elements and over x[3], safetensors (st) vs Parquet
uncompressed (pq), in one local[2] JVM (100k rows x 256 floats).

The order alternates ABBA (st pq, pq st, st pq, ...) so that JIT warm-up and machine noise fall on
both sources alike; one discarded warm-up run of each comes first. Prints, per query, the raw wall
and JVM-CPU seconds of every run, their medians, st/pq of the medians and the median of the
per-round st/pq ratios (the paired estimate; CPU is the whole driver process: less sensitive to
other load on the machine than wall time). Every run builds its DataFrame afresh: collecting the
same DataFrame again would reuse its shuffle output and skip the scan stage entirely.

Usage: python jvm-connector/bench/read_sum_ab.py ["extra driver JVM options" [rounds (default 8)]]
(run from the repo root with the connector jar built; SPARK_LOCAL_IP=127.0.0.1)
"""
import os, sys, time, tempfile, statistics as st
from pyspark.sql import SparkSession, functions as F
extra = sys.argv[1] if len(sys.argv) > 1 else ""
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 8
spark = (SparkSession.builder.master("local[2]").config("spark.jars", "jvm-connector/target/safetensors-spark-0.1.0.jar")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", "3g").config("spark.driver.extraJavaOptions", extra).getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
jvm_pid = spark._jvm.java.lang.ProcessHandle.current().pid()
cpu = lambda: sum(map(int, open(f"/proc/{jvm_pid}/stat").read().rsplit(")", 1)[1].split()[11:13])) / os.sysconf("SC_CLK_TCK")
out = tempfile.mkdtemp()
df = spark.range(100000, numPartitions=2).selectExpr("transform(sequence(1, 256), i -> cast(sin(id * 256 + i) AS float)) AS xf")
df.write.format("safetensors").option("batch_size", 4096).save(out + "/st")
df.write.parquet(out + "/pq", compression="none")
src = {"st": spark.read.format("safetensors").load(out + "/st"), "pq": spark.read.parquet(out + "/pq")}
queries = {"sum-all": lambda d: d.select(F.sum(F.aggregate("xf", F.lit(0.0).cast("double"), lambda a, x: a + x))),
           "x[3]": lambda d: d.select(F.sum(F.col("xf")[3]))}
def run(q, name):
    t, c = time.time(), cpu()
    v = queries[q](src[name]).collect()[0][0]
    return time.time() - t, cpu() - c, v
fmt = lambda xs: "[" + " ".join(f"{x:.3f}" for x in xs) + "]"
for q in queries:
    assert abs(run(q, "st")[2] - run(q, "pq")[2]) < 1e-6 * 100000  # warm-up; same answer
    res = {"st": [], "pq": []}
    for r in range(rounds):
        for name in (("st", "pq") if r % 2 == 0 else ("pq", "st")):
            res[name].append(run(q, name)[:2])
    for k, label in ((0, "wall"), (1, "cpu ")):
        a, b = [x[k] for x in res["st"]], [x[k] for x in res["pq"]]
        print(f"{q:8s} {label} st {fmt(a)} median {st.median(a):.3f}")
        print(f"{q:8s} {label} pq {fmt(b)} median {st.median(b):.3f}")
        print(f"{q:8s} {label} st/pq of medians {st.median(a) / st.median(b):.3f}, "
              f"median of paired ratios {st.median(x / y for x, y in zip(a, b)):.3f}")
