package io.safetensors.spark.write

import java.io.File
import java.nio.{ByteBuffer, ByteOrder}
import java.nio.file.{Files, Paths}
import java.util.concurrent.ConcurrentLinkedQueue

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.{JsonNode, ObjectMapper}
import org.apache.spark.sql.{DataFrame, Row}
import org.apache.spark.sql.functions.udf
import org.apache.spark.sql.types._
import io.safetensors.spark.SparkSuiteBase

/** End-to-end writes through `df.write.format("safetensors")`, checked on disk. */
class SafetensorsWriteSuite extends SparkSuiteBase {
  import SafetensorsWriteSuite._

  private val allocatorLeaks = new ConcurrentLinkedQueue[Long]()

  override protected def appName: String = "safetensors-write"

  override def beforeAll(): Unit = {
    super.beforeAll()
    WriteTask.onAllocatorClose = a => allocatorLeaks.add(a.getAllocatedMemory)
  }

  override def afterAll(): Unit =
    try WriteTask.onAllocatorClose = null finally super.afterAll()

  private val floatSchema = StructType(Seq(StructField("x", ArrayType(FloatType))))

  /** `n` rows of `x = [i, i + 0.25, i + 0.5, i + 0.75]` (float), in `parts` partitions. */
  private def floats(n: Int, parts: Int = 2): DataFrame = {
    val rows = (0 until n).map(i => Row((0 until 4).map(j => i + j * 0.25f).toArray.toSeq))
    spark.createDataFrame(spark.sparkContext.parallelize(rows, parts), floatSchema)
  }

  private def kvFrame(keys: Seq[String], floatsPerRow: Int, parts: Int): DataFrame = {
    val schema = StructType(Seq(StructField("k", StringType), StructField("v", ArrayType(FloatType))))
    val rows = keys.zipWithIndex.map { case (k, i) => Row(k, Seq.fill(floatsPerRow)(i.toFloat)) }
    spark.createDataFrame(spark.sparkContext.parallelize(rows, parts), schema)
  }

  test("batch mode, default SaveMode on a fresh path: F32 values exact, shapes [rows, 4]") {
    val path = freshPath()
    floats(10).write.format("safetensors").option("batch_size", "3").save(path)
    val shards = shardFiles(path)
    // partition 0: rows 0..4 -> 3 + 2, partition 1: rows 5..9 -> 3 + 2
    assert(shards.map(_.getName.take(15)) ==
      Seq("part-00000-0000", "part-00000-0001", "part-00001-0000", "part-00001-0001"))
    val all = shards.flatMap { f =>
      val st = readShard(f)
      val t = st.tensor("x")
      assert(t.dtype == "F32")
      assert(t.shape.last == 4)
      assert(st.metadata("safetensors_spark.layout") == "batch")
      val fb = ByteBuffer.wrap(t.data).order(ByteOrder.LITTLE_ENDIAN).asFloatBuffer()
      Array.fill(fb.remaining())(fb.get()).grouped(4).map(_.toSeq).toSeq
    }
    assert(shards.map(f => readShard(f).tensor("x").shape.head) == Seq(3, 2, 3, 2))
    assert(all == (0 until 10).map(i => (0 until 4).map(j => i + j * 0.25f)))
    val m = manifest(path)
    assert(m.get("total_samples").asInt == 10)
    assert(m.get("shards").size == 4)
    assert(m.get("total_bytes").asLong == shards.map(_.length).sum)
    assert(debris(path).isEmpty, debris(path))
  }

  test("tail_strategy drop and pad: manifest counts and shard shapes") {
    val drop = freshPath()
    floats(10).write.format("safetensors").option("batch_size", "3").option("tail_strategy", "DROP").save(drop)
    val md = manifest(drop)
    assert(md.get("total_samples").asInt == 6 && md.get("dropped_samples").asInt == 4)
    assert(shardFiles(drop).map(f => readShard(f).tensor("x").shape) == Seq(Seq(3L, 4L), Seq(3L, 4L)))

    val pad = freshPath()
    floats(10).write.format("safetensors").option("batch_size", "3").option("tail_strategy", "pad").save(pad)
    val mp = manifest(pad)
    assert(mp.get("total_samples").asInt == 10 && mp.get("padded_samples").asInt == 2)
    val last = readShard(shardFiles(pad)(1))
    assert(last.tensor("x").shape == Seq(3L, 4L))
    assert(last.metadata("safetensors_spark.padded_samples") == "1")
    assert(last.tensor("x").data.drop(2 * 16).forall(_ == 0))
  }

