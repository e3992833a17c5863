package org.apache.spark.sql.safetensors

import org.apache.hadoop.conf.Configuration
import org.apache.spark.rdd.RDD
import org.apache.spark.sql.{DataFrame, SQLContext}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.safetensors.SparkLine.{ClassicDataset, ClassicSession}

/**
 * The few Spark internals the connector needs on the DRIVER (package `org.apache.spark.sql` so
 * that `private[sql]` members are reachable). Never call from a task.
 *
 * Compiled for Spark 4.x (Scala 2.13) and Spark 3.5 (Scala 2.12) alike: the classes that moved
 * between the lines (`org.apache.spark.sql.classic.*` in 4.x) are named through the per-line shim
 * [[SparkLine]]; use `ClassicSession`/`ClassicDataset` from it, never `org.apache.spark.sql.classic`
 * directly (spec/jni.md §6 has the rules every connector source follows to build on both lines).
 */
object SparkInternals {
  private def session(sqlContext: SQLContext): ClassicSession =
    sqlContext.sparkSession.asInstanceOf[ClassicSession]

  def hadoopConf(sqlContext: SQLContext, options: Map[String, String]): Configuration =
    session(sqlContext).sessionState.newHadoopConfWithOptions(options)

  def hadoopConf(spark: org.apache.spark.sql.SparkSession,
      options: Map[String, String]): Configuration =
    spark.asInstanceOf[ClassicSession].sessionState.newHadoopConfWithOptions(options)

  /** `spark.sql.files.maxPartitionBytes`, `openCostInBytes`, `ignoreCorruptFiles`. */
  /** `spark.sql.files.ignoreMissingFiles` of the session. */
  def ignoreMissingFiles(spark: org.apache.spark.sql.SparkSession): Boolean =
    spark.asInstanceOf[ClassicSession].sessionState.conf.ignoreMissingFiles

  def filesConf(spark: org.apache.spark.sql.SparkSession): (Long, Long, Boolean) = {
    val c = spark.asInstanceOf[ClassicSession].sessionState.conf
    (c.filesMaxPartitionBytes, c.filesOpenCostInBytes, c.ignoreCorruptFiles)
  }

  /**
   * What Spark's file sources divide a scan's bytes by to size their splits
   * (`FilePartition.maxSplitBytes`): `spark.sql.files.minPartitionNum`, else the leaf-node
   * default parallelism (`spark.sql.leafNodeDefaultParallelism`, else the default parallelism).
   */
  def filesMinPartitionNum(spark: org.apache.spark.sql.SparkSession): Int = {
    val s = spark.asInstanceOf[ClassicSession]
    s.sessionState.conf.filesMinPartitionNum.getOrElse(s.leafNodeDefaultParallelism)
  }

  def caseSensitive(sqlContext: SQLContext): Boolean =
    session(sqlContext).sessionState.conf.caseSensitiveAnalysis

  /** The analyzed plan of a DataFrame (SQL on files puts it in place of a table name). */
  def logicalPlan(data: DataFrame): org.apache.spark.sql.catalyst.plans.logical.LogicalPlan =
    data.asInstanceOf[ClassicDataset[_]].logicalPlan

  /** Whether the session catalog has this table or view (SQL on files must not shadow one). */
  def tableExists(spark: org.apache.spark.sql.SparkSession,
      ident: org.apache.spark.sql.catalyst.TableIdentifier): Boolean =
  {
    val catalog = spark.asInstanceOf[ClassicSession].sessionState.catalog
    ident.database.forall(catalog.databaseExists) && catalog.tableExists(ident)
  }

  /** The schema with every column, element and field nullable (`StructType.asNullable`). */
  def asNullable(schema: org.apache.spark.sql.types.StructType): org.apache.spark.sql.types.StructType =
    schema.asNullable

  def internalRows(data: DataFrame): RDD[InternalRow] =
    data.asInstanceOf[ClassicDataset[_]].queryExecution.toRdd
}
