package org.apache.spark.sql.safetensors

import org.apache.spark.sql.{SparkSession, SparkSessionExtensions}
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.catalyst.rules.Rule

/**
 * The Spark-line shim for Spark 4.x (Scala 2.13): the ONE source file that differs between the
 * connector's two builds (its twin for Spark 3.5 / Scala 2.12 is
 * src/main/scala-spark-3.5/.../SparkLine.scala; pom.xml picks one, spec/jni.md §6). Everything
 * else compiles unchanged on both lines, calling Spark internals only through SparkInternals,
 * which reaches them through these names. Keep both files' members identical.
 */
object SparkLine {
  /** The session class that holds `sessionState` (4.x: `org.apache.spark.sql.classic`). */
  type ClassicSession = org.apache.spark.sql.classic.SparkSession

  /** The Dataset class that holds `queryExecution`. */
  type ClassicDataset[T] = org.apache.spark.sql.classic.Dataset[T]

  /**
   * Adds a rule to the analyzer batch that runs before Resolution (Spark 4.x's "Hints" batch),
   * where SQL on files must be resolved before Spark's own ResolveSQLOnFile refuses a V2 source.
   */
  def injectPreResolutionRule(extensions: SparkSessionExtensions,
      rule: SparkSession => Rule[LogicalPlan]): Boolean = {
    extensions.injectHintResolutionRule(rule)
    true
  }

  /**
   * A V1 write (catalog tables' INSERTs) whose [[driverMetrics]], declared in
   * `supportedCustomMetrics`, Spark shows as the write node's SQL metrics after the write
   * (`Write.reportDriverMetrics`, Spark 4.0+).
   */
  trait MeteredV1Write extends org.apache.spark.sql.connector.write.V1Write {
    def driverMetrics(): Array[org.apache.spark.sql.connector.metric.CustomTaskMetric]
    override def reportDriverMetrics(): Array[org.apache.spark.sql.connector.metric.CustomTaskMetric] =
      driverMetrics()
  }

  /**
   * The writer of a copy-on-write DELETE, which needs each kept row's metadata columns (`_file`,
   * `_row_index`): Spark 4.0 passes them to `DataWriter.write(metadata, record)`. Here that call
   * goes to [[writeWithMetadata]].
   */
  trait MetadataDataWriter extends org.apache.spark.sql.connector.write.DataWriter[
      org.apache.spark.sql.catalyst.InternalRow] {
    def writeWithMetadata(metadata: org.apache.spark.sql.catalyst.InternalRow,
        record: org.apache.spark.sql.catalyst.InternalRow): Unit
    override def write(metadata: org.apache.spark.sql.catalyst.InternalRow,
        record: org.apache.spark.sql.catalyst.InternalRow): Unit = writeWithMetadata(metadata, record)
    override def write(record: org.apache.spark.sql.catalyst.InternalRow): Unit =
      throw new UnsupportedOperationException("safetensors: DELETE got a row without its metadata " +
        "columns (_file, _row_index)")
  }

  /** The line this build is for (shown in errors and checked by the smoke run). */
  val name: String = "4.x"
}
