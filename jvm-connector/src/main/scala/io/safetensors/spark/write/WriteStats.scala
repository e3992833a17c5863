package io.safetensors.spark.write

import org.apache.spark.sql.catalyst.expressions.Attribute
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.connector.metric.{CustomMetric, CustomSumMetric, CustomTaskMetric}
import org.apache.spark.sql.execution.{SparkPlan, SparkStrategy, SQLExecution}
import org.apache.spark.sql.execution.datasources.SaveIntoDataSourceCommand
import org.apache.spark.sql.execution.datasources.v2.LeafV2CommandExec
import org.apache.spark.sql.execution.metric.{SQLMetric, SQLMetrics}
import io.safetensors.spark.SafetensorsDataSource
import io.safetensors.spark.internal.TaskMetric

/**
 * What one write added to its dataset (spec/jni.md §3, item 5): the rows (the shards'
 * `samples_count`), shards and bytes of the shards it listed in the manifest, and the tasks'
 * conversion + shard write time. [[SafetensorsWriter]] reports it after its commit to the
 * [[WriteStats.collect]] around it, if any; Spark shows it as the write node's SQL metrics.
 */
private[spark] final case class WriteStats(rows: Long, shards: Long, bytes: Long, nanos: Long) {
  def +(o: WriteStats): WriteStats =
    WriteStats(rows + o.rows, shards + o.shards, bytes + o.bytes, nanos + o.nanos)

  /** The values of [[WriteStats.Metrics]], by name. */
  def taskMetrics: Array[CustomTaskMetric] = Array(
    TaskMetric(WriteStats.RowsName, rows),
    TaskMetric(WriteStats.ShardsName, shards),
    TaskMetric(WriteStats.BytesName, bytes),
    TaskMetric(WriteStats.TimeName, nanos / 1000000L))
}

private[spark] object WriteStats {
  val Empty: WriteStats = WriteStats(0, 0, 0, 0)

  val RowsName = "safetensorsRowsWritten"
  val ShardsName = "safetensorsShardsWritten"
  val BytesName = "safetensorsBytesWritten"
  val TimeName = "safetensorsWriteTimeMs"

  /** The write metrics a write node declares (Spark instantiates each class by name to sum them). */
  def metrics: Array[CustomMetric] =
    Array(new RowsWrittenMetric, new ShardsWrittenMetric, new BytesWrittenMetric, new WriteTimeMetric)

  private final class Collector { var stats: WriteStats = Empty }

  private val current = new ThreadLocal[Collector]

  /** Runs `body` (which writes on this thread) and returns what its writes reported. */
  def collect(body: => Unit): WriteStats = {
    val outer = current.get()
    val mine = new Collector
    current.set(mine)
    try body finally current.set(outer)
    if (outer != null) outer.stats += mine.stats
    mine.stats
  }

  /** Called by a write after its commit. */
  def report(stats: WriteStats): Unit = Option(current.get()).foreach(c => c.stats += stats)
}

private[spark] final class RowsWrittenMetric extends CustomSumMetric {
  override def name(): String = WriteStats.RowsName
  override def description(): String = "safetensors rows written"
}

private[spark] final class ShardsWrittenMetric extends CustomSumMetric {
  override def name(): String = WriteStats.ShardsName
  override def description(): String = "safetensors shards written"
}

private[spark] final class BytesWrittenMetric extends CustomSumMetric {
  override def name(): String = WriteStats.BytesName
  override def description(): String = "safetensors bytes written"
}

private[spark] final class WriteTimeMetric extends CustomSumMetric {
  override def name(): String = WriteStats.TimeName
  override def description(): String = "safetensors conversion + shard write time (ms, all tasks)"
}

/**
 * `df.write.format("safetensors").save(path)` with the extensions class: Spark's V1 route runs a
 * `SaveIntoDataSourceCommand`, whose node has no metrics. This strategy plans that command (ours
 * only) as [[SafetensorsSaveExec]], which runs the very same command and shows [[WriteStats]] as
 * its SQL metrics (SQL tab, `QueryExecutionListener`'s `qe.executedPlan`). The logical plan is
 * unchanged.
 */
private[spark] object SafetensorsSaveStrategy extends SparkStrategy {
  override def apply(plan: LogicalPlan): Seq[SparkPlan] = plan match {
    case c: SaveIntoDataSourceCommand if c.dataSource.isInstanceOf[SafetensorsDataSource] =>
      SafetensorsSaveExec(c) :: Nil
    case _ => Nil
  }
}

/** Runs a `SaveIntoDataSourceCommand` of this connector as Spark's ExecutedCommandExec would,
 *  then sets and posts its [[WriteStats]] metrics from the driver. */
private[spark] final case class SafetensorsSaveExec(cmd: SaveIntoDataSourceCommand)
    extends LeafV2CommandExec {

  override def output: Seq[Attribute] = Nil

  override lazy val metrics: Map[String, SQLMetric] =
    WriteStats.metrics.map(m => m.name() -> SQLMetrics.createV2CustomMetric(sparkContext, m)).toMap

  override def nodeName: String = "Execute " + cmd.nodeName

  override def simpleString(maxFields: Int): String = "Execute " + cmd.simpleString(maxFields)

  override protected def run(): Seq[InternalRow] = {
    val stats = WriteStats.collect { cmd.run(session); () }
    stats.taskMetrics.foreach(t => metrics.get(t.name()).foreach(_.set(t.value())))
    SQLMetrics.postDriverMetricUpdates(sparkContext,
      sparkContext.getLocalProperty(SQLExecution.EXECUTION_ID_KEY), metrics.values.toSeq)
    Nil
  }
}
