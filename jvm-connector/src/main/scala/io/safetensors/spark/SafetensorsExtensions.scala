package io.safetensors.spark

import org.apache.spark.sql.SparkSessionExtensions
import io.safetensors.spark.catalog.SqlOnFiles
import io.safetensors.spark.expressions.TensorFunctions
import io.safetensors.spark.write.SafetensorsSaveStrategy

/**
 * The connector's `spark.sql.extensions` class:
 * `.config("spark.sql.extensions", "io.safetensors.spark.SafetensorsExtensions")`
 * (`safetensors_spark.spark.configure` sets it). Reads and writes through the DataFrame API work
 * without it; it adds the SQL functions `arr_to_st` and `st_to_array` ([[TensorFunctions]],
 * spec/functions.md), SQL on files, `SELECT … FROM safetensors.`path`` ([[SqlOnFiles]],
 * spec/sql.md), and SQL metrics for `save(path)` ([[SafetensorsSaveStrategy]]).
 */
class SafetensorsExtensions extends (SparkSessionExtensions => Unit) {
  override def apply(extensions: SparkSessionExtensions): Unit = {
    TensorFunctions.inject(extensions)
    SqlOnFiles.inject(extensions)
    // save(path)'s SQL metrics (spec/jni.md §3, item 5)
    extensions.injectPlannerStrategy(_ => SafetensorsSaveStrategy)
  }
}
