package io.safetensors.spark.commit

import java.io.File
import java.nio.file.Files

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.{JsonNode, ObjectMapper}
import com.fasterxml.jackson.databind.node.ObjectNode
import org.apache.spark.sql.{DataFrame, Row, SaveMode}
import org.apache.spark.sql.types._
import io.safetensors.spark.{SparkSuiteBase, Vacuum}
import io.safetensors.spark.jni.NativeNames
import io.safetensors.spark.write.{SafetensorsWriteSuite, SafetensorsWriter}

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

  private def listed(path: String): Set[String] =
    manifest(path).get("shards").elements().asScala.map(_.get("shard_path").asText()).toSet

  /** The index part of `shard` in the dataset at `path`. */
  private def partOf(path: String, shard: String): File =
    new File(new File(path, "_tensor_index.parquet"), shard.stripSuffix(".safetensors") + ".parquet")

  /** The floats of version `version` (None: the latest), sorted. */
  private def values(path: String, version: Option[Long] = None): Seq[Float] = {
    val r = spark.read.format("safetensors")
    version.fold(r)(v => r.option("versionAsOf", v)).load(path).collect().map(_.getSeq[Float](0).head).toSeq.sorted
  }

  private def tagged(n: Int, tag: Int): Seq[Float] = (0 until n).map(i => (tag * 1000 + i).toFloat)

  test("retention (default 7 days): an overwrite keeps the old shards and index parts for versionAsOf; " +
      "vacuum deletes them, and a read of that version fails naming it, never a partial read") {
    val path = freshPath()
    rows(4, 1).write.format("safetensors").option("batch_size", "2").option("generate_index", "true").save(path)
    val v1 = listed(path)
    assert(v1.size == 2 && v1.forall(f => partOf(path, f).exists()))
    rows(2, 2).write.format("safetensors").option("batch_size", "2").mode("overwrite").save(path)
    assert(v1.forall(f => new File(path, f).exists() && partOf(path, f).exists()), "superseded shards and parts stay")
    assert(logVersions(path) == Seq(1L, 2L))
    assert(values(path, Some(1)) == tagged(4, 1) && values(path) == tagged(2, 2))
    // an append does not take the index from parts only version 1 lists
    append(rows(2, 3), path)
    assert(listed(path).forall(f => !partOf(path, f).exists()))
    assert(values(path, Some(1)) == tagged(4, 1))

    // a reader between the vacuum's deletes and its prune: version 1 fails naming a missing shard
    var between = ""
    DatasetVacuum.beforePrune = () => {
      DatasetVacuum.beforePrune = null
      between = messages(intercept[Exception](values(path, Some(1))))
    }
    val out = try Vacuum.vacuum(spark, path, "0", false, true).collect()
    finally DatasetVacuum.beforePrune = null
    assert(v1.exists(f => between.contains(s"version 1 lists shard $f, which is missing")), between)
    assert(out.map(r => r.getString(0) -> r.getString(1)).toSet ==
      v1.map(_ -> "shard") ++ v1.map(f => s"_tensor_index.parquet/${partOf(path, f).getName}" -> "index_part") ++
        Seq(1L, 2L).map(v => s"_manifest_log/${DatasetCommit.logName(v)}" -> "log_entry") ++
        Seq(s"_manifest_log/${NativeNames.checkpointFileName(1)}" -> "log_checkpoint"), out.toSeq)
    // the retained versions replay from the checkpoint of the oldest of them, written by the vacuum
    assert(new File(path, s"_manifest_log/${NativeNames.checkpointFileName(3)}").exists())
    assert(v1.forall(f => !new File(path, f).exists() && !partOf(path, f).exists()))
    val gone = messages(intercept[Exception](values(path, Some(1))))
    assert(gone.contains("version 1 is no longer in the manifest log (kept: versions 3, 4)"), gone)
    assert(values(path) == tagged(2, 2) ++ tagged(2, 3))
  }

  private def kv(keys: Seq[String], value: Float): DataFrame = {
    val schema = StructType(Seq(StructField("k", StringType), StructField("v", ArrayType(FloatType))))
    spark.createDataFrame(spark.sparkContext.parallelize(keys.map(k => Row(k, Seq(value))), 1), schema)
  }

  test("retention: KV lastWin appends and stream batches keep the shards they replace; every version reads its values") {
    val path = freshPath()
    val lastWin = Map("name_col" -> "k", "duplicatesStrategy" -> "lastWin")
    kv(Seq("a", "b", "c"), 1f).write.format("safetensors").options(lastWin)
      .option("generate_index", "true").save(path)
    val v1 = listed(path)
    kv(Seq("b"), 2f).write.format("safetensors").options(lastWin).mode("append").save(path)
    val v2 = listed(path)
    // a streaming micro-batch (the sink's write) replacing c
    SafetensorsWriter.write(spark.sqlContext, SaveMode.Append, lastWin + ("path" -> path), kv(Seq("c"), 3f),
      Some(SafetensorsWriter.StreamBatch("q", 0)))
    val replaced = (v1 -- v2) ++ (v2 -- listed(path))
    assert(replaced.size == 2 && replaced.forall(f => new File(path, f).exists() && partOf(path, f).exists()),
      s"replaced copies stay: $replaced")
    assert(logVersions(path) == Seq(1L, 2L, 3L))
    def read(v: Long, where: String = "true") =
      spark.read.format("safetensors").option("versionAsOf", v).load(path).where(where).collect()
        .map(r => r.getAs[String]("key") -> r.getAs[Seq[Float]]("decoded").head).toMap
    assert(read(1) == Map("a__v" -> 1f, "b__v" -> 1f, "c__v" -> 1f))
    assert(read(2) == Map("a__v" -> 1f, "b__v" -> 2f, "c__v" -> 1f))
    assert(read(3) == Map("a__v" -> 1f, "b__v" -> 2f, "c__v" -> 3f))
    // a key lookup through version 1's index parts
    assert(read(1, "key = 'b__v'") == Map("b__v" -> 1f))
  }

  test("writers prune no log entry inside the retention; with retention 0 they prune below the " +
      "newest checkpoint 20 versions behind (spec/dataset.md §5.10)") {
    val path = freshPath()
    append(rows(2, 1), path)
    // versions 2..22 as if committed two hours ago, whole manifests as an older connector wrote
    // them: version 1 renumbered (writes that changed nothing); version 3 also as a checkpoint
    val logDir = new File(path, DatasetCommit.LogDir)
    val m = mapper.readTree(new File(path, "dataset_manifest.json")).asInstanceOf[ObjectNode]
    for (v <- 1 to 22) {
      m.put("manifest_version", v)
      Files.write(new File(logDir, DatasetCommit.logName(v)).toPath, mapper.writeValueAsBytes(m))
      if (v == 3) Files.write(new File(logDir, NativeNames.checkpointFileName(3)).toPath, mapper.writeValueAsBytes(m))
    }
    new File(logDir, NativeNames.checkpointFileName(1)).delete()
    Files.write(new File(path, "dataset_manifest.json").toPath, mapper.writeValueAsBytes(m))
    val old = System.currentTimeMillis() - 2 * 60 * 60 * 1000L
    logDir.listFiles().foreach(f => assert(f.setLastModified(old)))
    append(rows(2, 2), path)
    assert(logVersions(path) == (1L to 23L), "a writer pruned the log inside the retention")
    rows(2, 3).write.format("safetensors").option("batch_size", "2").option("retention", "0")
      .mode("append").save(path)
    assert(logVersions(path) == (3L to 24L))
    assert(new File(logDir, NativeNames.checkpointFileName(3)).exists())
    assert(values(path) == tagged(2, 1) ++ tagged(2, 2) ++ tagged(2, 3))
    (3L to 24L).foreach(v => assert(values(path, Some(v)).nonEmpty, s"version $v"))
  }

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
    assert(dry.map(_.getString(0)).toSet == Set(s"_manifest_log/${DatasetCommit.logName(1)}",
      s"_manifest_log/${NativeNames.checkpointFileName(1)}"))
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
