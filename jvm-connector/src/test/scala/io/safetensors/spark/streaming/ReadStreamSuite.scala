package io.safetensors.spark.streaming

import java.io.File
import java.time.ZoneOffset
import java.time.format.DateTimeFormatter

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.ObjectMapper
import io.safetensors.spark.{Compaction, SafetensorsDataset, SparkSuiteBase, Vacuum}
import org.apache.spark.sql.DataFrame
import org.apache.spark.sql.functions.{col, udf}
import org.apache.spark.sql.streaming.{StreamingQuery, StreamingQueryException, Trigger}

/**
 * `spark.readStream.format("safetensors")` (spec/reading.md §8) with real queries on local
 * files, most of them chained into our own sink: the snapshot and then every append or stream
 * batch, each row exactly once across a query that fails mid-way and restarts, the start options,
 * the admission limits, versions that compact, delete or were vacuumed away, and bad options.
 * The local-cluster and S3 runs are in tests/python/test_spark_read_stream.py.
 */
class ReadStreamSuite extends SparkSuiteBase {
  private val mapper = new ObjectMapper()

  override protected def appName: String = "safetensors-read-stream"

  override protected def sparkConf: Seq[(String, String)] = Seq(
    "spark.sql.extensions" -> classOf[io.safetensors.spark.SafetensorsExtensions].getName,
    "spark.sql.warehouse.dir" -> new File(base, "warehouse").getAbsolutePath,
    "spark.sql.catalogImplementation" -> "in-memory")

  /** Rows `lo until hi` (`id`, `x` = [id, -id]) in `parts` partitions: one shard of 4 rows each
   *  when `hi - lo` = 4 × `parts`. */
  private def rows(lo: Long, hi: Long, parts: Int = 2): DataFrame =
    spark.range(lo, hi, 1, parts).selectExpr("id", "array(cast(id AS float), cast(-id AS float)) AS x")

  private def append(path: String, lo: Long, hi: Long, parts: Int = 2): Unit =
    rows(lo, hi, parts).write.format("safetensors").option("batch_size", "4").mode("append").save(path)

  /** The ids a dataset holds, sorted (empty when it was never written). */
  private def ids(path: String): Seq[Long] =
    if (!new File(path, "dataset_manifest.json").exists() || manifest(path).get("shards").size() == 0) Seq.empty
    else spark.read.format("safetensors").load(path).select("id").collect().map(_.getLong(0)).toSeq.sorted

  private def manifest(path: String) = mapper.readTree(new File(path, "dataset_manifest.json"))

  private def stream(src: String, options: Map[String, String] = Map.empty): DataFrame =
    spark.readStream.format("safetensors").options(options).load(src)

  /** Runs `df` into the safetensors dataset `out` (checkpoint `ck`) with Trigger.AvailableNow to
   *  the end; returns the query (its progress). */
  private def drain(df: DataFrame, out: String, ck: String, trigger: Trigger = Trigger.AvailableNow()): StreamingQuery = {
    val q = df.writeStream.format("safetensors").option("checkpointLocation", ck).option("batch_size", "4")
      .trigger(trigger).start(out)
    try q.awaitTermination() finally q.stop()
    q
  }

  /** Input rows of the query's micro-batches that read something, in order. */
  private def batchRows(q: StreamingQuery): Seq[Long] = q.recentProgress.map(_.numInputRows).filter(_ > 0).toSeq

  private def range(lo: Long, hi: Long): Seq[Long] = lo until hi