  test("nested arrays, scalars, binary and Tensor Struct travel in the wire layout") {
    val path = freshPath()
    val schema = StructType(Seq(
      StructField("m", ArrayType(ArrayType(DoubleType))),
      StructField("s", LongType),
      StructField("b", ArrayType(BooleanType)),
      StructField("t", StructType(Seq(
        StructField("shape", ArrayType(IntegerType)),
        StructField("dtype", StringType),
        StructField("data", BinaryType))))))
    val rows = (0 until 3).map { i =>
      Row(Seq(Seq(i, i + 1.0, i + 2.0), Seq(-1.0, -2.0, -3.0 - i)), i.toLong * 1000000000000L,
        Seq(true, false, i % 2 == 0),
        Row(Seq(2), "I16", Array[Byte](i.toByte, 0, 7, 0)))
    }
    spark.createDataFrame(spark.sparkContext.parallelize(rows, 1), schema)
      .write.format("safetensors").option("batch_size", "3").save(path)
    val st = readShard(shardFiles(path).head)
    val m = st.tensor("m")
    assert(m.shape == Seq(3L, 2L, 3L) && m.dtype == "F64")
    val d = ByteBuffer.wrap(m.data).order(ByteOrder.LITTLE_ENDIAN).asDoubleBuffer()
    assert(Array.fill(d.remaining())(d.get()).toSeq.take(6) == Seq(0.0, 1.0, 2.0, -1.0, -2.0, -3.0))
    val s = st.tensor("s")
    assert(s.shape == Seq(3L) && s.dtype == "I64")
    assert(ByteBuffer.wrap(s.data).order(ByteOrder.LITTLE_ENDIAN).getLong(16) == 2000000000000L)
    val b = st.tensor("b")
    assert(b.dtype == "BOOL" && b.data.toSeq == Seq[Byte](1, 0, 1, 1, 0, 0, 1, 0, 1))
    val t = st.tensor("t")
    assert(t.dtype == "I16" && t.shape == Seq(3L, 2L))
    assert(t.data.toSeq == Seq[Byte](0, 0, 7, 0, 1, 0, 7, 0, 2, 0, 7, 0))
  }

  test("KV mode: names key__column and rollover at target_shard_size_mb=1 (~1.5 MiB)") {
    val path = freshPath()
    // 6 rows x 64 Ki floats = 6 x 256 KiB = 1.5 MiB in one partition
    kvFrame((0 until 6).map(i => s"key$i"), 65536, 1).write.format("safetensors")
      .option("name_col", "k").option("target_shard_size_mb", "1").save(path)
    val shards = shardFiles(path)
    assert(shards.size >= 2, shards)
    assert(shards.forall(_.length <= (1L << 20)), shards.map(_.length))
    val names = shards.flatMap(f => readShard(f).tensors.keys).sorted
    assert(names == (0 until 6).map(i => s"key${i}__v"))
    val m = manifest(path)
    assert(m.get("layout").asText == "kv" && m.get("total_samples").asInt == 6)
    assert(m.get("kv_separator").asText == "__")
  }

  test("KV duplicate key in two tasks with fail: the driver's check fails the job naming both shards, no file left") {
    val path = freshPath()
    val df = kvFrame(Seq("a", "dup", "b", "dup"), 4, 2)
    // Each task holds one "dup": no task can see the duplicate, only the driver across reports.
    assert(df.rdd.glom().collect().map(_.map(_.getString(0)).toSeq).toSeq == Seq(Seq("a", "dup"), Seq("b", "dup")))
    val e = intercept[Exception] {
      df.write.format("safetensors").option("name_col", "k").save(path)
    }
    val msg = messages(e)
    val shards = """key 'dup' occurs more than once in this write \(in shards (\S+) and (\S+)\)""".r
      .findFirstMatchIn(msg).getOrElse(fail(msg))
    assert(Seq(shards.group(1), shards.group(2)).map(_.split("-")(1)) == Seq("00000", "00001"), msg)
    assert(!new File(path).exists() || allFiles(path).isEmpty, allFiles(path))
  }

