package io.safetensors.spark

import scala.jdk.CollectionConverters._

import io.safetensors.spark.commit.{DatasetCommit, DatasetVacuum}
import io.safetensors.spark.files.DatasetFiles
import io.safetensors.spark.jni.NativeNames
import org.apache.spark.sql.{DataFrame, Row, SparkSession}
import org.apache.spark.sql.safetensors.SparkInternals
import org.apache.spark.sql.types.{LongType, StringType, StructField, StructType}

/**
 * Vacuum of a dataset (spec/dataset.md §5.8.1), on any path Spark writes to (local, HDFS,
 * `s3a://`):
 * {{{
 *   io.safetensors.spark.Vacuum.vacuum(spark, "/data/ds")                 // the dataset's retention
 *   io.safetensors.spark.Vacuum.vacuum(spark, "/data/ds", "1 days", dryRun = true)
 * }}}
 * Python: `safetensors_spark.spark.vacuum(spark, path, retention=None, dry_run=False,
 * allow_shorter_retention=False)`. Returns one row per file deleted (or, dry, to be deleted):
 * `file` (relative to the dataset), `kind` (`shard`, `index_part`, `log_entry`), `bytes` (null
 * for log entries), and `version`, the vacuum version committed (null on a dry run).
 */
object Vacuum {
  val ResultSchema: StructType = StructType(Seq(
    StructField("file", StringType, nullable = false),
    StructField("kind", StringType, nullable = false),
    StructField("bytes", LongType, nullable = true),
    StructField("version", LongType, nullable = true)))

  def vacuum(spark: SparkSession, path: String): DataFrame =
    vacuum(spark, path, null, dryRun = false, allowShorterRetention = false)

  def vacuum(spark: SparkSession, path: String, retention: String): DataFrame =
    vacuum(spark, path, retention, dryRun = false, allowShorterRetention = false)

  def vacuum(spark: SparkSession, path: String, retention: String, dryRun: Boolean): DataFrame =
    vacuum(spark, path, retention, dryRun, allowShorterRetention = false)

  /** `retention`: null for the dataset's own; shorter than the dataset's only with
   *  `allowShorterRetention`. */
  def vacuum(spark: SparkSession, path: String, retention: String, dryRun: Boolean,
      allowShorterRetention: Boolean): DataFrame = {
    val out = DatasetVacuum.run(path, SparkInternals.hadoopConf(spark, Map.empty[String, String]),
      Option(retention), dryRun, allowShorterRetention, Some(spark.sparkContext.applicationId))
    val v: java.lang.Long = out.version.map(Long.box).orNull
    def files(field: String, prefix: String, kind: String) =
      out.plan.get(field).elements().asScala.map(f =>
        Row(prefix + f.get("name").asText(), kind, f.get("bytes").asLong(), v)).toSeq
    val rows = files("shards", "", "shard") ++
      files("index_parts", DatasetFiles.IndexDir + "/", "index_part") ++
      out.plan.get("prune_versions").elements().asScala.map(p =>
        Row(DatasetCommit.LogDir + "/" + DatasetCommit.logName(p.asLong()), "log_entry", null, v)).toSeq ++
      out.plan.path("prune_checkpoints").elements().asScala.map(p =>
        Row(DatasetCommit.LogDir + "/" + NativeNames.checkpointFileName(p.asLong()), "log_checkpoint", null, v)).toSeq
    spark.createDataFrame(rows.asJava, ResultSchema)
  }
}
