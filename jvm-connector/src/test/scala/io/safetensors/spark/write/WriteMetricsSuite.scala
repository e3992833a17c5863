package io.safetensors.spark.write

import java.nio.file.Files

import scala.collection.mutable
import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.ObjectMapper
import org.apache.spark.scheduler.{SparkListener, SparkListenerTaskEnd}
import org.apache.spark.sql.safetensors.TestListenerBus
import io.safetensors.spark.SparkSuiteBase

/** What a write reports to Spark's listeners (the stage page's "Output" column). */
class WriteMetricsSuite extends SparkSuiteBase {

  override protected def appName: String = "safetensors-spark-write-metrics"

  test("task output metrics: bytes = the shards' sizes, records = the rows; named accumulators: shards, write time") {
    val outputs = mutable.ArrayBuffer[(Long, Long)]()
    val accums = mutable.ArrayBuffer[(String, Long)]()
    val listener = new SparkListener {
      override def onTaskEnd(e: SparkListenerTaskEnd): Unit = outputs.synchronized {
        val m = e.taskMetrics.outputMetrics
        outputs += ((m.bytesWritten, m.recordsWritten))
        e.taskInfo.accumulables.foreach { a =>
          (a.name, a.update) match {
            case (Some(n), Some(v: java.lang.Long)) => accums += ((n, v.longValue()))
            case _ =>
          }
        }
      }
    }
    val df = spark.range(0, 1000, 1, 3).selectExpr("array(cast(id as float), 1.5f) as x", "id as label")
    val dir = java.nio.file.Paths.get(freshPath())
    TestListenerBus.drain(spark.sparkContext)
    spark.sparkContext.addSparkListener(listener)
    try {
      df.write.format("safetensors").option("batch_size", "300").save(dir.toString)
      TestListenerBus.drain(spark.sparkContext)
    } finally spark.sparkContext.removeSparkListener(listener)
    val manifest = new ObjectMapper().readTree(Files.readString(dir.resolve("dataset_manifest.json")))
    val shards = manifest.get("shards").elements().asScala.toSeq
    val shardBytes = shards.map(s => Files.size(dir.resolve(s.get("shard_path").asText()))).sum
    assert(shards.size >= 6 && shardBytes > 0)
    val written = outputs.filter(_._2 > 0)
    assert(written.size == 3, outputs) // one per partition of the write
    assert(written.map(_._1).sum == shardBytes)
    assert(written.map(_._2).sum == 1000L)
    def accum(name: String) = accums.filter(_._1 == name).map(_._2)
    assert(accum(WriteMetrics.ShardsName).sum == shards.size)
    assert(accum(WriteMetrics.WriteTimeName).size == 3 && accum(WriteMetrics.WriteTimeName).forall(_ > 0))
  }
}