  test("options dtype, dtypes, columns, shapes, metadata and kv_separator; binary input") {
    val batch = freshPath()
    val schema = StructType(Seq(
      StructField("id", LongType),
      StructField("x", ArrayType(DoubleType)),
      StructField("raw", BinaryType),
      StructField("skip", ArrayType(FloatType))))
    val rows = (0 until 4).map { i =>
      val raw = ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN)
      (0 until 4).foreach(j => raw.putShort((i * 10 + j).toShort))
      Row(i.toLong, Seq(i + 0.5, -i - 0.5), raw.array(), Seq(1f))
    }
    spark.createDataFrame(spark.sparkContext.parallelize(rows, 1), schema)
      .write.format("safetensors").option("batch_size", "4")
      .option("columns", "raw,x")
      .option("dtypes", """{"x": "F16", "raw": "I16"}""")
      .option("shapes", """{"raw": [2, 2]}""")
      .option("metadata", """{"owner": "tests", "note": "ünï"}""")
      .save(batch)
    val st = readShard(shardFiles(batch).head)
    assert(st.tensors.keySet == Set("raw", "x"), "columns selects the tensors")
    assert(st.tensor("x").dtype == "F16" && st.tensor("x").shape == Seq(4L, 2L))
    // i + 0.5 and -(i + 0.5) are exact in F16: 0.5 = 0x3800, -0.5 = 0xB800, 1.5 = 0x3E00, ...
    val x = ByteBuffer.wrap(st.tensor("x").data).order(ByteOrder.LITTLE_ENDIAN)
    assert((0 until 8).map(k => x.getShort(2 * k) & 0xffff).take(4) == Seq(0x3800, 0xB800, 0x3E00, 0xBE00))
    val raw = st.tensor("raw")
    assert(raw.dtype == "I16" && raw.shape == Seq(4L, 2L, 2L))
    val r = ByteBuffer.wrap(raw.data).order(ByteOrder.LITTLE_ENDIAN)
    assert((0 until 16).map(k => r.getShort(2 * k).toInt) == (0 until 4).flatMap(i => (0 until 4).map(j => i * 10 + j)))
    assert(st.metadata("owner") == "tests" && st.metadata("note") == "ünï")