  test("a running query reads the snapshot, then each append as it is committed, into our own sink; " +
      "a stream of that sink's stream batches reads them all") {
    val (a, b, c) = (freshPath(), freshPath(), freshPath())
    append(a, 0, 8)
    append(a, 8, 16)
    val q = stream(a).writeStream.format("safetensors").option("checkpointLocation", freshPath())
      .option("batch_size", "4").trigger(Trigger.ProcessingTime("100 milliseconds")).start(b)
    try {
      q.processAllAvailable()
      assert(ids(b) == range(0, 16))
      append(a, 16, 24)
      q.processAllAvailable()
      append(a, 24, 32)
      q.processAllAvailable()
      assert(ids(b) == range(0, 32))
    } finally q.stop()
    assert(q.exception.isEmpty)
    // b's versions are stream batches: a stream of b reads every row of them once
    val ops = SafetensorsDataset.history(spark, b).select("operation").collect().map(_.getString(0)).toSet
    assert(ops.contains("stream_batch"), ops)
    drain(stream(b, Map("maxFilesPerTrigger" -> "1")), c, freshPath())
    assert(ids(c) == range(0, 32))
  }

  test("exactly once: a query failing mid-way and restarted from its checkpoint reads every row once; " +
      "a batch run again after its commit is lost plans the same shards") {
    val (a, b, ck) = (freshPath(), freshPath(), freshPath())
    (0 until 3).foreach(i => append(a, 8 * i, 8 * i + 8)) // 6 shards of 4 rows
    val poisoned = udf((id: Long) => { if (id == ReadStreamSuite.poison) throw new IllegalStateException(s"poison $id"); id })
    def run(): StreamingQuery =
      drain(stream(a, Map("maxFilesPerTrigger" -> "1")).withColumn("id", poisoned(col("id"))), b, ck)
    ReadStreamSuite.poison = 13 // in the 4th shard: the query fails in its 4th micro-batch
    val e = intercept[StreamingQueryException](run())
    assert(messages(e).contains("poison 13"), messages(e))
    val before = ids(b)
    assert(before.nonEmpty && before.size < 24 && !before.contains(13L) && before.distinct == before, before)
    append(a, 24, 32) // committed while the query was down
    ReadStreamSuite.poison = -1
    val q = run()
    assert(ids(b) == range(0, 32))
    assert(batchRows(q).forall(_ == 4), batchRows(q))
    // the checkpoint loses its record of the last batch: the restarted query runs it again, from
    // the same offsets to the same shards, and the sink records it once
    val commits = new File(ck, "commits")
    val last = commits.list().filter(_.forall(_.isDigit)).map(_.toLong).max
    new File(commits, last.toString).delete()
    new File(commits, s".$last.crc").delete()
    // (the rerun goes to foreachBatch: our sink would skip the batch it recorded without reading it)
    val seen = new java.util.concurrent.ConcurrentLinkedQueue[(Long, Seq[Long])]()
    val record: (DataFrame, Long) => Unit =
      (df, id) => seen.add(id -> df.select("id").collect().map(_.getLong(0)).toSeq.sorted)
    val again = stream(a, Map("maxFilesPerTrigger" -> "1")).writeStream.option("checkpointLocation", ck)
      .trigger(Trigger.AvailableNow()).foreachBatch(record).start()
    try again.awaitTermination() finally again.stop()
    assert(seen.asScala.toSeq == Seq(last -> range(28, 32)), seen)
    assert(ids(b) == range(0, 32))
    // the offsets Spark checkpointed are the source's JSON
    val offset = scala.io.Source.fromFile(new File(ck, s"offsets/$last")).getLines().toList.last
    assert(offset.contains("\"sourceVersion\":1") && offset.contains("\"snapshot\":false"), offset)
  }

