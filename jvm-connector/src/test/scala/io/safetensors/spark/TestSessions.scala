package io.safetensors.spark

import org.apache.spark.sql.SparkSession

/** The one way suites build their (single, shared) local SparkSession. */
object TestSessions {
  /** local[2] on the loopback, no UI, 2 shuffle partitions, no task retries, plus `extra`. */
  def local(appName: String, extra: (String, String)*): SparkSession = {
    val b = SparkSession.builder()
      .master("local[2]")
      .appName(appName)
      .config("spark.ui.enabled", "false")
      .config("spark.sql.shuffle.partitions", "2")
      .config("spark.driver.host", "127.0.0.1")
      .config("spark.driver.bindAddress", "127.0.0.1")
      .config("spark.task.maxFailures", "1")
    extra.foreach { case (k, v) => b.config(k, v) }
    b.getOrCreate()
  }
}
