"""A/B of the per-sample read: sum over all elements and over x[3], safetensors vs Parquet uncompressed,
in one local[2] JVM (100k rows x 256 floats; medians of the middle of 7 runs).

Usage: python jvm-connector/bench/read_sum_ab.py ["extra driver JVM options"]   (run from the repo root,
with the connector jar built; SPARK_LOCAL_IP=127.0.0.1)
"""
import sys, time, tempfile
from pyspark.sql import SparkSession, functions as F
extra = sys.argv[1] if len(sys.argv) > 1 else ""
spark = (SparkSession.builder.master("local[2]").config("spark.jars", "jvm-connector/target/safetensors-spark-0.1.0.jar")
         .config("spark.ui.enabled", "false").config("spark.driver.memory", "3g").config("spark.driver.extraJavaOptions", extra).getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
out = tempfile.mkdtemp()
df = spark.range(100000, numPartitions=2).selectExpr("transform(sequence(1, 256), i -> cast(sin(id * 256 + i) AS float)) AS xf")
df.write.format("safetensors").option("batch_size", 4096).save(out + "/st")
df.write.parquet(out + "/pq", compression="none")
s = lambda d: d.select(F.sum(F.aggregate("xf", F.lit(0.0).cast("double"), lambda a, x: a + x))).collect()[0][0]
c = lambda d: d.select(F.sum(F.col("xf")[3])).collect()[0][0]
for name, d in [("st", spark.read.format("safetensors").load(out + "/st")), ("pq", spark.read.parquet(out + "/pq"))]:
    for label, f in [("sum-all", s), ("x[3]", c)]:
        ts = []
        for _ in range(7):
            t = time.time(); f(d); ts.append(time.time() - t)
        print(name, label, sorted(ts)[2:5])