    val kv = freshPath()
    kvFrame(Seq("a", "ключ"), 2, 1).write.format("safetensors").option("name_col", "k")
      .option("kv_separator", "::ü").option("dtype", "BF16").save(kv)
    val kst = readShard(shardFiles(kv).head)
    assert(kst.tensors.keySet == Set("a::üv", "ключ::üv"))
    assert(kst.metadata("safetensors_spark.kv_separator") == "::ü")
    // dtype: row 1's two floats 1.0 as BF16 (0x3F80, little-endian)
    val k1 = kst.tensor("ключ::üv")
    assert(k1.dtype == "BF16" && k1.data.toSeq == Seq[Byte](0x80.toByte, 0x3f, 0x80.toByte, 0x3f))
  }

  test("KV duplicate key with lastWin: one tensor per key, the last one") {
    val path = freshPath()
    kvFrame(Seq("a", "dup", "b", "dup"), 4, 2).write.format("safetensors")
      .option("name_col", "k").option("duplicatesStrategy", "lastWin").save(path)
    val tensors = shardFiles(path).flatMap(f => readShard(f).tensors.toSeq)
    assert(tensors.map(_._1).sorted == Seq("a__v", "b__v", "dup__v"))
    val dup = tensors.find(_._1 == "dup__v").get._2
    assert(ByteBuffer.wrap(dup.data).order(ByteOrder.LITTLE_ENDIAN).getFloat(0) == 3.0f)
    assert(manifest(path).get("total_samples").asInt == 3)
    assert(debris(path).isEmpty, debris(path))
  }

  test("SaveModes: errorifexists, ignore, overwrite, append") {
    val path = freshPath()
    floats(4).write.format("safetensors").option("batch_size", "2").mode("errorifexists").save(path)
    val before = snapshot(path)
    val e = intercept[Exception] {
      floats(4).write.format("safetensors").option("batch_size", "2").save(path)
    }
    assert(messages(e).contains(path) && messages(e).contains("ErrorIfExists"), messages(e))
    floats(8).write.format("safetensors").option("batch_size", "2").mode("ignore").save(path)
    assert(snapshot(path) == before)

    val oldShards = shardFiles(path).map(_.getName).toSet
    // retention 0: the old shards go at the commit (with a retention they stay: DatasetVacuumSuite)
    floats(6, 1).write.format("safetensors").option("batch_size", "3").option("retention", "0")
      .mode("overwrite").save(path)
    val newShards = shardFiles(path).map(_.getName).toSet
    assert(newShards.size == 2 && newShards.intersect(oldShards).isEmpty)
    assert(manifest(path).get("total_samples").asInt == 6)
    assert(debris(path).isEmpty, debris(path))

    floats(3, 1).write.format("safetensors").option("batch_size", "3").mode("append").save(path)
    val m = manifest(path)
    assert(m.get("shards").size == 3 && m.get("total_samples").asInt == 9)
    assert(shardFiles(path).size == 3)
    val bad = intercept[IllegalArgumentException] {
      floats(3, 1).write.format("safetensors").option("batch_size", "2").mode("append").save(path)
    }
    assert(bad.getMessage.contains("batch_size"), bad.getMessage)
  }

  test("append to a directory with .safetensors files but no manifest fails clearly") {
    val path = freshPath()
    new File(path).mkdirs()
    Files.write(Paths.get(path, "foreign.safetensors"), Array[Byte](1, 2, 3))
    val e = intercept[IllegalArgumentException] {
      floats(2).write.format("safetensors").option("batch_size", "2").mode("append").save(path)
    }
    assert(e.getMessage.contains("dataset_manifest.json"), e.getMessage)
  }

  test("a failed overwrite (null row in the new data) leaves the old dataset byte-identical") {
    val path = freshPath()
    floats(6).write.format("safetensors").option("batch_size", "2").option("generate_index", "true").save(path)
    val before = snapshot(path)
    val rows = (0 until 6).map(i => if (i == 4) Row(null) else Row(Seq(1f, 2f, 3f, 4f)))
    val bad = spark.createDataFrame(spark.sparkContext.parallelize(rows, 2), floatSchema)
    val e = intercept[Exception] {
      bad.write.format("safetensors").option("batch_size", "2").mode("overwrite").save(path)
    }
    val msg = messages(e)
    assert(msg.contains("'x'") && msg.contains("row 1"), msg) // row 4 is row 1 of partition 1
    assert(snapshot(path) == before)
  }

  test("a task that throws mid-write (after sealing shards) leaves no file behind") {
    val path = freshPath()
    // Rows reach the native writer in Arrow batches of 4096: rows 0..8191 are written (eight
    // shards of 1000) before row 9000 throws while the third batch is built. The throw reports
    // how many shards were in place in the staging directory at that moment.
    val boom = udf { (i: Int) =>
      if (i == 9000) {
        val inPlace = namesUnder(new File(path)).count(n => n.endsWith(".safetensors") && !n.startsWith("."))
        throw new RuntimeException(s"boom at 9000 with $inPlace shards in place")
      } else Array(i.toFloat)
    }
    val df = spark.range(0, 10000, 1, 1).selectExpr("cast(id as int) as i").select(boom(org.apache.spark.sql.functions.col("i")).as("x"))
    val e = intercept[Exception] {
      df.write.format("safetensors").option("batch_size", "1000").save(path)
    }
    val inPlace = """boom at 9000 with (\d+) shards in place""".r.findFirstMatchIn(messages(e))
      .getOrElse(fail(messages(e))).group(1).toInt
    // Of the 7 or 8 complete shards handed to the sealing thread by then, at most 3 can still be
    // on it (2 queued + 1 being synced and renamed); the rest were renamed into place before the
    // UDF listed the directory.
    assert(inPlace >= 4, messages(e))
    assert(!new File(path).exists() || allFiles(path).isEmpty, allFiles(path))
  }

  /** The index part names the listed shards must have (dataset.md §6.1). */
  def partsOf(path: String): Seq[String] =
    shardFiles(path).map(_.getName.stripSuffix(".safetensors") + ".parquet").sorted

  test("generate_index writes _tensor_index.parquet as a directory spark.read.parquet reads by its name; append adds parts") {
    val path = freshPath()
    floats(5).write.format("safetensors").option("batch_size", "2").option("generate_index", "true").save(path)
    val idx = new File(path, "_tensor_index.parquet")
    assert(idx.isDirectory)
    // one part per shard, named after it
    assert(idx.list().toSeq.sorted == partsOf(path), idx.list().toSeq)
    val firstParts = idx.listFiles().map(f => f.getName -> f.lastModified()).toMap
    def readIndex() = spark.read.parquet(idx.getAbsolutePath)
    val df = readIndex()
    assert(df.columns.toSeq == Seq("tensor_key", "file_name", "dtype", "shape", "data_start",
      "data_end", "sample_key", "column"))
    assert(df.count() == shardFiles(path).size)
    val rows = df.select("file_name", "data_start", "data_end").collect()
    shardFiles(path).foreach { f =>
      val r = rows.find(_.getString(0) == f.getName).get
      assert(r.getLong(2) - r.getLong(1) == readShard(f).tensor("x").data.length)
    }
    floats(2, 1).write.format("safetensors").option("batch_size", "2").option("generate_index", "true")
      .mode("append").save(path)
    // the old shards keep their parts untouched (no index data copied); the new shards add theirs
    assert(idx.list().toSeq.sorted == partsOf(path), idx.list().toSeq)
    firstParts.foreach { case (n, t) => assert(new File(idx, n).lastModified() == t, n) }
    assert(manifest(path).get("manifest_version").asInt == 2)
    assert(readIndex().count() == shardFiles(path).size)
    assert(debris(path).isEmpty, debris(path))
    // an append that leaves generate_index out keeps the dataset's index: its shards get parts
    floats(2, 1).write.format("safetensors").option("batch_size", "2").mode("append").save(path)
    assert(idx.list().toSeq.sorted == partsOf(path), idx.list().toSeq)
    assert(readIndex().count() == shardFiles(path).size)
    floats(2, 1).write.format("safetensors").option("batch_size", "2").option("generate_index", "false")
      .mode("append").save(path)
    assert(!idx.exists(), "an append with generate_index=false removes the index")
  }

  test("option errors fail before the path is created") {
    val path = freshPath()
    val unknown = intercept[IllegalArgumentException] {
      floats(2).write.format("safetensors").option("batch_size", "2").option("bogus", "1").save(path)
    }
    assert(unknown.getMessage.contains("bogus") && unknown.getMessage.contains("tail_strategy"), unknown.getMessage)
    val dtype = intercept[IllegalArgumentException] {
      floats(2).write.format("safetensors").option("batch_size", "2").option("dtype", "F33").save(path)
    }
    assert(dtype.getMessage.contains("F33"), dtype.getMessage)
    // metadata beyond the JVM JSON parser's 20,000,000-character strings: the option's own
    // limit, not the parser's StreamConstraintsException
    val huge = s"""{"notes": "${"x" * 21000000}"}"""
    val big = intercept[IllegalArgumentException] {
      floats(2).write.format("safetensors").option("batch_size", "2").option("metadata", huge).save(path)
    }
    assert(big.getMessage.contains("option metadata is 21000012 bytes"), big.getMessage.take(500))
    assert(big.getMessage.contains(s"at most ${16 << 20} bytes"), big.getMessage.take(500))
    assert(!new File(path).exists())
  }

  test("a null element inside an array names column and row") {
    val path = freshPath()
    val rows = Seq(Row(Seq(1f, 2f)), Row(Seq(1f, null)))
    val e = intercept[Exception] {
      spark.createDataFrame(spark.sparkContext.parallelize(rows, 1), floatSchema)
        .write.format("safetensors").option("batch_size", "2").save(path)
    }
    assert(messages(e).contains("'x'") && messages(e).contains("row 1"), messages(e))
  }

  test("rows spanning several Arrow batches (reused vectors): values exact, late nulls reported") {
    // 10,000 rows in one partition: three Arrow batches (4096 rows each), so the task's vectors
    // are reset and refilled twice; shards of 3000 rows straddle the Arrow batches.
    val path = freshPath()
    floats(10000, 1).write.format("safetensors").option("batch_size", "3000").save(path)
    val values = shardFiles(path).flatMap { f =>
      val fb = ByteBuffer.wrap(readShard(f).tensor("x").data).order(ByteOrder.LITTLE_ENDIAN).asFloatBuffer()
      Array.fill(fb.remaining())(fb.get())
    }
    assert(values.toSeq == (0 until 10000).flatMap(i => (0 until 4).map(j => i + j * 0.25f)))
    // A null element in the third Arrow batch, after two batches without nulls.
    val rows = (0 until 9000).map(i => Row(if (i == 8500) Seq(1f, null) else Seq(1f, 2f)))
    val e = intercept[Exception] {
      spark.createDataFrame(spark.sparkContext.parallelize(rows, 1), floatSchema)
        .write.format("safetensors").option("batch_size", "9000").save(freshPath())
    }
    assert(messages(e).contains("'x'") && messages(e).contains("row 8500"), messages(e))
    // KV mode: the key (Utf8) vector is reset and refilled too.
    val kv = freshPath()
    kvFrame((0 until 9000).map(i => s"key$i"), 2, 1).write.format("safetensors")
      .option("name_col", "k").save(kv)
    val names = shardFiles(kv).flatMap(f => readShard(f).tensors.keys).toSet
    assert(names == (0 until 9000).map(i => s"key${i}__v").toSet)
  }

  test("reading a missing path is an error naming it") {
    val missing = new File(base, "no-such-dataset").getAbsolutePath
    val e = intercept[Exception](spark.read.format("safetensors").load(missing))
    assert(messages(e).contains("path does not exist") && messages(e).contains("no-such-dataset"),
      messages(e))
  }

  test("every task allocator was empty when closed") {
    assert(!allocatorLeaks.isEmpty)
    assert(allocatorLeaks.asScala.forall(_ == 0L), allocatorLeaks)
  }
}

