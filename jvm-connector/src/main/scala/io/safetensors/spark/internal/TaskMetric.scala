package io.safetensors.spark.internal

import org.apache.spark.sql.connector.metric.CustomTaskMetric

private[spark] object TaskMetric {
  /** A metric value as a V2 scan or write reports it (matched by name to its `CustomMetric`). */
  def apply(metricName: String, metricValue: Long): CustomTaskMetric = new CustomTaskMetric {
    override def name(): String = metricName
    override def value(): Long = metricValue
  }
}
