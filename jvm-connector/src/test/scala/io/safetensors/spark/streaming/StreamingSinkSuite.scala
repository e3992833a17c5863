package io.safetensors.spark.streaming

import java.io.File
import java.util.concurrent.{CyclicBarrier, Executors, TimeUnit}

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.ObjectMapper
import org.apache.spark.sql.{DataFrame, Row, SaveMode}
import org.apache.spark.sql.types._
import io.safetensors.spark.SparkSuiteBase
import io.safetensors.spark.commit.DatasetCommit
import io.safetensors.spark.write.{SafetensorsWriteSuite, SafetensorsWriter}

/**
 * The streaming sink's commit (spec/dataset.md §5.7) where the Python suite
 * (tests/python/test_spark_streaming.py, real queries) cannot reach: two runs of one micro-batch
 * racing for one manifest version, so the replay is found by the check inside the commit loop,
 * not by the one before the job.
 */
class StreamingSinkSuite extends SparkSuiteBase {
  import SafetensorsWriteSuite.shardFiles

  private val mapper = new ObjectMapper()

  override protected def appName: String = "safetensors-streaming-sink"

  private def rows(n: Int, tag: Int): DataFrame = {
    val data = (0 until n).map(i => Row(Seq((tag * 1000 + i).toFloat)))
    spark.createDataFrame(spark.sparkContext.parallelize(data, 2),
      StructType(Seq(StructField("x", ArrayType(FloatType)))))
  }

  private def batch(path: String, df: DataFrame, query: String, id: Long): Unit =
    SafetensorsWriter.write(spark.sqlContext, SaveMode.Append,
      Map("path" -> path, "batch_size" -> "4"), df, Some(SafetensorsWriter.StreamBatch(query, id)))

  test("two runs of one micro-batch racing for a version: one commits it, the other changes nothing") {
    val path = new File(base, "race").getAbsolutePath
    batch(path, rows(6, 0), "q", 0)
    // both runs of batch 1 pass the check before their jobs (batch 0 is the last committed), then
    // meet before creating the same version: the loser must find batch 1 committed on its retry
    val barrier = new CyclicBarrier(2)
    val first = ThreadLocal.withInitial[java.lang.Boolean](() => true)
    DatasetCommit.beforeCreate = _ => if (first.get()) {
      first.set(false)
      barrier.await(2, TimeUnit.MINUTES)
    }
    val pool = Executors.newFixedThreadPool(2)
    val outcomes = try {
      val futures = (1 to 2).map(_ => pool.submit(() =>
        try Right(batch(path, rows(10, 1), "q", 1)) catch { case t: Throwable => Left(t) }))
      futures.map(_.get(10, TimeUnit.MINUTES))
    } finally {
      pool.shutdownNow()
      DatasetCommit.beforeCreate = null
    }
    outcomes.foreach(o => assert(o.isRight, o.left.map(_.toString)))
    val m = mapper.readTree(new File(path, "dataset_manifest.json"))
    assert(m.get("total_samples").asLong == 16)
    assert(m.get("manifest_version").asLong == 2)
    assert(m.get("stream_commits").get("q").asLong == 1)
    val listed = m.get("shards").elements().asScala.map(_.get("shard_path").asText()).toSet
    assert(listed == shardFiles(path).map(_.getName).toSet, "the loser's shards are gone")
    assert(!new File(path).list().exists(_.startsWith("_staging-")))
    val read = spark.read.format("safetensors").load(path).collect().map(_.getSeq[Float](0).head.toInt)
    assert(read.sorted.toSeq == (0 until 6) ++ (1000 until 1010))

    // a replay after the fact (the check before the job) and a negative batch id
    batch(path, rows(3, 2), "q", 1)
    assert(mapper.readTree(new File(path, "dataset_manifest.json")).get("manifest_version").asLong == 2)
    val e = intercept[IllegalArgumentException](batch(path, rows(3, 2), "q", -1))
    assert(e.getMessage.contains("streaming batch id must be ≥ 0, got -1 (query q)"), e.getMessage)
  }
}
