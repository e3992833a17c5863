package io.safetensors.spark.commit

import java.io.File
import java.nio.charset.StandardCharsets
import java.nio.file.{Files, Paths}
import java.util.concurrent.{Callable, Executors, TimeUnit}

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.node.ObjectNode
import com.fasterxml.jackson.databind.{JsonNode, ObjectMapper}
import org.apache.spark.sql.{DataFrame, Row}
import org.apache.spark.sql.types._
import io.safetensors.spark.SparkSuiteBase
import io.safetensors.spark.write.SafetensorsWriteSuite

/**
 * A dataset directory shared by many writes (spec/dataset.md §5.3–5.4): concurrent commits, what
 * an overwrite may delete, and manifests that cannot be trusted.
 */
class DatasetCommitSuite extends SparkSuiteBase {
  import SafetensorsWriteSuite._

  private val mapper = new ObjectMapper()

  override protected def appName: String = "safetensors-dataset-commit"

  private val floatSchema = StructType(Seq(StructField("x", ArrayType(FloatType))))

  /** `n` rows whose single float is `tag * 100000 + i`: every write's rows are recognisable. */
  private def tagged(n: Int, tag: Int, parts: Int = 2): DataFrame = {
    val rows = (0 until n).map(i => Row(Seq((tag * 100000 + i).toFloat)))
    spark.createDataFrame(spark.sparkContext.parallelize(rows, parts), floatSchema)
  }

  private def manifest(path: String): JsonNode = mapper.readTree(new File(path, "dataset_manifest.json"))

  private def listed(path: String): Set[String] =
    manifest(path).get("shards").elements().asScala.map(_.get("shard_path").asText()).toSet

  private def onDisk(path: String): Set[String] =
    shardFiles(path).map(_.getName).toSet

  /** The tags of every row the manifest lists, read back through our reader. */
  private def tagsRead(path: String): Map[Int, Long] =
    spark.read.format("safetensors").load(path).collect().toSeq
      .map(r => (r.getSeq[Float](0).head.toLong / 100000).toInt)
      .groupBy(identity).map { case (t, s) => t -> s.size.toLong }

  /** Runs the bodies at once on their own threads; returns each one's outcome. */
  private def concurrently(bodies: Seq[() => Unit]): Seq[Either[Throwable, Unit]] = {
    val pool = Executors.newFixedThreadPool(bodies.size)
    try {
      val start = new java.util.concurrent.CountDownLatch(1)
      val futures = bodies.map { b =>
        pool.submit(new Callable[Either[Throwable, Unit]] {
          def call(): Either[Throwable, Unit] = {
            start.await()
            try Right(b()) catch { case t: Throwable => Left(t) }
          }
        })
      }
      start.countDown()
      futures.map(_.get(10, TimeUnit.MINUTES))
    } finally pool.shutdownNow()
  }

  /** Runs `body` with every writer's first commit attempt held until `writers` attempts have read
   *  their base: they all try to create the same version, so all but one must retry. */
  private def racingForOneVersion[T](writers: Int)(body: => T): T = {
    val barrier = new java.util.concurrent.CyclicBarrier(writers)
    val first = ThreadLocal.withInitial[java.lang.Boolean](() => true)
    val versions = new java.util.concurrent.ConcurrentLinkedQueue[Long]()
    DatasetCommit.beforeCreate = v => {
      versions.add(v)
      if (first.get()) { first.set(false); barrier.await(2, TimeUnit.MINUTES) }
    }
    try {
      val out = body
      val tried = versions.asScala.toSeq
      assert(tried.count(_ == tried.min) == writers, s"every writer first tried the same version: $tried")
      out
    } finally DatasetCommit.beforeCreate = null
  }