object SafetensorsWriteSuite {
  private val mapper = new ObjectMapper()

  final case class Tensor(dtype: String, shape: Seq[Long], data: Array[Byte])
  final case class Shard(tensors: Map[String, Tensor], metadata: Map[String, String]) {
    def tensor(n: String): Tensor = tensors.getOrElse(n, throw new NoSuchElementException(s"$n in ${tensors.keys}"))
  }

  /** Parses a safetensors file: 8-byte LE header length, JSON header, raw data. */
  def readShard(f: File): Shard = {
    val bytes = Files.readAllBytes(f.toPath)
    val n = ByteBuffer.wrap(bytes, 0, 8).order(ByteOrder.LITTLE_ENDIAN).getLong.toInt
    val header = mapper.readTree(new String(bytes, 8, n, "UTF-8"))
    val start = 8 + n
    var meta = Map.empty[String, String]
    val tensors = header.fields().asScala.flatMap { e =>
      if (e.getKey == "__metadata__") {
        meta = e.getValue.fields().asScala.map(m => m.getKey -> m.getValue.asText()).toMap
        None
      } else {
        val v = e.getValue
        val off = v.get("data_offsets")
        val data = java.util.Arrays.copyOfRange(bytes, start + off.get(0).asInt, start + off.get(1).asInt)
        Some(e.getKey -> Tensor(v.get("dtype").asText(), v.get("shape").elements().asScala.map(_.asLong).toSeq, data))
      }
    }.toMap
    Shard(tensors, meta)
  }

