package io.safetensors.spark

import io.safetensors.spark.internal.Json
import java.io.File
import java.nio.file.Files
import java.util.UUID

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.JsonNode
import io.safetensors.spark.commit.DatasetCommit
import io.safetensors.spark.files.DatasetFiles
import io.safetensors.spark.internal.{ConnectorOptions, SerializableConf}
import io.safetensors.spark.jni.{NativeCompaction, NativeLib, NativeReader}
import org.apache.hadoop.fs.{FileSystem, Path}
import org.apache.spark.sql.{DataFrame, Row, SparkSession}
import org.apache.spark.sql.safetensors.SparkInternals
import org.apache.spark.sql.types.{LongType, StringType, StructField, StructType}

/**
 * Compaction of a dataset (spec/dataset.md §5.8.2) on any path Spark writes to (local, HDFS,
 * `s3a://`): small shards merged into full ones as one `compaction` version, the same rows.
 * {{{
 *   io.safetensors.spark.Compaction.compact(spark, "s3a://bucket/ds", Map("target_shard_size_mb" -> "64"))
 * }}}
 * Options: `batch_size` (batch layout; the dataset's), `target_shard_size_mb` (KV),
 * `commit_message`, `dry_run` (`true`: the plan only). The Rust dataset crate plans, merges and
 * builds the version; one Spark task per new shard copies its input shards from the file system
 * to local disk, merges them through JNI and uploads the result; the driver commits with the
 * writers' protocol, rebased on appends committed meanwhile. Returns one row: `version` (null
 * when dry or when nothing was merged), `shards_replaced`, `shards_written`, `rows`, `plan`
 * (JSON).
 */
object Compaction {
  val ResultSchema: StructType = StructType(Seq(
    StructField("version", LongType, nullable = true),
    StructField("shards_replaced", LongType, nullable = false),
    StructField("shards_written", LongType, nullable = false),
    StructField("rows", LongType, nullable = false),
    StructField("plan", StringType, nullable = false)))

  private val Known = Set("batch_size", "target_shard_size_mb", "commit_message", "dry_run")

  /** Tests only: runs after the new shards are in place, before the commit. */
  @volatile private[spark] var beforeCommit: () => Unit = null

  def compact(spark: SparkSession, path: String): DataFrame = compact(spark, path, Map.empty[String, String])

  def compact(spark: SparkSession, path: String, options: java.util.Map[String, String]): DataFrame =
    compact(spark, path, options.asScala.toMap)

  def compact(spark: SparkSession, path: String, options: Map[String, String]): DataFrame = {
    NativeLib.ensureLoaded()
    val mapper = Json.mapper
    val opts = options.map { case (k, v) => k.toLowerCase(java.util.Locale.ROOT) -> v }
    opts.keys.find(k => !Known.contains(k)).foreach(k => throw new IllegalArgumentException(
      s"safetensors: compaction: unknown option '$k'; valid options: ${Known.toSeq.sorted.mkString(", ")}"))
    def number(k: String): Option[Long] = opts.get(k).map { v =>
      val n = try v.trim.toLong catch { case _: NumberFormatException => -1L }
      if (n < 0) throw new IllegalArgumentException(
        s"safetensors: compaction: option $k = '$v': expected a whole number")
      n
    }
    // only true or false: `1` or `yes` is refused, never a real compaction (issue #39)
    val dryRun = ConnectorOptions.boolean(opts.get("dry_run"), "compaction: option 'dry_run'", false)
    val conf = SparkInternals.hadoopConf(spark, Map.empty[String, String])
    val root = new Path(path)
    val fs = root.getFileSystem(conf)
    val dest = fs.makeQualified(root)
    val commits = new DatasetCommit(fs, dest, conf, DatasetFiles.localFile(fs, dest))
    val (_, baseText) = commits.latest().getOrElse(throw new IllegalArgumentException(
      s"safetensors: compaction: $dest has no ${DatasetFiles.ManifestName}: not a dataset"))
    // a linked index directory is refused (spec/dataset.md §5.9): no part is written through it
    DatasetFiles.ownDir(fs, dest, DatasetFiles.IndexDir)
    val req = mapper.createObjectNode()
    number("batch_size").foreach(n => req.put("batch_size", n))
    number("target_shard_size_mb").foreach(n => req.put("target_shard_size_mb", n))
    req.put("write_id", UUID.randomUUID().toString)
    val planJson = NativeCompaction.planCompaction(baseText, mapper.writeValueAsString(req))
    val plan = mapper.readTree(planJson)
    val outputs = plan.get("outputs").size()
    def result(version: java.lang.Long) = spark.createDataFrame(Seq(Row(version,
      plan.get("replaced").size().toLong, outputs.toLong, plan.get("rows").asLong(), planJson)).asJava,
      ResultSchema)
    if (dryRun || outputs == 0) return result(null)
    val version = runPlan(spark, fs, dest, conf, commits, baseText, planJson, opts.get("commit_message"),
      Option(beforeCommit))
    result(java.lang.Long.valueOf(version))
  }

  /** Whether the dataset at `dest` has an index: a part of any shard `baseText` lists is in
   *  `_tensor_index.parquet/` (one listing, not a request per shard). */
  private[spark] def hasIndex(fs: FileSystem, dest: Path, baseText: String): Boolean = {
    val parts: Set[String] = try fs.listStatus(new Path(dest, DatasetFiles.IndexDir)).map(_.getPath.getName).toSet
      catch { case _: java.io.FileNotFoundException => Set.empty }
    parts.nonEmpty && Json.topLevelArrayStrings(baseText, "shards", "shard_path").exists(s =>
      parts.contains(NativeReader.indexPartName(s)))
  }

