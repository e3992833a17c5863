package org.apache.spark.sql.safetensors

import org.apache.spark.sql.{SparkSession, SparkSessionExtensions}
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.catalyst.rules.Rule

/**
 * The Spark-line shim for Spark 3.5 (Scala 2.12): the ONE source file that differs between the
 * connector's two builds (its twin for Spark 4.x / Scala 2.13 is
 * src/main/scala-spark-4/.../SparkLine.scala; pom.xml picks one, spec/jni.md §6). Everything
 * else compiles unchanged on both lines, calling Spark internals only through SparkInternals,
 * which reaches them through these names. Keep both files' members identical.
 */
object SparkLine {
  /** The session class that holds `sessionState` (3.5: there is no `classic` package yet). */
  type ClassicSession = org.apache.spark.sql.SparkSession

  /** The Dataset class that holds `queryExecution`. */
  type ClassicDataset[T] = org.apache.spark.sql.Dataset[T]

  /**
   * Spark 3.5 has no analyzer hook that runs before its ResolveSQLOnFile (which refuses V2
   * sources), so SQL on files is not available on this line: nothing is injected (spec/sql.md §1).
   */
  def injectPreResolutionRule(extensions: SparkSessionExtensions,
      rule: SparkSession => Rule[LogicalPlan]): Boolean = false

  /**
   * A V1 write (catalog tables' INSERTs) with [[driverMetrics]]. Spark 3.5 has no
   * `Write.reportDriverMetrics` and its V1 write node no metrics: they are not shown on this line.
   */
  trait MeteredV1Write extends org.apache.spark.sql.connector.write.V1Write {
    def driverMetrics(): Array[org.apache.spark.sql.connector.metric.CustomTaskMetric]
  }

  /**
   * The writer of a copy-on-write DELETE, which needs each kept row's metadata columns (`_file`,
   * `_row_index`): Spark 4.0 passes them to `DataWriter.write(metadata, record)`. Spark 3.5's
   * `ReplaceData` passes only the row (`DataWriter` has no `write(metadata, record)`), so SQL
   * DELETE cannot name the rows it keeps and fails saying so; `SafetensorsDataset.delete` works.
   */
  trait MetadataDataWriter extends org.apache.spark.sql.connector.write.DataWriter[
      org.apache.spark.sql.catalyst.InternalRow] {
    def writeWithMetadata(metadata: org.apache.spark.sql.catalyst.InternalRow,
        record: org.apache.spark.sql.catalyst.InternalRow): Unit
    override def write(record: org.apache.spark.sql.catalyst.InternalRow): Unit =
      throw new UnsupportedOperationException("safetensors: SQL DELETE needs Spark 4.0 or later: " +
        "Spark 3.5 does not pass a row's metadata columns (_file, _row_index) to the writer of a " +
        "copy-on-write DELETE; use SafetensorsDataset.delete(spark, path, condition) from Scala, " +
        "or safetensors_spark.spark.delete from PySpark")
  }

  /** The line this build is for (shown in errors and checked by the smoke run). */
  val name: String = "3.5"
}
