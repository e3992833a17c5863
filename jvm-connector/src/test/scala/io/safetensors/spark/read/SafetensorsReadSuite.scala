package io.safetensors.spark.read

import java.io.File
import java.nio.{ByteBuffer, ByteOrder}
import java.nio.charset.StandardCharsets
import java.nio.file.Files

import scala.jdk.CollectionConverters._

import org.apache.spark.SparkEnv
import org.apache.spark.sql.{DataFrame, Row}
import org.apache.spark.sql.execution.datasources.v2.BatchScanExec
import org.apache.spark.sql.functions.col
import org.apache.spark.sql.safetensors.SparkInternals
import org.apache.spark.sql.types._
import io.safetensors.spark.{SparkSuiteBase, TestRemoteFileSystem}
import io.safetensors.spark.internal.SerializableConf
import io.safetensors.spark.write.SafetensorsWriteSuite

/**
 * The read path measured by what it reads: the connector's `safetensorsBytesRead` scan metric
 * (headers + data bytes the Rust task took) and, for the non-local `testfs` scheme, the bytes
 * that actually went through the Hadoop streams. Values are checked too.
 */
class SafetensorsReadSuite extends SparkSuiteBase {
  import SafetensorsWriteSuite._

  override protected def appName: String = "safetensors-read"

  override protected def sparkConf: Seq[(String, String)] = TestRemoteFileSystem.sparkConf :+ ("spark.sql.adaptive.enabled" -> "false")

  private def remote(local: String): String = s"${TestRemoteFileSystem.Scheme}://$local"

  /** 8 + N of a file. */
  private def headerBytes(f: File): Long = {
    val in = Files.newInputStream(f.toPath)
    try {
      val b = in.readNBytes(8)
      8L + ByteBuffer.wrap(b).order(ByteOrder.LITTLE_ENDIAN).getLong
    } finally in.close()
  }

  /** Collects `df` and returns its rows with the scan's bytes-read metric. */
  private def collectMeasured(df: DataFrame): (Array[Row], Long) = {
    val rows = df.collect()
    val scans = df.queryExecution.executedPlan.collect { case s: BatchScanExec => s }
    assert(scans.size == 1, df.queryExecution.executedPlan.toString)
    (rows, scans.head.metrics(BytesReadMetric.Name).value)
  }

  /** `n` rows: id (long), x = 16 floats derived from id. */
  private def batchFrame(n: Int): DataFrame = {
    val schema = StructType(Seq(StructField("id", LongType), StructField("x", ArrayType(FloatType))))
    val rows = (0 until n).map(i => Row(i.toLong, (0 until 16).map(j => i * 0.5f + j)))
    spark.createDataFrame(spark.sparkContext.parallelize(rows, 2), schema)
  }

  test("batch dataset per sample: local and remote reads give the written rows and read only the selected columns") {
    val path = freshPath()
    val n = 1000
    batchFrame(n).write.format("safetensors").option("batch_size", "128").save(path)
    val shards = shardFiles(path)
    val headers = shards.map(headerBytes).sum
    val expected = batchFrame(n).collect().map(r => (r.getLong(0), r.getSeq[Float](1))).toMap

    for (uri <- Seq(path, remote(path))) {
      // the read policies of this read only (the queue is the JVM's: another suite's writes to
      // testfs, e.g. Hadoop's whole-file copies of index parts, may have run before)
      TestRemoteFileSystem.readPolicies.clear()
      val df = spark.read.format("safetensors").load(uri)
      assert(df.schema.fieldNames.toSeq == Seq("id", "x"), df.schema)
      assert(df.schema("x").dataType == ArrayType(FloatType, containsNull = false))

      val (all, allBytes) = collectMeasured(df)
      assert(all.length == n)
      assert(all.map(r => (r.getLong(0), r.getSeq[Float](1))).toMap == expected)
      assert(allBytes == headers + n * 8L + n * 64L, uri)

      val (ids, idBytes) = collectMeasured(df.select("id"))
      assert(ids.map(_.getLong(0)).sorted.toSeq == (0 until n).map(_.toLong))
      assert(idBytes == headers + n * 8L, uri)

      val before = TestRemoteFileSystem.bytesRead.get()
      val (sums, xBytes) = collectMeasured(df.selectExpr("sum(x[3])"))
      val streamed = TestRemoteFileSystem.bytesRead.get() - before
      assert(sums.head.getDouble(0) == (0 until n).map(i => i * 0.5 + 3).sum)
      assert(xBytes == headers + n * 64L, uri)
      if (uri.startsWith(TestRemoteFileSystem.Scheme)) {
        assert(streamed == xBytes, "bytes through the Hadoop streams = what the task reports")
        // every shard stream opened for ranged reads (object stores: no read-to-the-end GET)
        assert(TestRemoteFileSystem.readPolicies.size >= shards.size &&
          TestRemoteFileSystem.readPolicies.asScala.forall(_ == "random"),
          TestRemoteFileSystem.readPolicies)
      } else assert(streamed == 0L)

      val (count, countBytes) = collectMeasured(df.groupBy().count())
      assert(count.head.getLong(0) == n)
      assert(countBytes == headers, "count() reads headers only")

      val files = df.select("_file").distinct().collect().map(_.getString(0)).toSet
      assert(files.size == shards.size && files.forall(_.startsWith(
        if (uri == path) "file:" else TestRemoteFileSystem.Scheme)), files)
      val meta = df.select("_metadata").head().getMap[String, String](0)
      assert(meta("safetensors_spark.layout") == "batch")
    }
  }