  test("4 concurrent appenders, 3 trials: every append that returned is listed, no shard unlisted") {
    for (trial <- 1 to 3) {
      val path = freshPath()
      tagged(1, 0, 1).write.format("safetensors").option("batch_size", "4").save(path)
      val outcomes = racingForOneVersion(4) {
        concurrently((1 to 4).map { w => () =>
          tagged(50, w).write.format("safetensors").option("batch_size", "4").mode("append").save(path)
        })
      }
      outcomes.foreach { o => assert(o.isRight, s"trial $trial: ${o.left.map(messages)}") }
      val m = manifest(path)
      assert(m.get("total_samples").asLong == 201, s"trial $trial: ${m.get("total_samples")}")
      assert(m.get("manifest_version").asLong == 5, s"trial $trial: one version per commit")
      assert(listed(path) == onDisk(path), s"trial $trial: listed ${listed(path)} vs disk ${onDisk(path)}")
      assert(tagsRead(path) == Map(0 -> 1L, 1 -> 50L, 2 -> 50L, 3 -> 50L, 4 -> 50L), s"trial $trial")
      // the log holds one entry per version (and the first version's checkpoint); the published
      // manifest is the newest version rebuilt from it
      val names = new File(path, "_manifest_log").list().toSeq.sorted
      val log = names.filter(n => DatasetCommit.parseLogName(n).isDefined)
      assert(log == (1 to 5).map(v => f"$v%020d.json"), log)
      assert(names.diff(log) == Seq(f"${1}%020d.checkpoint.json"), names)
      val fs = new org.apache.hadoop.fs.Path(path).getFileSystem(spark.sessionState.newHadoopConf())
      assert(DatasetCommit.rebuild(fs, new org.apache.hadoop.fs.Path(path, "_manifest_log"), names, 5L) ==
        new String(Files.readAllBytes(Paths.get(path, "dataset_manifest.json")), StandardCharsets.UTF_8))
    }
  }

  test("an overwrite racing an append (retention 0): the manifest lists exactly the files on disk, in a serial order") {
    for (trial <- 1 to 3) {
      val path = freshPath()
      // retention 0: the overwrite deletes the shards it supersedes at its commit (§5.8.1)
      val w = (df: DataFrame) => df.write.format("safetensors").option("batch_size", "4").option("retention", "0")
      w(tagged(10, 0)).save(path)
      val outcomes = racingForOneVersion(2) {
        concurrently(Seq(
          () => w(tagged(20, 1)).mode("overwrite").save(path),
          () => w(tagged(30, 2)).mode("append").save(path)))
      }
      outcomes.foreach { o => assert(o.isRight, s"trial $trial: ${o.left.map(messages)}") }
      assert(listed(path) == onDisk(path), s"trial $trial")
      // append then overwrite: the overwrite's rows only; overwrite then append: both
      val tags = tagsRead(path)
      assert(tags == Map(1 -> 20L) || tags == Map(1 -> 20L, 2 -> 30L), s"trial $trial: $tags")
      assert(manifest(path).get("manifest_version").asLong == 3)
    }
  }

  test("overwrite (retention 0) removes only the shards its manifest listed: foreign files stay") {
    // a directory that is not a dataset: its files are left alone, and not read as the dataset
    val path = freshPath()
    new File(path).mkdirs()
    Files.write(Paths.get(path, "notes.safetensors"), Array[Byte](1, 2, 3))
    Files.write(Paths.get(path, "README.txt"), "mine".getBytes(StandardCharsets.UTF_8))
    tagged(8, 1).write.format("safetensors").option("batch_size", "4").option("retention", "0")
      .mode("overwrite").save(path)
    assert(new File(path, "notes.safetensors").exists() && new File(path, "README.txt").exists())
    assert(tagsRead(path) == Map(1 -> 8L))
    // a dataset with a file it does not list: an overwrite keeps that file too
    val model = Paths.get(path, "my_model.safetensors")
    Files.copy(shardFiles(path).head.toPath, model)
    val before = listed(path)
    tagged(4, 2).write.format("safetensors").option("batch_size", "4").mode("overwrite").save(path)
    assert(Files.exists(model) && new File(path, "notes.safetensors").exists())
    before.foreach(f => assert(!new File(path, f).exists(), s"$f was listed by the replaced manifest"))
    assert(tagsRead(path) == Map(2 -> 4L))
  }

  test("a tampered manifest (../, absolute, scheme, NUL) fails every write and read naming the entry; nothing is deleted") {
    val victimDir = new File(base, s"victim-${System.nanoTime()}")
    victimDir.mkdirs()
    val victim = new File(victimDir, "important.txt")
    Files.write(victim.toPath, "keep me".getBytes(StandardCharsets.UTF_8))
    for (entry <- Seq(s"../${victimDir.getName}/important.txt", victim.getAbsolutePath,
        "s3a://bucket/x.safetensors", "x\u0000.safetensors")) {
      val path = freshPath()
      tagged(8, 1).write.format("safetensors").option("batch_size", "4").save(path)
      val m = manifest(path).asInstanceOf[ObjectNode]
      m.get("shards").get(0).asInstanceOf[ObjectNode].put("shard_path", entry)
      Files.write(Paths.get(path, "dataset_manifest.json"), mapper.writeValueAsBytes(m))
      val before = snapshot(path)
      for (mode <- Seq("overwrite", "append")) {
        val e = intercept[Exception] {
          tagged(4, 2).write.format("safetensors").option("batch_size", "4").mode(mode).save(path)
        }
        assert(messages(e).contains("is not a shard file name"), s"$mode $entry: ${messages(e)}")
        assert(messages(e).contains(entry.replace("\u0000", "\\0")), s"$mode: names the entry: ${messages(e)}")
        assert(snapshot(path) == before, s"$mode $entry changed the dataset")
      }
      val r = intercept[Exception](spark.read.format("safetensors").load(path).count())
      assert(messages(r).contains("is not a shard file name"), messages(r))
      assert(victim.exists())
    }
  }

