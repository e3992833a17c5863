package org.apache.spark.sql.safetensors

import org.apache.spark.sql.SparkSession

/** Test access to what the SQL tab shows (Spark's SQL status store). */
object TestSqlStatus {
  /** Every SQL execution's metric values as the SQL tab renders them, by accumulator id. */
  def metricValues(spark: SparkSession): Seq[Map[Long, String]] = {
    val store = spark.asInstanceOf[SparkLine.ClassicSession].sharedState.statusStore
    store.executionsList().map(e => store.executionMetrics(e.executionId)).toSeq
  }
}