  test("tasks open files with the Hadoop configuration the driver listed with, shipped once as a broadcast") {
    val path = freshPath()
    val n = 300
    batchFrame(n).write.format("safetensors").option("batch_size", "128").save(path)
    val key = TestRemoteFileSystem.MarkerKey
    try {
      spark.conf.set(key, "listed")
      val df = spark.read.format("safetensors").load(remote(path)).selectExpr("sum(x[3])")
      spark.conf.set(key, "later")
      TestRemoteFileSystem.opens.clear()
      assert(df.collect().head.getDouble(0) == (0 until n).map(i => i * 0.5 + 3).sum)
      val inTasks = TestRemoteFileSystem.opens.asScala.toSeq.filter(_._1).map(_._2)
      assert(inTasks.size == shardFiles(path).size, TestRemoteFileSystem.opens)
      assert(inTasks.forall(_ == "listed"), inTasks)

      // The factory every task deserializes holds a broadcast handle, not the ~1,000 entries.
      val scan = df.queryExecution.executedPlan.collect { case s: BatchScanExec => s }.head
      val ser = SparkEnv.get.closureSerializer.newInstance()
      val factoryBytes = ser.serialize(scan.readerFactory).limit()
      val confBytes = ser.serialize(new SerializableConf(SparkInternals.hadoopConf(spark, Map.empty))).limit()
      assert(factoryBytes * 10 < confBytes, s"reader factory $factoryBytes B, configuration $confBytes B")
    } finally spark.conf.unset(key)
  }

  test("KV dataset per tensor: key filters are pushed and only the matching shard is opened") {
    val path = freshPath()
    val keys = (0 until 3000).map(i => f"k$i%04d")
    val schema = StructType(Seq(StructField("k", StringType), StructField("v", ArrayType(FloatType))))
    val rows = keys.zipWithIndex.map { case (k, i) => Row(k, Seq.fill(256)(i.toFloat)) }
    spark.createDataFrame(spark.sparkContext.parallelize(rows, 2), schema)
      .write.format("safetensors").option("name_col", "k").option("target_shard_size_mb", "1")
      .save(path)
    val shards = shardFiles(path)
    assert(shards.size >= 4, shards)
    val holder = shards.find(f => readShard(f).tensors.contains("k0042__v")).get

    val df = spark.read.format("safetensors").load(path)
    assert(df.schema.fieldNames.toSeq ==
      Seq("file", "key", "dtype", "shape", "byte_size", "data", "decoded", "metadata", "flags",
        "model_info", "sha256"))

    val one = df.where(col("key") === "k0042__v").select("key", "dtype", "shape", "decoded")
    // The key filter reaches the scan (Spark's IsNotNull(key) is not used, so not listed).
    assert(one.queryExecution.executedPlan.toString.contains("pushed=[EqualTo(key,k0042__v)]"),
      one.queryExecution.executedPlan)
    val (got, bytes) = collectMeasured(one)
    assert(got.length == 1)
    assert(got.head.getString(1) == "F32" && got.head.getSeq[Long](2) == Seq(256L))
    assert(got.head.getSeq[Float](3) == Seq.fill(256)(42f))
    assert(bytes == headerBytes(holder) + 1024L, "one header and one tensor")

    val (prefixed, _) = collectMeasured(df.where(col("key").startsWith("k01")).select("key"))
    assert(prefixed.map(_.getString(0)).sorted.toSeq == (100 until 200).map(i => f"k$i%04d__v"))

    val (listed, listBytes) = collectMeasured(df.where(col("key").isin("k0001__v", "k2999__v"))
      .select("key", "byte_size"))
    assert(listed.map(r => r.getString(0) -> r.getLong(1)).toMap ==
      Map("k0001__v" -> 1024L, "k2999__v" -> 1024L))
    val listHolders = shards.filter(f => readShard(f).tensors.keySet.exists(Set("k0001__v", "k2999__v")))
    assert(listHolders.size == 2, listHolders)
    assert(listBytes == listHolders.map(headerBytes).sum,
      "the headers of the two shards holding the keys, no other header, no data bytes")

    assert(df.count() == 3000)
    assert(df.where(col("dtype") === "F32").count() == 3000)
    assert(df.where(col("dtype") === "BF16").count() == 0)
  }

