package io.safetensors.spark.commit

import java.io.File

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.{JsonNode, ObjectMapper}
import org.apache.spark.sql.{DataFrame, Row}
import org.apache.spark.sql.types._
import io.safetensors.spark.{Compaction, SparkSuiteBase}
import io.safetensors.spark.write.SafetensorsWriteSuite

/** Compaction through Spark (spec/dataset.md §5.8.2), raced against writers at a forced point:
 *  after its new shards are in place, before its commit. */
class CompactionSuite extends SparkSuiteBase {
  import SafetensorsWriteSuite._

  private val mapper = new ObjectMapper()

  override protected def appName: String = "safetensors-compaction"

  private val schema = StructType(Seq(StructField("x", ArrayType(FloatType))))

  private def rows(n: Int, tag: Int): DataFrame =
    spark.createDataFrame(spark.sparkContext.parallelize(
      (0 until n).map(i => Row(Seq((tag * 1000 + i).toFloat))), 2), schema)

  private def manifest(path: String): JsonNode = mapper.readTree(new File(path, "dataset_manifest.json"))

  private def values(path: String): Seq[Float] =
    spark.read.format("safetensors").load(path).collect().map(_.getSeq[Float](0).head).toSeq.sorted

  private def append(df: DataFrame, path: String): Unit =
    df.write.format("safetensors").option("batch_size", "4").mode("append").save(path)

  test("forced races: an append committed during a compaction is kept, an overwrite fails it") {
    val path = freshPath()
    (1 to 3).foreach(t => append(rows(3, t), path)) // six tails of 1 or 2 rows
    val v = manifest(path).get("manifest_version").asLong()
    Compaction.beforeCommit = () => { Compaction.beforeCommit = null; append(rows(2, 9), path) }
    val r = try Compaction.compact(spark, path).collect().head finally Compaction.beforeCommit = null
    assert(r.getLong(0) == v + 2, "committed on top of the append's version")
    val m = manifest(path)
    assert(m.get("operation").asText() == "compaction")
    assert(values(path) == ((1 to 3).flatMap(t => (0 until 3).map(i => (t * 1000 + i).toFloat)) ++
      Seq(9000f, 9001f)).sorted)
    // a held compaction losing to an overwrite fails naming it and leaves only the overwrite
    append(rows(3, 5), path)
    def shardsOnDisk = new File(path).list().filter(_.endsWith(".safetensors")).toSet
    var atHook = Set.empty[String]
    Compaction.beforeCommit = () => {
      Compaction.beforeCommit = null
      rows(2, 7).write.format("safetensors").option("batch_size", "4").mode("overwrite").save(path)
      atHook = shardsOnDisk
    }
    val e = try intercept[Exception](Compaction.compact(spark, path).collect())
      finally Compaction.beforeCommit = null
    val ow = manifest(path).get("manifest_version").asLong()
    assert(e.getMessage.contains(s"version $ow (overwrite) removed it"), e.getMessage)
    // it deleted its own new shards (listed by no version) and nothing else
    val removed = atHook -- shardsOnDisk
    // every shard a log file names: a checkpoint's shards, a delta entry's added and removed ones
    val everListed = new File(path, "_manifest_log").listFiles().flatMap { f =>
      val doc = mapper.readTree(f)
      Seq("shards", "add", "remove").flatMap(k => Option(doc.get(k)).toSeq.flatMap(_.elements().asScala))
        .map(_.get("shard_path").asText())
    }.toSet
    assert(removed.nonEmpty && removed.forall(f => !everListed.contains(f)), removed)
    assert(shardsOnDisk.subsetOf(atHook))
    assert(values(path) == Seq(7000f, 7001f))
  }
}
