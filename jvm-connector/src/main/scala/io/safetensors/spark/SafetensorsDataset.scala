package io.safetensors.spark

import io.safetensors.spark.internal.Json
import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.JsonNode
import io.safetensors.spark.commit.DatasetCommit
import io.safetensors.spark.files.{DatasetFiles, LogReads}
import io.safetensors.spark.jni.{NativeLib, NativeVersions}
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.{DataFrame, Row, SparkSession}
import org.apache.spark.sql.types._

/**
 * Functions on a dataset as a whole (spec/dataset.md §5.8).
 * {{{
 *   SafetensorsDataset.history(spark, "/data/train").show()
 * }}}
 */
object SafetensorsDataset {
  private val mapper = Json.mapper

  /** The columns of [[history]]. */
  val HistorySchema: StructType = StructType(Seq(
    StructField("version", LongType, nullable = false),
    StructField("committed_at", TimestampType, nullable = false),
    StructField("operation", StringType),
    StructField("rows_added", LongType, nullable = false),
    StructField("rows_removed", LongType, nullable = false),
    StructField("bytes_added", LongType, nullable = false),
    StructField("bytes_removed", LongType, nullable = false),
    StructField("shards_added", LongType, nullable = false),
    StructField("shards_removed", LongType, nullable = false),
    StructField("total_rows", LongType, nullable = false),
    StructField("total_bytes", LongType, nullable = false),
    StructField("created_by", StringType),
    StructField("app_id", StringType),
    StructField("commit_message", StringType)))

  /**
   * One row per version in the dataset's manifest log, oldest first: when it was committed, the
   * operation, rows/bytes/shards added and removed against the version before it, and the
   * writer. The rules are the engine's (the same as `safetensors-spark history`).
   */
  def history(spark: SparkSession, path: String): DataFrame = {
    NativeLib.ensureLoaded()
    val dir = new Path(path)
    val fs = dir.getFileSystem(spark.sessionState.newHadoopConf())
    val logDir = new Path(dir, DatasetCommit.LogDir)
    // a linked _manifest_log is refused naming it (spec/dataset.md §5.9)
    if (DatasetFiles.ownDir(fs, dir, DatasetCommit.LogDir).isEmpty) {
      throw new IllegalArgumentException(s"safetensors: $dir has no manifest log " +
        s"(${DatasetCommit.LogDir}/): not a dataset written by this connector")
    }
    val entries = LogReads.entries(fs, logDir, withTexts = true)
    val rows = mapper.readTree(NativeVersions.history(mapper.writeValueAsString(entries)))
      .elements().asScala.map(toRow).toList
    spark.createDataFrame(rows.asJava, HistorySchema)
  }

  /**
   * Deletes the rows for which `condition` (SQL) is true, copy-on-write (spec/dataset.md §5.11):
   * one `delete` version per dataset directory changed; one result row each (`version`,
   * `rows_removed`, `shards_replaced`, `shards_written`). The same as SQL `DELETE FROM`, on every
   * Spark line built (SQL DELETE needs Spark 4.0).
   */
  def delete(spark: SparkSession, path: String, condition: String): DataFrame =
    io.safetensors.spark.write.Deletes.delete(spark, path, condition, None)

  def delete(spark: SparkSession, path: String, condition: String, commitMessage: String): DataFrame =
    io.safetensors.spark.write.Deletes.delete(spark, path, condition, Option(commitMessage))

  /**
   * Deletes `keys` from the KV dataset at `path` (a dataset or a `partitionBy` root, on any file
   * system Spark reads: local, HDFS, `s3a://`), copy-on-write (spec/dataset.md §5.11): the shards
   * holding a key are rewritten without its tensors (one `delete` version per dataset directory
   * changed, the tensor index kept right); keys the dataset does not hold are ignored. The shards
   * holding the keys are found through the tensor index when there is one, else by a scan of the
   * headers in tasks (the driver reads no header but those of the shards it rewrites). One result
   * row per directory holding a key, as [[delete]]'s. A batch dataset is refused (use [[delete]]).
   */
  def deleteKeys(spark: SparkSession, path: String, keys: Seq[String]): DataFrame =
    io.safetensors.spark.write.KeyDeletes.deleteKeys(spark, path, keys, None)

  def deleteKeys(spark: SparkSession, path: String, keys: Seq[String], commitMessage: String): DataFrame =
    io.safetensors.spark.write.KeyDeletes.deleteKeys(spark, path, keys, Option(commitMessage))

  def deleteKeys(spark: SparkSession, path: String, keys: java.util.List[String]): DataFrame =
    io.safetensors.spark.write.KeyDeletes.deleteKeys(spark, path, keys, null)

  def deleteKeys(spark: SparkSession, path: String, keys: java.util.List[String],
      commitMessage: String): DataFrame =
    io.safetensors.spark.write.KeyDeletes.deleteKeys(spark, path, keys, commitMessage)

  private def toRow(r: JsonNode): Row = {
    def str(k: String): String = if (r.path(k).isTextual) r.get(k).asText() else null
    def long(k: String): Long = r.path(k).asLong()
    Row(long("version"), new java.sql.Timestamp(long("committed_at_ms")), str("operation"),
      long("rows_added"), long("rows_removed"), long("bytes_added"), long("bytes_removed"),
      long("shards_added"), long("shards_removed"), long("total_rows"), long("total_bytes"),
      str("created_by"), str("app_id"), str("commit_message"))
  }
}
