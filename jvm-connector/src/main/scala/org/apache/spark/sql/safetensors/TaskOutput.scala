package org.apache.spark.sql.safetensors

import org.apache.spark.TaskContext

/**
 * A write task's output metrics (`outputMetrics.bytesWritten` / `recordsWritten`: the stage
 * page's "Output" column and `SparkListener.onTaskEnd`), whose setters are `private[spark]`.
 * Called from tasks; touches no session.
 */
object TaskOutput {
  def add(ctx: TaskContext, bytes: Long, records: Long): Unit = {
    val m = ctx.taskMetrics().outputMetrics
    m.setBytesWritten(m.bytesWritten + bytes)
    m.setRecordsWritten(m.recordsWritten + records)
  }
}