  /** Names of the files under `f`, from directory listings only: a file renamed or deleted
   *  meanwhile (the sealing thread is at work) is missed or listed, never an error. */
  def namesUnder(f: File): Seq[String] =
    Option(f.listFiles()).toSeq.flatten.flatMap(c => if (c.isDirectory) namesUnder(c) else Seq(c.getName))

  def shardFiles(path: String): Seq[File] =
    Option(new File(path).listFiles()).toSeq.flatten
      .filter(f => f.isFile && f.getName.endsWith(".safetensors") && !f.getName.startsWith(".")).sortBy(_.getName)

  def manifest(path: String): JsonNode = mapper.readTree(new File(path, "dataset_manifest.json"))

  def allFiles(path: String): Seq[String] = {
    val root = Paths.get(path)
    if (!Files.exists(root)) Seq.empty
    else Files.walk(root).iterator().asScala.filter(p => p != root).map(p => root.relativize(p).toString).toSeq.sorted
  }

  /** Anything that is not a shard, the manifest, the manifest log or the index. */
  def debris(path: String): Seq[String] = allFiles(path).filterNot { n =>
    (n.endsWith(".safetensors") && !n.startsWith(".") && !n.contains("/")) ||
      n == "dataset_manifest.json" || n == "_tensor_index.parquet" || n == "_manifest_log" ||
      n.matches("_manifest_log/[0-9]{20}\\.json") || n.matches("_manifest_log/[0-9]{20}\\.checkpoint\\.json") ||
      n.matches("_tensor_index\\.parquet/part-[0-9]{5}-[0-9]{4}-[0-9a-f-]{36}\\.parquet")
  }

  /** Relative path -> content digest of every file (hidden ones included). */
  def snapshot(path: String): Map[String, String] = {
    val root = Paths.get(path)
    Files.walk(root).iterator().asScala.filter(Files.isRegularFile(_)).map { p =>
      val md = java.security.MessageDigest.getInstance("SHA-256")
      root.relativize(p).toString -> md.digest(Files.readAllBytes(p)).map("%02x".format(_)).mkString
    }.toMap
  }
}