  test("a tampered _manifest_log entry newer than dataset_manifest.json fails a write naming the entry, not the intact manifest") {
    val path = freshPath()
    tagged(8, 1).write.format("safetensors").option("batch_size", "4").save(path)
    // a newer version in the log (as a writer that crashed before publishing leaves one), tampered
    val m = manifest(path).asInstanceOf[ObjectNode]
    val next = m.get("manifest_version").asLong() + 1
    m.put("manifest_version", next)
    m.get("shards").get(0).asInstanceOf[ObjectNode].put("shard_path", "../elsewhere.safetensors")
    val entry = Paths.get(path, DatasetCommit.LogDir, DatasetCommit.logName(next))
    Files.write(entry, mapper.writeValueAsBytes(m))
    val before = snapshot(path)
    for (mode <- Seq("overwrite", "append")) {
      val e = intercept[Exception] {
        tagged(4, 2).write.format("safetensors").option("batch_size", "4").mode(mode).save(path)
      }
      val msg = messages(e)
      assert(msg.contains(s"${DatasetCommit.LogDir}/${DatasetCommit.logName(next)}"), s"$mode: names the log entry: $msg")
      assert(!msg.contains("dataset_manifest.json"), s"$mode: blames the intact manifest: $msg")
      assert(msg.contains("../elsewhere.safetensors"), s"$mode: names the bad shard entry: $msg")
      assert(snapshot(path) == before, s"$mode changed the dataset")
    }
  }

  private def kv(keys: Seq[String], value: Float, parts: Int = 2): DataFrame = {
    val schema = StructType(Seq(StructField("k", StringType), StructField("v", ArrayType(FloatType))))
    spark.createDataFrame(spark.sparkContext.parallelize(keys.map(k => Row(k, Seq(value))), parts), schema)
  }

  test("KV keys hold across appends with fail: a key stored again fails naming it and both shards, nothing is listed") {
    val path = freshPath()
    kv(Seq("a", "b__x", "c"), 1f).write.format("safetensors").option("name_col", "k").save(path)
    kv(Seq("d", "e"), 2f).write.format("safetensors").option("name_col", "k").mode("append").save(path)
    val before = snapshot(path)
    val oldHolder = listed(path).find(f => readShard(new File(path, f)).tensors.contains("b__x__v")).get
    val e = intercept[Exception] {
      kv(Seq("f", "b__x"), 3f).write.format("safetensors").option("name_col", "k").mode("append").save(path)
    }
    val msg = messages(e)
    assert(msg.contains("key 'b__x' is already in the dataset") && msg.contains(oldHolder), msg)
    assert(msg.contains("duplicatesStrategy=fail"), msg)
    assert(snapshot(path) == before, "the failed append changed the dataset")
    assert(spark.read.format("safetensors").load(path).count() == 5)
  }

  test("KV lastWin across appends (retention 0): the appended copy replaces the stored one for every reader") {
    for (index <- Seq(false, true)) {
      val path = freshPath()
      // retention 0: the replaced shards are deleted at the commit (DatasetVacuumSuite: kept)
      val w = (df: DataFrame) => df.write.format("safetensors").option("name_col", "k")
        .option("duplicatesStrategy", "lastWin").option("generate_index", index.toString)
        .option("retention", "0")
      w(kv(Seq("a", "b__x", "c"), 1f, parts = 1)).save(path)
      w(kv(Seq("d"), 2f, parts = 1)).mode("append").save(path)
      val firstShard = listed(path).find(f => readShard(new File(path, f)).tensors.contains("a__v")).get
      val dShard = listed(path).find(f => readShard(new File(path, f)).tensors.contains("d__v")).get
      // replaces b__x and c of the first write, and d (its shard is left empty: dropped)
      w(kv(Seq("c", "d", "b__x", "z"), 3f)).mode("append").save(path)
      val m = manifest(path)
      assert(m.get("total_samples").asLong == 5, m) // a, b__x, c, d, z
      assert(listed(path) == onDisk(path))
      assert(!new File(path, firstShard).exists() && !new File(path, dShard).exists())
      val values = spark.read.format("safetensors").load(path).collect()
        .map(r => r.getAs[String]("key") -> r.getAs[Seq[Float]]("decoded").head).toMap
      assert(values == Map("a__v" -> 1f, "b__x__v" -> 3f, "c__v" -> 3f, "d__v" -> 3f, "z__v" -> 3f), values)
      val rewritten = listed(path).find(f => readShard(new File(path, f)).tensors.contains("a__v")).get
      assert(readShard(new File(path, rewritten)).metadata("safetensors_spark.samples") == "1")
      if (index) {
        val rows = spark.read.parquet(new File(path, "_tensor_index.parquet").getAbsolutePath)
          .select("tensor_key", "file_name").collect().map(r => r.getString(0) -> r.getString(1)).toSet
        assert(rows.map(_._1) == values.keySet && rows.map(_._2) == listed(path), rows)
        assert(spark.read.format("safetensors").load(path).where("key = 'c__v'").count() == 1)
      }
    }
  }

