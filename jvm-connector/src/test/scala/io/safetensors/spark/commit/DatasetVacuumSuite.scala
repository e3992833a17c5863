package io.safetensors.spark.commit

import java.io.File

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.{JsonNode, ObjectMapper}
import org.apache.spark.sql.{DataFrame, Row}
import org.apache.spark.sql.types._
import io.safetensors.spark.{SparkSuiteBase, Vacuum}
import io.safetensors.spark.write.SafetensorsWriteSuite

/** Vacuum through Spark (spec/dataset.md §5.8.1), raced against writers at forced points. */
class DatasetVacuumSuite extends SparkSuiteBase {
  import SafetensorsWriteSuite._

  private val mapper = new ObjectMapper()

  override protected def appName: String = "safetensors-vacuum"

  private val schema = StructType(Seq(StructField("x", ArrayType(FloatType))))

  private def rows(n: Int, tag: Int): DataFrame =
    spark.createDataFrame(spark.sparkContext.parallelize(
      (0 until n).map(i => Row(Seq((tag * 1000 + i).toFloat))), 2), schema)

  private def manifest(path: String): JsonNode = mapper.readTree(new File(path, "dataset_manifest.json"))

  private def logVersions(path: String): Seq[Long] =
    Option(new File(path, "_manifest_log").list()).toSeq.flatten.flatMap(DatasetCommit.parseLogName).sorted

  private def append(df: DataFrame, path: String): Unit =
    df.write.format("safetensors").option("batch_size", "2").mode("append").save(path)

  test("vacuum: retention option, override, dry run, then a vacuum version") {
    val path = freshPath()
    append(rows(4, 1), path)
    append(rows(4, 2), path)
    assert(manifest(path).get("retention_seconds") == null)
    assert(manifest(path).get("committed_at_ms").asLong() > 0)
    val e = intercept[IllegalArgumentException](Vacuum.vacuum(spark, path, "0"))
    assert(e.getMessage.contains("shorter than the dataset's retention 604800 s"), e.getMessage)
    val bad = intercept[IllegalArgumentException](Vacuum.vacuum(spark, path, "-3 days"))
    assert(bad.getMessage.contains("retention") && bad.getMessage.contains("hours or days"))
    val before = logVersions(path)
    val dry = Vacuum.vacuum(spark, path, "0", true, true).collect()
    assert(dry.map(_.getString(0)).toSet == Set(s"_manifest_log/${DatasetCommit.logName(1)}"))
    assert(logVersions(path) == before)
    val done = Vacuum.vacuum(spark, path, "0", false, true).collect()
    assert(done.head.getLong(3) == 3L)
    assert(manifest(path).get("operation").asText() == "vacuum")
    assert(logVersions(path) == Seq(2L, 3L))
    assert(spark.read.format("safetensors").load(path).count() == 8)
    // a write's retention option is recorded and carried forward
    rows(2, 3).write.format("safetensors").option("batch_size", "2").option("retention", "2 hours")
      .mode("append").save(path)
    append(rows(2, 4), path)
    assert(manifest(path).get("retention_seconds").asLong() == 7200)
  }

  test("forced races: an in-flight writer's shards survive, a commit between plan and commit is kept") {
    val path = freshPath()
    append(rows(4, 1), path)
    append(rows(4, 2), path)
    // 1: the writer has placed its shards and is about to create version 3; vacuum runs now
    DatasetCommit.beforeCreate = v => if (v == 3) {
      DatasetCommit.beforeCreate = null
      val unlisted = shardFiles(path).map(_.getName).toSet --
        manifest(path).get("shards").elements().asScala.map(_.get("shard_path").asText())
      assert(unlisted.nonEmpty)
      Vacuum.vacuum(spark, path, "0", false, true).collect()
      assert(unlisted.forall(f => new File(path, f).exists()), "vacuum deleted an in-flight shard")
    }
    try append(rows(4, 3), path) finally DatasetCommit.beforeCreate = null
    // the writer found version 3 taken by the vacuum and committed on top of it
    assert(spark.read.format("safetensors").load(path).count() == 12)
    // 2: a writer commits between the vacuum's plan and its commit
    DatasetVacuum.afterPlan = () => { DatasetVacuum.afterPlan = null; append(rows(4, 4), path) }
    try Vacuum.vacuum(spark, path, "0", false, true).collect()
    finally DatasetVacuum.afterPlan = null
    val m = manifest(path)
    assert(m.get("operation").asText() == "vacuum")
    assert(m.get("shards").elements().asScala.forall(s => new File(path, s.get("shard_path").asText()).exists()))
    assert(spark.read.format("safetensors").load(path).count() == 16)
  }
}