  test("startingVersion (inclusive), latest, and startingTimestamp (first version at or after it)") {
    val a = freshPath()
    (0 until 3).foreach(i => append(a, 8 * i, 8 * i + 8)) // versions 1, 2, 3
    val fromTwo = freshPath()
    drain(stream(a, Map("startingVersion" -> "2")), fromTwo, freshPath())
    assert(ids(fromTwo) == range(8, 24))

    val (latest, latestCk) = (freshPath(), freshPath())
    drain(stream(a, Map("startingVersion" -> "latest")), latest, latestCk)
    assert(ids(latest).isEmpty)
    append(a, 24, 32) // version 4
    drain(stream(a, Map("startingVersion" -> "latest")), latest, latestCk)
    assert(ids(latest) == range(24, 32))

    val committed = SafetensorsDataset.history(spark, a).collect().map(r => r.getLong(0) -> r.getTimestamp(1)).toMap
    val fmt = DateTimeFormatter.ofPattern("yyyy-MM-dd HH:mm:ss.SSS").withZone(ZoneOffset.UTC)
    val atThree = fmt.format(committed(3L).toInstant)
    val fromTime = freshPath()
    drain(stream(a, Map("startingTimestamp" -> atThree)), fromTime, freshPath())
    assert(ids(fromTime) == range(16, 32))
    // a time after every commit: only versions committed later
    val (future, futureCk) = (freshPath(), freshPath())
    drain(stream(a, Map("startingTimestamp" -> "2999-01-01")), future, futureCk)
    assert(ids(future).isEmpty)
    append(a, 32, 40)
    drain(stream(a, Map("startingTimestamp" -> "2999-01-01")), future, futureCk)
    assert(ids(future) == range(32, 40))
  }

  test("maxFilesPerTrigger and maxBytesPerTrigger size the micro-batches; Trigger.Once reads all") {
    val a = freshPath()
    append(a, 0, 24, parts = 6) // 6 shards of 4 rows
    val shardBytes = manifest(a).get("shards").elements().asScala.map(_.get("bytes").asLong()).toSeq
    assert(shardBytes.size == 6)
    def sizes(options: Map[String, String], trigger: Trigger = Trigger.AvailableNow()): Seq[Long] = {
      val out = freshPath()
      val q = drain(stream(a, options), out, freshPath(), trigger)
      assert(ids(out) == range(0, 24))
      batchRows(q)
    }
    assert(sizes(Map.empty) == Seq(24L)) // the default, 1000 shards, takes all six
    assert(sizes(Map("maxFilesPerTrigger" -> "4")) == Seq(16L, 8L))
    assert(sizes(Map("maxBytesPerTrigger" -> (2 * shardBytes.max + shardBytes.min / 2).toString)) ==
      Seq(8L, 8L, 8L))
    // a shard larger than the limit is read alone; both limits: whichever is reached first
    assert(sizes(Map("maxBytesPerTrigger" -> "1")) == Seq.fill(6)(4L))
    assert(sizes(Map("maxBytesPerTrigger" -> "1g", "maxFilesPerTrigger" -> "5")) == Seq(20L, 4L))
    // a version larger than the limit is split across batches, then the next version follows
    append(a, 24, 32)
    val out = freshPath()
    val q = drain(stream(a, Map("startingVersion" -> "1", "maxFilesPerTrigger" -> "4")), out, freshPath())
    assert(batchRows(q) == Seq(16L, 16L) && ids(out) == range(0, 32))
    // Trigger.Once admits everything in one batch whatever the limits
    val once = freshPath()
    val q1 = drain(stream(a, Map("maxFilesPerTrigger" -> "1")), once, freshPath(), Trigger.Once())
    assert(batchRows(q1) == Seq(32L) && ids(once) == range(0, 32))
  }

  test("a compaction version gives nothing new (no row twice); a DELETE fails the stream naming the " +
      "version and skipChangeCommits, which passes over it") {
    val (a, b, ck) = (freshPath(), freshPath(), freshPath())
    (0 until 3).foreach(i => append(a, 3 * i, 3 * i + 3, parts = 1)) // three shards of 3 rows
    drain(stream(a), b, ck)
    assert(ids(b) == range(0, 9))
    Compaction.compact(spark, a).collect()
    assert(manifest(a).get("operation").asText() == "compaction")
    append(a, 9, 12, parts = 1)
    drain(stream(a), b, ck)
    assert(ids(b) == range(0, 12))

    SafetensorsDataset.delete(spark, a, "id = 1").collect()
    val deleted = manifest(a).get("manifest_version").asLong()
    append(a, 12, 16, parts = 1)
    val e = intercept[StreamingQueryException](drain(stream(a), b, ck))
    assert(messages(e).contains(s"version $deleted is a version of operation delete") &&
      messages(e).contains("skipChangeCommits=true"), messages(e))
    assert(ids(b) == range(0, 12))
    drain(stream(a, Map("skipChangeCommits" -> "true")), b, ck)
    // the rows read before the delete stay read; the version after it is read
    assert(ids(b) == range(0, 16))
  }

