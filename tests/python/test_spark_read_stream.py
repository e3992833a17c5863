"""spark.readStream.format("safetensors") (spec/reading.md §8) where the Scala suite
(ReadStreamSuite: local[2], local files) does not reach: executors in their own JVMs
(local-cluster) and a dataset on S3 (moto, through S3A), each chained into our own sink and
restarted from its checkpoint: every row exactly once."""
import os
import subprocess
import sys

from test_s3 import bucket, s3  # noqa: F401  (the S3 fixtures: server settings, a fresh bucket)


def frame(spark, lo, hi, parts=2):
    return spark.range(lo, hi, 1, parts).selectExpr("id", "array(cast(id AS float), cast(-id AS float)) AS x")


def append(spark, path, lo, hi):
    frame(spark, lo, hi).write.format("safetensors").option("batch_size", 4).mode("append").save(path)


def drain(spark, src, out, ck, **options):
    """Runs readStream(src) into the safetensors dataset out with Trigger.AvailableNow; returns the
    input rows of each micro-batch that read something."""
    reader = spark.readStream.format("safetensors")
    for k, v in options.items():
        reader = reader.option(k, v)
    q = (reader.load(src).writeStream.format("safetensors").option("checkpointLocation", ck)
         .option("batch_size", 4).trigger(availableNow=True).start(out))
    try:
        q.awaitTermination()
    finally:
        q.stop()
    return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"] > 0]


def ids(spark, path):
    return sorted(r.id for r in spark.read.format("safetensors").load(path).select("id").collect())


def test_read_stream_from_s3_into_s3_exactly_once_across_restarts(spark, s3, bucket, tmp_path):  # noqa: F811
    src, out, ck = f"s3a://{bucket}/src", f"s3a://{bucket}/out", str(tmp_path / "ck")
    append(spark, src, 0, 8)
    append(spark, src, 8, 16)
    # the snapshot of version 2, one shard (4 rows) per micro-batch
    assert drain(spark, src, out, ck, maxFilesPerTrigger=1) == [4, 4, 4, 4]
    assert ids(spark, out) == list(range(16))
    append(spark, src, 16, 24)
    assert drain(spark, src, out, ck, maxFilesPerTrigger=1) == [4, 4]
    assert ids(spark, out) == list(range(24))
    # nothing new: no batch, nothing written twice
    assert drain(spark, src, out, ck) == []
    assert ids(spark, out) == list(range(24))
    from_two = f"s3a://{bucket}/from-two"
    assert drain(spark, src, from_two, str(tmp_path / "ck2"), startingVersion=2) == [16]
    assert ids(spark, from_two) == list(range(8, 24))


CLUSTER_SCRIPT = r"""
import sys
from pyspark.sql import SparkSession
jar, src, out, ck = sys.argv[1:5]
spark = (SparkSession.builder.master("local-cluster[2,1,1024]").config("spark.jars", jar)
         .config("spark.ui.enabled", "false").config("spark.executor.memory", "512m").getOrCreate())
def append(lo, hi):
    (spark.range(lo, hi, 1, 2).selectExpr("id", "array(cast(id AS float), cast(-id AS float)) AS x")
     .write.format("safetensors").option("batch_size", 4).mode("append").save(src))
def drain():
    q = (spark.readStream.format("safetensors").option("maxFilesPerTrigger", 1).load(src)
         .writeStream.format("safetensors").option("checkpointLocation", ck).option("batch_size", 4)
         .trigger(availableNow=True).start(out))
    q.awaitTermination()
    return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"] > 0]
append(0, 8)
append(8, 16)
first = drain()
append(16, 24)
second = drain()
# the tasks ran in executor JVMs (the driver and two executors are listed)
executors = len(spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos())
got = sorted(r.id for r in spark.read.format("safetensors").load(out).select("id").collect())
print(first, second, executors == 3, got)
spark.stop()
"""


def test_read_stream_on_a_local_cluster_reads_in_executors_exactly_once(connector_jar, tmp_path):
    src, out, ck = (str(tmp_path / n) for n in ("src", "out", "ck"))
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    result = subprocess.run([sys.executable, "-c", CLUSTER_SCRIPT, str(connector_jar), src, out, ck],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    want = f"[4, 4, 4, 4] [4, 4] True {list(range(24))}"
    assert result.stdout.strip().splitlines()[-1] == want, result.stdout[-2000:]
