package io.safetensors.spark

import org.apache.spark.sql.SparkSessionExtensions

/**
 * The connector's `spark.sql.extensions` class:
 * `--conf spark.sql.extensions=io.safetensors.spark.SafetensorsExtensions`.
 */
class SafetensorsExtensions extends (SparkSessionExtensions => Unit) {
  override def apply(extensions: SparkSessionExtensions): Unit = {
    SqlOnFiles.inject(extensions)
  }
}