  test("KV key lookups go through _tensor_index.parquet: the driver reads no shard header") {
    val keys = (0 until 600).map(i => f"k$i%04d")
    val schema = StructType(Seq(StructField("k", StringType), StructField("v", ArrayType(FloatType))))
    val rows = keys.zipWithIndex.map { case (k, i) => Row(k, Seq.fill(256)(i.toFloat)) }
    for (index <- Seq(true, false)) {
      val path = freshPath()
      spark.createDataFrame(spark.sparkContext.parallelize(rows, 6), schema)
        .write.format("safetensors").option("name_col", "k").option("target_shard_size_mb", "1")
        .option("generate_index", index.toString).save(path)
      val shards = shardFiles(path)
      assert(shards.size >= 5, shards)
      val indexDir = new File(path, "_tensor_index.parquet")
      assert(indexDir.exists() == index)
      // parts this small (< 64 KiB) are read whole: the driver reads each listed shard's part
      val indexBytes = if (index) indexDir.listFiles().map(_.length()).sum else 0L
      if (index) assert(indexDir.list().length == shards.size)
      val holder = shards.find(f => readShard(f).tensors.contains("k0042__v")).get
      val manifestBytes = new File(path, "dataset_manifest.json").length()

      val before = TestRemoteFileSystem.bytesRead.get()
      val df = spark.read.format("safetensors").load(remote(path))
      val one = df.where(col("key") === "k0042__v").select("file", "key", "shape", "decoded")
      val (got, taskBytes) = collectMeasured(one)
      val streamed = TestRemoteFileSystem.bytesRead.get() - before
      assert(got.length == 1)
      assert(got.head.getString(0).endsWith("/" + holder.getName))
      assert(got.head.getString(1) == "k0042__v" && got.head.getSeq[Long](2) == Seq(256L))
      assert(got.head.getSeq[Float](3) == Seq.fill(256)(42f))
      assert(taskBytes == headerBytes(holder) + 1024L, "the task: one header and one tensor")
      if (index) {
        assert(streamed == manifestBytes + indexBytes + headerBytes(holder) + 1024L,
          s"driver: manifest + index, executor: one header + one tensor ($streamed bytes)")
      } else {
        assert(streamed == manifestBytes + shards.map(headerBytes).sum + headerBytes(holder) + 1024L,
          s"without an index the driver reads every header ($streamed bytes)")
      }

      // Prefix and IN lookups, and other columns' predicates with them.
      val (prefixed, _) = collectMeasured(df.where(col("key").startsWith("k01")).select("key"))
      assert(prefixed.map(_.getString(0)).sorted.toSeq == (100 until 200).map(i => f"k$i%04d__v"))
      val (listed, _) = collectMeasured(df.where(col("key").isin("k0001__v", "k0599__v", "zz"))
        .select("key", "byte_size"))
      assert(listed.map(r => r.getString(0) -> r.getLong(1)).toMap ==
        Map("k0001__v" -> 1024L, "k0599__v" -> 1024L))
      assert(df.where(col("key").startsWith("k00") && col("dtype") === "BF16").count() == 0)
      assert(df.where(col("key").startsWith("k00") && col("dtype") === "F32").count() == 100)
      assert(df.count() == 600)

      // A stale index (a shard rewritten behind its back, same length) fails the task loudly.
      if (index) {
        val victim = new File(holder.getPath)
        val bytes = Files.readAllBytes(victim.toPath)
        val text = new String(bytes, StandardCharsets.ISO_8859_1)
        val renamed = text.replace("\"k0042__v\"", "\"k0042__w\"")
        assert(renamed != text)
        Files.write(victim.toPath, renamed.getBytes(StandardCharsets.ISO_8859_1))
        val e = intercept[Exception](spark.read.format("safetensors").load(remote(path))
          .where(col("key") === "k0042__v").select("key").collect())
        assert(messages(e).contains("changed since the scan was planned"), messages(e))
      }
    }
  }

