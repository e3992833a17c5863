package io.safetensors.spark.write

import java.io.File

import scala.collection.mutable
import scala.jdk.CollectionConverters._

import org.apache.spark.scheduler.{SparkListener, SparkListenerTaskEnd}
import org.apache.spark.sql.{DataFrame, Row}
import org.apache.spark.sql.execution.{QueryExecution, SparkPlan}
import org.apache.spark.sql.execution.metric.SQLMetric
import org.apache.spark.sql.safetensors.{TestListenerBus, TestSqlStatus}
import org.apache.spark.sql.types._
import org.apache.spark.sql.util.QueryExecutionListener
import io.safetensors.spark.{SafetensorsExtensions, SparkSuiteBase}

/**
 * A write's rows, shards, bytes and conversion time as SQL metrics (spec/jni.md §3, item 5): on the
 * write node a `QueryExecutionListener` gets (`qe.executedPlan`) and in the SQL tab's status
 * store, for `save(path)` (with the extensions class), INSERT INTO a catalog table, and
 * `writeTo(...)`; each value equal to what the manifest lists.
 */
class WriteSqlMetricsSuite extends SparkSuiteBase {
  import SafetensorsWriteSuite.manifest

  override protected def appName: String = "safetensors-write-sql-metrics"

  override protected def sparkConf: Seq[(String, String)] = Seq(
    "spark.sql.extensions" -> classOf[SafetensorsExtensions].getName,
    "spark.sql.warehouse.dir" -> new File(base, "warehouse").getAbsolutePath,
    "spark.sql.catalogImplementation" -> "in-memory")

  /** `n` rows `(id: long, x: array<float>)` in 3 partitions. */
  private def rows(n: Int): DataFrame = {
    val schema = StructType(Seq(StructField("id", LongType), StructField("x", ArrayType(FloatType))))
    val data = (0 until n).map(i => Row(i.toLong, Seq(i.toFloat, i + 0.5f, -i.toFloat)))
    spark.createDataFrame(spark.sparkContext.parallelize(data, 3), schema)
  }

  /** A plan node and everything under it, the commands' inner plans included. */
  private def nodes(p: SparkPlan): Seq[SparkPlan] =
    p +: (p.children ++ p.innerChildren.collect { case c: SparkPlan => c }).flatMap(nodes)

  /** The safetensors write metrics the listener's plans carry (one node's), and the SQL tab's
   *  rendering of each. */
  private def observe(write: => Unit): Observed = {
    val seen = mutable.ArrayBuffer[QueryExecution]()
    var taskNanos = 0L // the tasks' write time accumulator (WriteMetricsSuite)
    val tasks = new SparkListener {
      override def onTaskEnd(e: SparkListenerTaskEnd): Unit = seen.synchronized {
        e.taskInfo.accumulables.filter(_.name.contains(WriteMetrics.WriteTimeName))
          .foreach(a => taskNanos += a.update.get.asInstanceOf[java.lang.Long].longValue())
      }
    }
    val listener = new QueryExecutionListener {
      override def onSuccess(funcName: String, qe: QueryExecution, durationNs: Long): Unit =
        seen.synchronized(seen += qe)
      override def onFailure(funcName: String, qe: QueryExecution, exception: Exception): Unit = ()
    }
    TestListenerBus.drain(spark.sparkContext)
    spark.listenerManager.register(listener)
    spark.sparkContext.addSparkListener(tasks)
    try {
      write
      TestListenerBus.drain(spark.sparkContext)
    } finally {
      spark.listenerManager.unregister(listener)
      spark.sparkContext.removeSparkListener(tasks)
    }
    val metricSets: Seq[Map[String, SQLMetric]] = seen.toSeq.flatMap(qe => nodes(qe.executedPlan))
      .map(_.metrics).filter(_.contains(WriteStats.RowsName))
      .groupBy(_(WriteStats.RowsName).id).values.map(_.head).toSeq
    assert(metricSets.size == 1, s"one write node with safetensors metrics, got ${metricSets.size}")
    val m = metricSets.head
    val names = Seq(WriteStats.RowsName, WriteStats.ShardsName, WriteStats.BytesName, WriteStats.TimeName)
    assert(names.forall(m.contains), m.keys)
    val ui = TestSqlStatus.metricValues(spark).find(_.contains(m(WriteStats.RowsName).id))
      .getOrElse(fail("the SQL tab has no execution with the write's metrics"))
    Observed(names.map(n => n -> m(n).value).toMap, names.map(n => n -> ui.getOrElse(m(n).id, "<missing>")).toMap,
      taskNanos)
  }