  /**
   * Runs a rewrite plan (a compaction's, or a delete's: spec/dataset.md §5.11) of the dataset at
   * `dest` whose latest manifest was `baseText`: one task per new shard copies its inputs to
   * local disk, merges them through JNI and uploads the result; the driver then commits the
   * version with the writers' protocol, rebased on appends committed meanwhile (a replaced shard
   * another commit removed fails it naming that version, and its own new shards are deleted).
   * With the dataset's retention 0 the replaced shards and their index parts are deleted after
   * the commit. Returns the version committed.
   */
  private[spark] def runPlan(spark: SparkSession, fs: FileSystem, dest: Path,
      conf: org.apache.hadoop.conf.Configuration, commits: DatasetCommit, baseText: String,
      planJson: String, commitMessage: Option[String], hook: Option[() => Unit]): Long = {
    val mapper = Json.mapper
    val plan = mapper.readTree(planJson)
    val outputs = plan.get("outputs").size()
    val what = Option(plan.get("operation")).map(_.asText()).getOrElse("compaction")
    val indexDir = new Path(dest, DatasetFiles.IndexDir)
    val indexed = hasIndex(fs, dest, baseText)
    val sconf = new SerializableConf(conf)
    val destString = dest.toString
    // each task gets its output's slice of the base and the plan (parsed once here): a task's
    // work follows its inputs, not the dataset (the whole plan in every task was O(outputs × shards))
    val tasks = mapper.readTree(NativeCompaction.compactionTasks(baseText, planJson)).elements().asScala
      .map(t => (t.get("base").asText(), t.get("plan").asText())).toSeq
    val written = if (outputs == 0) Array.empty[String]
      else spark.sparkContext.parallelize(tasks, outputs).map { case (sliceBase, slicePlan) =>
      NativeLib.ensureLoaded()
      val m = Json.mapper
      val out = m.readTree(slicePlan).get("outputs").get(0)
      val d = new Path(destString)
      val tfs = d.getFileSystem(sconf.value)
      val work = Files.createTempDirectory("safetensors-compact-").toFile
      try {
        out.get("inputs").elements().asScala.map(_.get("shard").asText()).toSeq.distinct.foreach { s =>
          tfs.copyToLocalFile(false, new Path(d, s), new Path(new File(work, s).toURI), true)
        }
        val entry = NativeCompaction.compactShard(sliceBase, slicePlan, 0, work.getPath, indexed)
        val name = out.get("name").asText()
        tfs.copyFromLocalFile(false, true, new Path(new File(work, name).toURI), new Path(d, name))
        if (indexed) {
          val part = NativeReader.indexPartName(name)
          tfs.copyFromLocalFile(false, true, new Path(new File(work, part).toURI),
            new Path(new Path(d, DatasetFiles.IndexDir), part))
        }
        entry
      } finally {
        work.listFiles().foreach(_.delete())
        work.delete()
      }
    }.collect()
    def cleanup(): Unit = plan.get("outputs").elements().asScala.foreach { o =>
      val name = o.get("name").asText()
      fs.delete(new Path(dest, name), false)
      fs.delete(new Path(indexDir, NativeReader.indexPartName(name)), false)
    }
    hook.foreach(_())
    val newShards = "[" + written.mkString(",") + "]"
    val id = s"$what-${UUID.randomUUID()}"
    val baseVersion = plan.get("base_version").asLong()
    var attempts = 0
    while (attempts < DatasetCommit.MaxCommitAttempts) {
      attempts += 1
      val (currentVersion, currentText) = commits.latest().get
      val log = mapper.createArrayNode()
      commits.logVersions().filter(_ > baseVersion).foreach { v =>
        try log.addObject().put("version", v)
          .put("text", DatasetFiles.readText(fs, new Path(new Path(dest, DatasetCommit.LogDir), DatasetCommit.logName(v))))
        catch { case _: java.io.FileNotFoundException => }
      }
      val info = mapper.createObjectNode().put("committed_at_ms", System.currentTimeMillis())
        .put("app_id", spark.sparkContext.applicationId)
      commitMessage.foreach(m => info.put("commit_message", m))
      val next = try mapper.readTree(NativeCompaction.compactionManifest(currentText, planJson, newShards,
        mapper.writeValueAsString(info), mapper.writeValueAsString(log)))
      catch { case e: Throwable => cleanup(); throw e }
      val version = next.get("version").asLong()
      val text = next.get("manifest").asText()
      if (commits.tryCommit(version, Some((currentVersion, currentText)), text, id)) {
        commits.publish(version, text, id)
        if (!next.get("retain").asBoolean()) {
          plan.get("replaced").elements().asScala.foreach { s =>
            val name = s.asText()
            fs.delete(new Path(dest, name), false)
            fs.delete(new Path(indexDir, NativeReader.indexPartName(name)), false)
          }
        }
        return version
      }
    }
    cleanup()
    throw new java.io.IOException(s"safetensors: $what of $dest: ${DatasetCommit.MaxCommitAttempts} attempts " +
      "to commit each found a newer version committed by another writer; nothing was committed")
  }
}