  test("a key lookup reads the footer and the matching row group of each index part, not the whole index") {
    // one shard of 40,000 keys: its part has 5 row groups of 8192 rows
    val n = 40000
    val schema = StructType(Seq(StructField("k", StringType), StructField("v", ArrayType(FloatType))))
    val rows = (0 until n).map(i => Row(f"k$i%06d", Seq(i.toFloat)))
    val path = freshPath()
    spark.createDataFrame(spark.sparkContext.parallelize(rows, 1), schema)
      .write.format("safetensors").option("name_col", "k").option("generate_index", "true").save(path)
    val shards = shardFiles(path)
    assert(shards.size == 1, shards)
    val part = new File(new File(path, "_tensor_index.parquet"), shards.head.getName.stripSuffix(".safetensors") + ".parquet")
    assert(part.length() > 300000L, part.length())
    val manifestBytes = new File(path, "dataset_manifest.json").length()
    val before = TestRemoteFileSystem.bytesRead.get()
    val df = spark.read.format("safetensors").load(remote(path))
    val (got, taskBytes) = collectMeasured(df.where(col("key") === "k031234__v").select("key", "decoded"))
    val driver = TestRemoteFileSystem.bytesRead.get() - before - taskBytes
    assert(got.map(_.getString(0)).toSeq == Seq("k031234__v"))
    assert(got.head.getSeq[Float](1) == Seq(31234f))
    // the manifest, the part's last 64 KiB (its footer) and one row group of five
    val indexRead = driver - manifestBytes
    assert(indexRead > 0 && indexRead < part.length() / 2, s"read $indexRead of the ${part.length()}-byte part")
    // a key outside every row group's range: the footer only
    val before2 = TestRemoteFileSystem.bytesRead.get()
    val (none, _) = collectMeasured(spark.read.format("safetensors").load(remote(path))
      .where(col("key") === "zzz").select("key"))
    assert(none.isEmpty)
    assert(TestRemoteFileSystem.bytesRead.get() - before2 <= manifestBytes + 64 * 1024,
      "an absent key reads the footer only")
  }

  /** A safetensors file of the given (name, dtype, shape, bytes) tensors and metadata. */
  private def writeFile(f: File, tensors: Seq[(String, String, Seq[Long], Array[Byte])],
      metadata: Map[String, String]): Unit = {
    var offset = 0L
    val entries = tensors.map { case (name, dtype, shape, data) =>
      val e = s""""$name":{"dtype":"$dtype","shape":[${shape.mkString(",")}],""" +
        s""""data_offsets":[$offset,${offset + data.length}]}"""
      offset += data.length
      e
    }
    val meta = metadata.map { case (k, v) => s""""$k":"$v"""" }.mkString(",")
    val header = (s""""__metadata__":{$meta}""" +: entries).mkString("{", ",", "}")
      .getBytes(StandardCharsets.UTF_8)
    val out = Files.newOutputStream(f.toPath)
    try {
      out.write(ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN).putLong(header.length).array())
      out.write(header)
      tensors.foreach(t => out.write(t._4))
    } finally out.close()
  }