  test("a start version vacuumed away, and versions pruned under a stopped stream, fail naming the version") {
    val (a, b, ck) = (freshPath(), freshPath(), freshPath())
    append(a, 0, 8)
    drain(stream(a), b, ck) // read version 1
    rows(100, 108).write.format("safetensors").option("batch_size", "4").mode("overwrite").save(a)
    append(a, 108, 116)
    Vacuum.vacuum(spark, a, "0", false, true).collect() // versions 1 and 2 leave the log
    val e = intercept[StreamingQueryException](drain(stream(a), b, ck))
    assert(messages(e).contains("version 2 is no longer in _manifest_log/"), messages(e))
    val start = intercept[IllegalArgumentException](stream(a, Map("startingVersion" -> "1")))
    assert(start.getMessage.contains("option 'startingVersion' = 1") &&
      start.getMessage.contains("version 1 is no longer in the manifest log"), start.getMessage)
    // a new stream from a kept version reads on
    val fresh = freshPath()
    drain(stream(a, Map("startingVersion" -> "3")), fresh, freshPath())
    assert(ids(fresh) == range(108, 116))
  }

  test("Trigger.AvailableNow reads up to the version latest when it started: an append committed " +
      "during its run (forced, from its first batch) is read by the next run") {
    val (a, ck) = (freshPath(), freshPath())
    append(a, 0, 8) // version 1: two shards, two micro-batches of one
    val seen = new java.util.concurrent.ConcurrentLinkedQueue[Long]()
    @volatile var appended = false
    val record: (DataFrame, Long) => Unit = (df, _) => {
      df.select("id").collect().foreach(r => seen.add(r.getLong(0)))
      if (!appended) { appended = true; append(a, 8, 16) }
    }
    def run(): Unit = {
      val q = stream(a, Map("maxFilesPerTrigger" -> "1")).writeStream.option("checkpointLocation", ck)
        .trigger(Trigger.AvailableNow()).foreachBatch(record).start()
      try q.awaitTermination() finally q.stop()
    }
    run()
    assert(appended && seen.asScala.toSeq.sorted == range(0, 8), seen)
    run()
    assert(seen.asScala.toSeq.sorted == range(0, 16), seen)
  }

  test("a KV dataset streams its tensors (per-tensor rows), appends included") {
    val a = freshPath()
    def kv(keys: Seq[String], mode: String): Unit =
      spark.createDataFrame(keys.map(k => (k, Seq(k.length.toFloat)))).toDF("k", "v")
        .write.format("safetensors").option("name_col", "k").mode(mode).save(a)
    kv(Seq("a", "bb"), "errorifexists")
    val q = stream(a).writeStream.format("memory").queryName("kv_stream")
      .option("checkpointLocation", freshPath()).trigger(Trigger.ProcessingTime("100 milliseconds")).start()
    try {
      q.processAllAvailable()
      kv(Seq("ccc"), "append")
      q.processAllAvailable()
      val keys = spark.table("kv_stream").select("key").collect().map(_.getString(0)).toSeq.sorted
      assert(keys == Seq("a__v", "bb__v", "ccc__v"), keys)
    } finally q.stop()
  }