  private case class Observed(values: Map[String, Long], ui: Map[String, String], taskNanos: Long)

  /** rows, shards, bytes of a dataset as its manifest lists them (bytes = the files' sizes). */
  private def listed(path: String): (Long, Long, Long) = {
    val shards = manifest(path).get("shards").elements().asScala.toSeq
    val bytes = shards.map(_.get("bytes").asLong()).sum
    // the files the manifest lists (an overwrite keeps the shards it replaced for the retention)
    assert(bytes == shards.map(s => new java.io.File(path, s.get("shard_path").asText()).length()).sum)
    (shards.map(_.get("samples_count").asLong()).sum, shards.size.toLong, bytes)
  }

  private def check(observed: Observed, rows: Long, shards: Long, bytes: Long): Unit = {
    val Observed(values, ui, taskNanos) = observed
    assert(values(WriteStats.RowsName) == rows)
    assert(values(WriteStats.ShardsName) == shards)
    assert(values(WriteStats.BytesName) == bytes)
    assert(taskNanos > 0)
    assert(values(WriteStats.TimeName) == taskNanos / 1000000L)
    Seq(WriteStats.RowsName -> rows, WriteStats.ShardsName -> shards, WriteStats.BytesName -> bytes)
      .foreach { case (n, v) => assert(ui(n) == v.toString, s"SQL tab, $n: ${ui(n)} (expected $v)") }
    assert(ui(WriteStats.TimeName) == values(WriteStats.TimeName).toString)
  }

  test("save(path): the V1 command's node carries rows, shards, bytes and time equal to the manifest's") {
    val path = new File(base, "saved").getAbsolutePath
    val seen = observe(rows(1000).write.format("safetensors").option("batch_size", "150").save(path))
    val (r, s, b) = listed(path)
    assert(r == 1000 && s >= 7)
    check(seen, r, s, b)
    // KV mode, appended: the node counts this write's shards only
    val kv = new File(base, "kv").getAbsolutePath
    rows(10).selectExpr("cast(id as string) as k", "x").write.format("safetensors").option("name_col", "k")
      .save(kv)
    val before = listed(kv)
    val more = rows(30).selectExpr("cast(id + 100 as string) as k", "x")
    val appended = observe(more.write.format("safetensors").mode("append").option("name_col", "k").save(kv))
    val after = listed(kv)
    check(appended, after._1 - before._1, after._2 - before._2, after._3 - before._3)
    assert(after._1 - before._1 == 30)
  }

  test("save(path) with partitionBy: the node sums the directories' datasets") {
    val path = new File(base, "parted").getAbsolutePath
    val seen = observe(rows(90).selectExpr("id", "x", "cast(id % 3 as int) as split").write
      .format("safetensors").option("batch_size", "20").partitionBy("split").save(path))
    val dirs = (0 until 3).map(i => new File(path, s"split=$i").getAbsolutePath)
    val each = dirs.map(listed)
    assert(each.map(_._1).sum == 90 && each.forall(_._2 >= 2))
    check(seen, each.map(_._1).sum, each.map(_._2).sum, each.map(_._3).sum)
  }

  test("INSERT INTO / INSERT OVERWRITE a catalog table: the V1 write node's metrics equal the manifest's") {
    val path = new File(base, "table").getAbsolutePath
    spark.sql(s"CREATE TABLE t (id BIGINT, x ARRAY<FLOAT>) USING safetensors " +
      s"OPTIONS (batch_size '40') LOCATION '$path'")
    try {
      rows(100).createOrReplaceTempView("src")
      val inserted = observe(spark.sql("INSERT INTO t SELECT * FROM src"))
      val (r, s, b) = listed(path)
      assert(r == 100)
      check(inserted, r, s, b)
      val overwritten = observe(spark.sql("INSERT OVERWRITE t SELECT * FROM src WHERE id < 50"))
      val (r2, s2, b2) = listed(path)
      assert(r2 == 50)
      check(overwritten, r2, s2, b2)
    } finally spark.sql("DROP TABLE IF EXISTS t")
  }

  test("writeTo(t): create and append show the write node's metrics equal to the manifest's") {
    try {
      val created = observe(rows(60).writeTo("w").using("safetensors").option("batch_size", "25").create())
      val path = new File(new File(base, "warehouse"), "w").getAbsolutePath
      val (r, s, b) = listed(path)
      assert(r == 60)
      check(created, r, s, b)
      val appended = observe(rows(20).writeTo("w").option("batch_size", "25").append())
      val (r2, s2, b2) = listed(path)
      check(appended, r2 - r, s2 - s, b2 - b)
    } finally spark.sql("DROP TABLE IF EXISTS w")
  }
}