  test("per file: model files as one row each; shape and dtype need no data bytes") {
    val dir = new File(freshPath())
    dir.mkdirs()
    val w = Array.tabulate[Byte](24)(_.toByte)
    writeFile(new File(dir, "a.safetensors"),
      Seq(("w", "F32", Seq(2L, 3L), w), ("b", "BF16", Seq(3L), Array[Byte](0, 0x3f, 0, 0x40, 0, 0))),
      Map("trigger" -> "cat"))
    writeFile(new File(dir, "b.safetensors"), Seq(("w", "F32", Seq(6L), w)), Map.empty)
    new File(dir, "config.json").createNewFile()
    val headers = Seq("a", "b").map(n => headerBytes(new File(dir, s"$n.safetensors"))).sum

    for (uri <- Seq(dir.getAbsolutePath, remote(dir.getAbsolutePath))) {
      val df = spark.read.format("safetensors").option("layout", "file").load(uri)
      assert(df.schema.fieldNames.toSeq == Seq("file", "w", "b", "metadata", "flags", "model_info",
        "sha256"),
        df.schema)
      val (shapes, shapeBytes) = collectMeasured(df.select("file", "w.shape", "w.dtype", "b.dtype"))
      assert(shapes.map(r => (r.getString(0).split('/').last, r.getSeq[Long](1), r.getString(2),
        Option(r.getString(3)))).sortBy(_._1).toSeq ==
        Seq(("a.safetensors", Seq(2L, 3L), "F32", Some("BF16")),
          ("b.safetensors", Seq(6L), "F32", None)))
      assert(shapeBytes == headers, "struct pruned to shape/dtype reads no data")

      val (data, dataBytes) = collectMeasured(df.select("w.data", "metadata"))
      assert(data.forall(_.getAs[Array[Byte]](0).toSeq == w.toSeq))
      assert(data.flatMap(r => Option(r.getMap[String, String](1))).flatMap(_.get("trigger")).toSeq
        == Seq("cat"))
      assert(dataBytes == headers + 48L)
    }
  }

  test("forensic columns per file and per tensor: flags and model_info read headers only") {
    val dir = new File(freshPath())
    dir.mkdirs()
    val w = Array.tabulate[Byte](24)(_.toByte)
    writeFile(new File(dir, "lora.safetensors"),
      Seq(("q.weight", "U8", Seq(4L), Array[Byte](1, 2, 3, 4)), ("w", "F32", Seq(2L, 3L), w)),
      Map("ss_output_name" -> "inkwash", "ss_steps" -> "2400"))
    writeFile(new File(dir, "plain.safetensors"), Seq(("w", "F32", Seq(6L), w)), Map.empty)
    val headers = Seq("lora", "plain").map(n => headerBytes(new File(dir, s"$n.safetensors"))).sum

    for (uri <- Seq(dir.getAbsolutePath, remote(dir.getAbsolutePath))) {
      val files = spark.read.format("safetensors").option("layout", "file").load(uri)
      assert(files.schema.fieldNames.toSeq == Seq("file", "q.weight", "w", "metadata", "flags",
        "model_info", "sha256"), files.schema)
      // Warnings only: the headers are not padded, so the data may also be misaligned (an info).
      val warnings = "filter(flags, f -> f.level = 'warning')"
      val (rows, bytes) = collectMeasured(files.selectExpr("file", s"transform($warnings, f -> f.code)",
        s"get($warnings, 0).tensor", "model_info.name", "model_info.training_steps", "model_info.training_tool"))
      assert(rows.map(r => (r.getString(0).split('/').last, r.getSeq[String](1), Option(r.getString(2)),
        Option(r.getString(3)), Option(r.get(4)), Option(r.getString(5)))).sortBy(_._1).toSeq ==
        Seq(("lora.safetensors", Seq("integer_float_weights"), Some("q.weight"), Some("inkwash"),
          Some(2400L), Some("kohya-ss sd-scripts")),
          ("plain.safetensors", Seq(), None, None, None, None)), uri)
      assert(bytes == headers, s"flags and model_info read no data ($uri)")

      val (withData, dataBytes) = collectMeasured(files.select("w.data", "flags", "model_info"))
      assert(withData.length == 2)
      assert(dataBytes == headers + 48L)

      val tensors = spark.read.format("safetensors").option("layout", "tensor").load(uri)
      val (trows, tbytes) = collectMeasured(tensors.selectExpr("key", s"size($warnings)",
        "model_info.name", "model_info"))
      assert(trows.map(r => (r.getString(0), r.getInt(1), Option(r.getString(2)))).sorted.toSeq ==
        Seq(("q.weight", 1, Some("inkwash")), ("w", 0, None), ("w", 1, Some("inkwash"))), uri)
      assert(tbytes == headers, s"flags and model_info read no data per tensor ($uri)")
    }
  }