  test("readStream.table over a catalog table; each progress reports the versions and shards " +
      "still to read") {
    val (a, b) = (freshPath(), freshPath())
    (0 until 3).foreach(i => append(a, 8 * i, 8 * i + 8)) // versions 1-3, two shards each
    spark.sql(s"CREATE TABLE streamed USING safetensors LOCATION '$a'")
    try {
      val q = drain(spark.readStream.option("maxFilesPerTrigger", "2").table("streamed"), b, freshPath())
      assert(ids(b) == range(0, 24))
      val progress = q.recentProgress.filter(_.numInputRows > 0)
      val metrics = progress.map(p => p.sources.head.metrics.asScala.toMap)
      // the snapshot of version 3 (six shards), two a batch
      assert(metrics.map(_.get("numFilesOutstanding")).toSeq == Seq(Some("4"), Some("2"), Some("0")), metrics)
      assert(metrics.forall(_.get("latestVersion").contains("3")), metrics)
      assert(metrics.map(_("versionsBehind")).toSeq == Seq("1", "1", "0"), metrics)
      val shardBytes = manifest(a).get("shards").elements().asScala.map(_.get("bytes").asLong()).toSeq
      assert(metrics.head.get("numBytesOutstanding").contains(shardBytes.drop(2).sum.toString), metrics)
    } finally spark.sql("DROP TABLE IF EXISTS streamed")
  }

  test("a shard vacuumed away before its micro-batch, or between the batch's planning and its read, " +
      "fails the query naming the shard") {
    for (whenPlanned <- Seq(false, true)) {
      val a = freshPath()
      append(a, 0, 8) // version 1: two shards
      val second = manifest(a).get("shards").get(1).get("shard_path").asText()
      def removeAll(): Unit = {
        rows(100, 104).write.format("safetensors").option("batch_size", "4").mode("overwrite").save(a)
        Vacuum.vacuum(spark, a, "0", false, true).collect()
        assert(!new File(a, second).exists())
      }
      @volatile var batches = 0
      val record: (DataFrame, Long) => Unit = (df, _) => {
        df.collect()
        batches += 1
        if (!whenPlanned && batches == 1) removeAll()
      }
      if (whenPlanned) {
        DatasetStream.afterPlan = (planned: Seq[String]) =>
          if (planned.contains(second) && new File(a, second).exists()) removeAll()
      }
      try {
        val q = stream(a, Map("maxFilesPerTrigger" -> "1", "skipChangeCommits" -> "true")).writeStream
          .option("checkpointLocation", freshPath()).trigger(Trigger.AvailableNow()).foreachBatch(record).start()
        val e = intercept[StreamingQueryException](try q.awaitTermination() finally q.stop())
        assert(batches == 1 && messages(e).contains(second), messages(e))
        if (!whenPlanned) assert(messages(e).contains("is gone (vacuumed before the stream read it?)"), messages(e))
      } finally DatasetStream.afterPlan = null
    }
  }

  test("a skipped overwrite that empties the dataset: a restarted stream is told where to take its " +
      "columns from, then reads the version before it and what is appended after it") {
    val (a, b, ck) = (freshPath(), freshPath(), freshPath())
    append(a, 0, 8)
    drain(stream(a), b, ck)
    append(a, 8, 16) // version 2, not read yet
    rows(0, 0).write.format("safetensors").option("batch_size", "4").mode("overwrite").save(a) // version 3
    assert(manifest(a).get("shards").size() == 0)
    val empty = messages(intercept[Exception](drain(stream(a), b, ck)))
    assert(empty.contains("the dataset is empty") && empty.contains("option 'startingVersion'"), empty)
    // the restarted query reads on from its checkpoint; startingVersion gives it version 2's columns
    val e = intercept[StreamingQueryException](drain(stream(a, Map("startingVersion" -> "2")), b, ck))
    assert(messages(e).contains("version 3 is a version of operation overwrite"), messages(e))
    assert(ids(b) == range(0, 16)) // version 2 was read before the refusal
    drain(stream(a, Map("startingVersion" -> "2", "skipChangeCommits" -> "true")), b, ck)
    append(a, 100, 108)
    drain(stream(a, Map("skipChangeCommits" -> "true")), b, ck)
    assert(ids(b) == range(0, 16) ++ range(100, 108))
  }

