package io.safetensors.spark.streaming

import org.apache.spark.sql.{DataFrame, SQLContext, SaveMode}
import org.apache.spark.sql.execution.streaming.Sink
import org.apache.spark.sql.streaming.OutputMode
import io.safetensors.spark.internal.ConnectorOptions
import io.safetensors.spark.write.SafetensorsWriter

/**
 * `writeStream.format("safetensors")` (spec/dataset.md §5.7): every micro-batch is one append
 * through the batch writer ([[SafetensorsWriter.write]]: plan, tasks, staging, versioned commit),
 * whose manifest version also records the batch as its query's last committed one. A batch the
 * manifest already records (a restart re-running the last batch, or a replay) writes nothing.
 *
 * A V1 [[Sink]] rather than a V2 `StreamingWrite`: Spark hands it each micro-batch as a DataFrame
 * with its batch id, exactly what the batch writer takes, so streaming and batch writes share
 * one job and one commit; a V2 streaming write would push rows into per-task `DataWriter`s and
 * need a second task and commit path. Micro-batch triggers only (no continuous processing).
 */
private[spark] final class SafetensorsStreamSink(sqlContext: SQLContext,
    parameters: Map[String, String]) extends Sink {

  private val path = ConnectorOptions.path(parameters)

  override def addBatch(batchId: Long, data: DataFrame): Unit = {
    // set by Spark's stream execution on the thread that runs the batch; stable across restarts
    // from the same checkpoint
    val queryId = Option(data.sparkSession.sparkContext.getLocalProperty(SafetensorsStreamSink.QueryIdKey))
      .getOrElse(throw new IllegalStateException(
        s"safetensors: micro-batch $batchId to ${path.getOrElse("?")} has no streaming query id"))
    SafetensorsWriter.write(sqlContext, SaveMode.Append, parameters, data,
      Some(SafetensorsWriter.StreamBatch(queryId, batchId)))
  }

  override def toString: String = s"SafetensorsSink[${path.getOrElse("")}]"
}

private[spark] object SafetensorsStreamSink {
  /** The SparkContext local property holding the running query's id (Spark's
   *  `StreamExecution.QUERY_ID_KEY`; that class moved between 4.0 and 4.1, its key did not). */
  val QueryIdKey = "sql.streaming.queryId"

  /** Options Spark's DataStreamWriter passes to the sink that are its own, not the writer's. */
  private val StreamingOptions = Set("checkpointlocation")

  def create(sqlContext: SQLContext, parameters: Map[String, String],
      partitionColumns: Seq[String], outputMode: OutputMode): Sink = {
    if (outputMode != OutputMode.Append()) {
      throw new IllegalArgumentException(
        s"safetensors: the streaming sink supports outputMode append only (got $outputMode): " +
          "every micro-batch adds shards, none replaces earlier rows")
    }
    if (partitionColumns.nonEmpty) {
      throw new IllegalArgumentException(
        "safetensors: partitionBy is not supported by the streaming sink (got " +
          partitionColumns.mkString(", ") + "); write each partition's stream to its own path")
    }
    val path = ConnectorOptions.path(parameters)
    if (path.forall(_.isEmpty)) {
      throw new IllegalArgumentException(
        "safetensors: the streaming sink needs an output path (.start(path) or .option(\"path\", ...))")
    }
    new SafetensorsStreamSink(sqlContext,
      parameters.filter { case (k, _) => !StreamingOptions(k.toLowerCase(java.util.Locale.ROOT)) })
  }
}