  test("KV lastWin rewriting two older shards with one partition and shard number keeps both copies") {
    val path = freshPath()
    val w = (df: DataFrame) => df.write.format("safetensors").option("name_col", "k")
      .option("duplicatesStrategy", "lastWin").option("retention", "0")
    // two writes of one Spark partition each: both shards are part-00000-0000-<their write id>
    w(kv(Seq("a", "c"), 1f, parts = 1)).save(path)
    w(kv(Seq("d", "e"), 2f, parts = 1)).mode("append").save(path)
    assert(listed(path).map(_.take(15)) == Set("part-00000-0000"), listed(path))
    // replaces c and d: both older shards are rewritten in one commit, keeping a and e
    w(kv(Seq("c", "d"), 3f, parts = 1)).mode("append").save(path)
    assert(listed(path) == onDisk(path) && listed(path).size == 3, listed(path))
    val values = spark.read.format("safetensors").load(path).collect()
      .map(r => r.getAs[String]("key") -> r.getAs[Seq[Float]]("decoded").head).toMap
    assert(values == Map("a__v" -> 1f, "c__v" -> 3f, "d__v" -> 3f, "e__v" -> 2f), values)
    assert(manifest(path).get("total_samples").asLong == 4)
  }

  test("KV columns whose names would split two ways are refused at plan time") {
    val schema = StructType(Seq(StructField("k", StringType), StructField("c", ArrayType(FloatType)),
      StructField("b__c", ArrayType(FloatType))))
    val df = spark.createDataFrame(spark.sparkContext.parallelize(Seq(Row("x", Seq(1f), Seq(2f)))), schema)
    val path = freshPath()
    val e = intercept[IllegalArgumentException] {
      df.write.format("safetensors").option("name_col", "k").save(path)
    }
    assert(e.getMessage.contains("columns 'c' and 'b__c' cannot both be written with kv_separator '__'"), e.getMessage)
    assert(!new File(path).exists())
    // another separator splits them one way
    df.write.format("safetensors").option("name_col", "k").option("kv_separator", "::").save(path)
    assert(readShard(shardFiles(path).head).tensors.keySet == Set("x::c", "x::b__c"))
  }

  test("a manifest with only the published fields (another writer's) is read, and replaced by an overwrite") {
    val path = freshPath()
    tagged(8, 1).write.format("safetensors").option("batch_size", "4").save(path)
    val m = manifest(path).asInstanceOf[ObjectNode]
    val published = Seq("format_version", "safetensors_version", "total_samples", "total_bytes", "shards", "schema")
    m.fieldNames().asScala.toSeq.filterNot(published.contains).foreach(m.remove)
    m.get("shards").elements().asScala.foreach { s =>
      val o = s.asInstanceOf[ObjectNode]
      o.fieldNames().asScala.toSeq.filterNot(Set("shard_path", "samples_count", "bytes")).foreach(o.remove)
    }
    Files.write(Paths.get(path, "dataset_manifest.json"), mapper.writeValueAsBytes(m))
    new File(path, "_manifest_log").listFiles().foreach(_.delete())
    // the shards carry their own layout: read per sample through the headers
    assert(spark.read.format("safetensors").load(path).count() == 8)
    val e = intercept[IllegalArgumentException] {
      tagged(4, 2).write.format("safetensors").option("batch_size", "4").mode("append").save(path)
    }
    assert(e.getMessage.contains("only the published fields"), e.getMessage)
    tagged(4, 2).write.format("safetensors").option("batch_size", "4").mode("overwrite").save(path)
    assert(tagsRead(path) == Map(2 -> 4L))
    assert(listed(path) == onDisk(path))
  }
}