  test("an offset the source did not write is refused, naming what it expects") {
    val o = StreamOffset(7, 3, snapshot = false)
    assert(StreamOffset.parse(o.json()) == o)
    Seq("""{"version":7}""", """{"sourceVersion":2,"version":7,"index":0,"snapshot":false}""", "[1]", "x")
      .foreach { bad =>
        val e = intercept[IllegalArgumentException](StreamOffset.parse(bad))
        assert(e.getMessage.contains("readStream offset"), e.getMessage)
      }
  }

  test("bad options, paths and uses fail naming the option and what is allowed") {
    val a = freshPath()
    append(a, 0, 8)
    def fails(options: Map[String, String], path: String = a): String =
      messages(intercept[Exception](drain(stream(path, options), freshPath(), freshPath())))
    def has(msg: String, parts: String*): Unit = parts.foreach(p => assert(msg.contains(p), msg))
    has(fails(Map("startingVersion" -> "two")), "'startingVersion' must be 'latest' or a version", "'two'")
    has(fails(Map("startingVersion" -> "0")), "'startingVersion' must be", "got '0'")
    has(fails(Map("startingVersion" -> "9")), "option 'startingVersion' = 9", "version 9 was never committed")
    has(fails(Map("startingVersion" -> "1", "startingTimestamp" -> "2026-01-01")),
      "one of the options 'startingVersion' and 'startingTimestamp', not both")
    has(fails(Map("startingTimestamp" -> "soon")), "startingTimestamp 'soon' is not a time")
    has(fails(Map("maxFilesPerTrigger" -> "0")), "'maxFilesPerTrigger' must be an integer in [1,")
    has(fails(Map("maxFilesPerTrigger" -> "many")), "'maxFilesPerTrigger'", "'many'")
    has(fails(Map("maxBytesPerTrigger" -> "-1")), "'maxBytesPerTrigger' must be a positive size", "512m")
    has(fails(Map("maxBytesPerTrigger" -> "lots")), "'maxBytesPerTrigger'", "'lots'")
    has(fails(Map("skipChangeCommits" -> "yes")), "option 'skipChangeCommits' must be true or false")
    has(fails(Map("ignoreDeletes" -> "true")), "unknown read option(s) 'ignoredeletes'", "skipChangeCommits")
    has(fails(Map("versionAsOf" -> "1")), "'versionAsOf' and 'timestampAsOf' choose the version of a batch read")
    has(fails(Map("versionAsOf" -> "1", "startingVersion" -> "1")), "give one of those only")
    // a batch read given a stream's start option is refused, not silently read whole
    has(messages(intercept[Exception](spark.read.format("safetensors").option("startingVersion", "1")
      .load(a).collect())), "start a readStream", "'versionAsOf'")
    // not a dataset of ours, two paths, a partitionBy root
    val plain = new File(base, "plain")
    plain.mkdirs()
    java.nio.file.Files.copy(new File(a, manifest(a).get("shards").get(0).get("shard_path").asText()).toPath,
      new File(plain, "one.safetensors").toPath)
    has(fails(Map.empty, plain.getAbsolutePath), "readStream follows one dataset")
    val root = freshPath()
    rows(0, 8).selectExpr("id", "x", "id % 2 AS half").write.format("safetensors").option("batch_size", "4")
      .partitionBy("half").save(root)
    has(fails(Map.empty, root), "is a partitionBy root", "read each partition directory as its own stream")
    // a partition directory is a dataset: it streams
    val half = freshPath()
    drain(stream(new File(root, "half=0").getAbsolutePath), half, freshPath())
    assert(ids(half) == range(0, 8).filter(_ % 2 == 0))
  }
}

object ReadStreamSuite {
  /** The id the poisoned column fails on (tasks run in this JVM: local mode); -1: none. */
  @volatile var poison: Long = -1
}