  test("sha256 per file and per tensor: the bytes' digest, read only when selected, streamed in pieces") {
    val dir = new File(freshPath())
    dir.mkdirs()
    // 20 MiB of data: more than one piece of a non-local read (SupplyChunk)
    val big = Array.tabulate[Byte](20 << 20)(i => (i * 31 + (i >> 12)).toByte)
    val small = Array.tabulate[Byte](24)(i => (i * 7).toByte)
    writeFile(new File(dir, "big.safetensors"),
      Seq(("a", "U8", Seq(big.length.toLong), big), ("w", "F32", Seq(6L), small)), Map("k" -> "v"))
    writeFile(new File(dir, "small.safetensors"), Seq(("w", "F32", Seq(2L, 3L), small)), Map.empty)
    assert(SafetensorsPartitionReader.SupplyChunk < big.length)
    def sha(b: Array[Byte]): String =
      java.security.MessageDigest.getInstance("SHA-256").digest(b).map(x => f"$x%02x").mkString
    val names = Seq("big", "small")
    val files = names.map(n => new File(dir, s"$n.safetensors"))
    val headers = files.map(headerBytes).sum
    val lengths = files.map(_.length()).sum
    val fileSha = names.zip(files.map(f => sha(Files.readAllBytes(f.toPath)))).toMap

    for (uri <- Seq(dir.getAbsolutePath, remote(dir.getAbsolutePath))) {
      val perFile = spark.read.format("safetensors").option("layout", "file").load(uri)
      assert(perFile.schema.fieldNames.toSeq == Seq("file", "a", "w", "metadata", "flags", "model_info",
        "sha256"), perFile.schema)
      val (rows, bytes) = collectMeasured(perFile.select("file", "sha256"))
      assert(rows.map(r => r.getString(0).split('/').last.stripSuffix(".safetensors") -> r.getString(1))
        .toMap == fileSha, uri)
      assert(bytes == headers + lengths, s"the file digest reads every byte once ($uri)")
      val (_, without) = collectMeasured(perFile.select("file", "flags", "w.shape"))
      assert(without == headers, s"no sha256, no data bytes ($uri)")
      val (both, bothBytes) = collectMeasured(perFile.select("w.data", "sha256"))
      assert(both.forall(_.getAs[Array[Byte]](0).toSeq == small.toSeq) && bothBytes == headers + lengths)

      val perTensor = spark.read.format("safetensors").option("layout", "tensor").load(uri)
      val (trows, tbytes) = collectMeasured(perTensor.select("file", "key", "sha256"))
      assert(trows.map(r => (r.getString(0).split('/').last, r.getString(1), r.getString(2))).sorted.toSeq ==
        Seq(("big.safetensors", "a", sha(big)), ("big.safetensors", "w", sha(small)),
          ("small.safetensors", "w", sha(small))), uri)
      // the planner spreads big.safetensors' two tensors over the two cores: its header is
      // opened by both partitions
      assert(tbytes == headers + headerBytes(files.head) + big.length + 2L * small.length, uri)
      val (one, oneBytes) = collectMeasured(perTensor.where("key = 'w'").select("sha256"))
      assert(one.map(_.getString(0)).toSeq == Seq(sha(small), sha(small)))
      assert(oneBytes == headers + 2L * small.length, s"only the selected tensors are hashed ($uri)")
      val (_, noSha) = collectMeasured(perTensor.select("key", "dtype", "flags"))
      assert(noSha == headers, uri)
    }
  }

  test("an explicit schema is checked against the files") {
    val path = freshPath()
    batchFrame(10).write.format("safetensors").option("batch_size", "4").save(path)
    val ok = StructType(Seq(StructField("x", ArrayType(FloatType))))
    assert(spark.read.format("safetensors").schema(ok).load(path).count() == 10)
    val wrongType = StructType(Seq(StructField("x", ArrayType(DoubleType))))
    val e1 = intercept[Exception](spark.read.format("safetensors").schema(wrongType).load(path).collect())
    assert(messages(e1).contains("'x'") && messages(e1).contains("array<float>"), messages(e1))
    val missing = StructType(Seq(StructField("nope", LongType)))
    val e2 = intercept[Exception](spark.read.format("safetensors").schema(missing).load(path).collect())
    assert(messages(e2).contains("'nope'"), messages(e2))
  }

  test("the local listing names and sizes every child as Hadoop's listing does, odd names and links included") {
    val dir = new File(freshPath())
    dir.mkdirs()
    val names = Seq("x:y.safetensors", "s p.safetensors", "p%41.safetensors", "\u00e9.safetensors",
      "q?.safetensors", "h#1.safetensors", "b\\c.safetensors", "_hidden", ".dot")
    names.zipWithIndex.foreach { case (n, i) => Files.write(new File(dir, n).toPath, new Array[Byte](i)) }
    new File(dir, "sub dir").mkdir()
    Files.createSymbolicLink(new File(dir, "linked.safetensors").toPath, new File(dir, names(3)).toPath)
    Files.createSymbolicLink(new File(dir, "dangling.safetensors").toPath, new File(dir, "gone").toPath)
    Files.createSymbolicLink(new File(dir, "linked dir").toPath, new File(dir, "sub dir").toPath)
    val root = new org.apache.hadoop.fs.Path(dir.getPath)
    val fs = root.getFileSystem(spark.sessionState.newHadoopConf())
    val mine = io.safetensors.spark.files.DatasetFiles.listChildren(fs, root)
    assert(mine.size == names.size + 3, mine) // the dangling link is left out, as Hadoop does
    val hadoop = fs.listStatus(root).map(s =>
      (s.getPath.toString, s.isDirectory, if (s.isDirectory) 0L else s.getLen)).toSet
    val ours = mine.map(c => (c.uri, c.isDirectory, c.length)).toSet
    assert(ours == hadoop, s"ours ${ours -- hadoop}, Hadoop's ${hadoop -- ours}")
    assert(mine.forall(c => c.path.toString == c.uri && c.path.getName == c.name))
  }

  test("a scan's partitions are planned once: Spark asks for them more than once") {
    val path = freshPath()
    batchFrame(40).write.format("safetensors").option("batch_size", "4").save(path)
    val df = spark.read.format("safetensors").load(path)
    assert(df.count() == 40)
    val scan = df.queryExecution.executedPlan.collect { case s: BatchScanExec => s }.head
    val first = scan.batch.planInputPartitions().map(_.asInstanceOf[SafetensorsInputPartition])
    val again = scan.batch.planInputPartitions().map(_.asInstanceOf[SafetensorsInputPartition])
    assert(first.nonEmpty && first.sameElements(again))
    assert(first.zip(again).forall { case (a, b) => a.specJson eq b.specJson }, "planned again")
    // another query of the same DataFrame (other columns) has a plan of its own
    val ids = df.select("id").queryExecution.executedPlan.collect { case s: BatchScanExec => s }.head
    val other = ids.batch.planInputPartitions().map(_.asInstanceOf[SafetensorsInputPartition])
    assert(other.nonEmpty && !other.head.specJson.contains("\"x\""), other.head.specJson)
  }

  test("a versionAsOf read takes the shards' sizes from the listing: no status request per shard, a missing one named") {
    val path = freshPath()
    (0 until 3).foreach { i =>
      batchFrame(16).write.format("safetensors").option("batch_size", "4").mode("append").save(path)
    }
    TestRemoteFileSystem.statuses.clear()
    val v2 = spark.read.format("safetensors").option("versionAsOf", "2").load(remote(path))
    assert(v2.count() == 32)
    val shardStatuses = TestRemoteFileSystem.statuses.asScala.filter(_.endsWith(".safetensors"))
    assert(shardStatuses.isEmpty, s"${shardStatuses.size} status requests, e.g. ${shardStatuses.take(3)}")
    // a shard of version 2 gone: the read fails naming it (the listing has no size for it)
    val gone = shardFiles(path).map(_.getName).sorted.head
    assert(new File(path, gone).delete())
    val e = intercept[Exception](
      spark.read.format("safetensors").option("versionAsOf", "2").load(remote(path)).count())
    assert(messages(e).contains(gone) && messages(e).contains("version 2"), messages(e))
  }
}
