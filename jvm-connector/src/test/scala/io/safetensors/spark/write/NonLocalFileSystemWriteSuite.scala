package io.safetensors.spark.write

import java.io.File
import java.nio.{ByteBuffer, ByteOrder}
import java.nio.file.Files

import scala.jdk.CollectionConverters._

import org.apache.hadoop.fs.{LocalFileSystem, Path, RawLocalFileSystem}
import org.apache.spark.sql.{DataFrame, Row}
import org.apache.spark.sql.functions.{col, udf}
import org.apache.spark.sql.safetensors.SparkInternals
import org.apache.spark.sql.types._
import io.safetensors.spark.{SparkSuiteBase, TestRemoteFileSystem}
import io.safetensors.spark.files.DatasetFiles

/**
 * Writes to a destination FileSystem that is not a LocalFileSystem (scheme `testfs`, see
 * [[TestRemoteFileSystem]]): tasks write shards into a local temp dir and upload them into
 * staging; the driver commits through the Hadoop API. Files are then checked on the local disk.
 */
class NonLocalFileSystemWriteSuite extends SparkSuiteBase {
  import SafetensorsWriteSuite._

  /** Name prefixes of the local temp files/dirs the writer creates in java.io.tmpdir. */
  private val writerTempPrefixes =
    Seq("safetensors-task-", "safetensors-rewrite-", "safetensors-index-", "safetensors-old-index-")
  private val tmpDir = new File(System.getProperty("java.io.tmpdir"))

  override protected def appName: String = "safetensors-nonlocal-fs"

  override protected def sparkConf: Seq[(String, String)] = TestRemoteFileSystem.sparkConf

  override def beforeAll(): Unit = {
    // The pom gives the test JVM a java.io.tmpdir of its own (target/test-tmp), so every writer
    // temp found there is this JVM's: the leak check below needs no tolerance for other processes.
    assert(tmpDir.getName == "test-tmp", s"java.io.tmpdir is $tmpDir, not the test JVM's own target/test-tmp")
    super.beforeAll()
  }

  /** (remote URI for the writer, the same directory on the local disk for checks) */
  private def freshRemotePath(): (String, String) = {
    val local = freshPath()
    (s"${TestRemoteFileSystem.Scheme}://$local", local)
  }

  private def writerTemps(): Set[String] =
    Option(tmpDir.list()).toSeq.flatten.filter(n => writerTempPrefixes.exists(n.startsWith)).toSet

  /** Runs `body`, then checks that no writer temp was left in java.io.tmpdir; returns the
   *  uploads (copyFromLocalFile destinations) `body` made. */
  private def tracked(body: => Unit): Seq[String] = {
    val before = writerTemps()
    TestRemoteFileSystem.uploads.clear()
    body
    val uploads = TestRemoteFileSystem.uploads.asScala.toSeq
    val leaked = writerTemps() -- before
    assert(leaked.isEmpty, s"local temps left in $tmpDir: $leaked")
    uploads
  }

  private def taskUploads(u: Seq[String]): Seq[String] = u.filter(p => p.contains("/_staging-") && p.contains("/attempt-"))
  /** Shards uploaded by tasks (each task also uploads its report file, `task-*.report.json`). */
  private def shardUploads(u: Seq[String]): Seq[String] = taskUploads(u).filter(_.endsWith(".safetensors"))
  private def reportUploads(u: Seq[String]): Seq[String] = taskUploads(u).filter(_.endsWith(".report.json"))

  private val floatSchema = StructType(Seq(StructField("x", ArrayType(FloatType))))

  private def floats(n: Int, parts: Int = 2): DataFrame = {
    val rows = (0 until n).map(i => Row((0 until 4).map(j => i + j * 0.25f).toArray.toSeq))
    spark.createDataFrame(spark.sparkContext.parallelize(rows, parts), floatSchema)
  }

  private def f32(b: Array[Byte]): Seq[Float] = {
    val bb = ByteBuffer.wrap(b).order(ByteOrder.LITTLE_ENDIAN)
    (0 until b.length / 4).map(i => bb.getFloat(i * 4))
  }

  test("the testfs destination is not local: the writer's direct branch does not apply") {
    val (remote, _) = freshRemotePath()
    val conf = SparkInternals.hadoopConf(spark.sqlContext, Map.empty)
    val fs = new Path(remote).getFileSystem(conf)
    assert(fs.isInstanceOf[TestRemoteFileSystem])
    assert(!fs.isInstanceOf[LocalFileSystem] && !fs.isInstanceOf[RawLocalFileSystem])
    assert(DatasetFiles.localFile(fs, new Path(remote, "x")).isEmpty)
  }

  test("batch mode through uploads: F32 values exact, staging gone, no temps") {
    val (remote, local) = freshRemotePath()
    val uploads = tracked {
      floats(10).write.format("safetensors").option("batch_size", "3").save(remote)
    }
    val shards = shardFiles(local)
    assert(shards.size == 4)
    // every shard was uploaded by a task into its attempt dir in staging
    assert(shardUploads(uploads).map(p => p.substring(p.lastIndexOf('/') + 1)).sorted == shards.map(_.getName), uploads)
    // and each task its report file, read by the driver from staging (then deleted with it)
    assert(reportUploads(uploads).map(p => p.substring(p.lastIndexOf('/') + 1)).sorted ==
      Seq(0, 1).map(p => f"task-$p%05d-${shards.head.getName.split("-", 4)(3).stripSuffix(".safetensors")}.report.json"),
      uploads)
    assert(taskUploads(uploads).size == shards.size + 2, uploads)
    val all = shards.flatMap { f =>
      val t = readShard(f).tensor("x")
      assert(t.dtype == "F32" && t.shape.last == 4)
      f32(t.data).grouped(4).toSeq
    }
    assert(all == (0 until 10).map(i => (0 until 4).map(j => i + j * 0.25f)))
    assert(manifest(local).get("total_samples").asInt == 10)
    assert(debris(local).isEmpty, debris(local))
  }

  test("KV lastWin with a duplicate key in two partitions: the driver rewrite goes through uploads") {
    val (remote, local) = freshRemotePath()
    val schema = StructType(Seq(StructField("k", StringType), StructField("v", ArrayType(FloatType))))
    val rows = Seq("a", "dup", "b", "dup").zipWithIndex.map { case (k, i) => Row(k, Seq.fill(4)(i.toFloat)) }
    val df = spark.createDataFrame(spark.sparkContext.parallelize(rows, 2), schema)
    val uploads = tracked {
      df.write.format("safetensors").option("name_col", "k").option("duplicatesStrategy", "lastWin").save(remote)
    }
    assert(uploads.exists(_.contains("/rewritten/")), s"no driver rewrite upload: $uploads")
    val tensors = shardFiles(local).flatMap(f => readShard(f).tensors.toSeq)
    assert(tensors.map(_._1).sorted == Seq("a__v", "b__v", "dup__v"))
    assert(f32(tensors.find(_._1 == "dup__v").get._2.data) == Seq.fill(4)(3.0f))
    assert(f32(tensors.find(_._1 == "a__v").get._2.data) == Seq.fill(4)(0.0f))
    assert(manifest(local).get("total_samples").asInt == 3)
    assert(debris(local).isEmpty, debris(local))
  }

  test("KV lastWin within one task across shards: the task rewrites its sealed shard before uploading it") {
    val (remote, local) = freshRemotePath()
    val schema = StructType(Seq(StructField("k", StringType), StructField("v", ArrayType(FloatType))))
    // 1 KiB per row, 1 MiB shards, 6000 rows = two Arrow batches (4096 rows each at most): "a"
    // is sealed in the task's first shard during the first batch and replaced in the second.
    val n = 6000
    val rows = (0 until n).map(i => Row(if (i == n - 1) "a" else if (i == 0) "a" else s"k$i",
      Seq.fill(256)(i.toFloat)))
    val df = spark.createDataFrame(spark.sparkContext.parallelize(rows, 1), schema)
    val uploads = tracked {
      df.write.format("safetensors").option("name_col", "k").option("duplicatesStrategy", "lastWin")
        .option("target_shard_size_mb", "1").save(remote)
    }
    val shards = shardFiles(local)
    assert(shards.size >= 5, shards)
    assert(shardUploads(uploads).size == shards.size, uploads)
    val tensors = shards.flatMap(f => readShard(f).tensors.toSeq)
    assert(tensors.size == n - 1)
    assert(tensors.count(_._1 == "a__v") == 1)
    assert(f32(tensors.find(_._1 == "a__v").get._2.data).toSet == Set((n - 1).toFloat))
    assert(manifest(local).get("total_samples").asInt == n - 1)
    assert(debris(local).isEmpty, debris(local))
  }

  test("generate_index: index parts uploaded; append indexes earlier shards, then adds its parts") {
    val (remote, local) = freshRemotePath()
    val idx = new File(local, "_tensor_index.parquet")
    def indexRows(): Long = spark.read.parquet(idx.getAbsolutePath).count()
    // first write without an index, then an append that creates it (earlier shards from headers)
    tracked(floats(4).write.format("safetensors").option("batch_size", "2").save(remote))
    assert(!idx.exists())
    val u1 = tracked {
      floats(2, 1).write.format("safetensors").option("batch_size", "2").option("generate_index", "true")
        .mode("append").save(remote)
    }
    assert(u1.exists(_.contains("_tensor_index.parquet/.part-")), u1)
    assert(idx.isDirectory && indexRows() == shardFiles(local).size && shardFiles(local).size == 3)
    // append again with an index: the new shards' parts are added, old ones stay
    tracked {
      floats(2, 1).write.format("safetensors").option("batch_size", "2").option("generate_index", "true")
        .mode("append").save(remote)
    }
    assert(indexRows() == 4 && shardFiles(local).size == 4)
    assert(manifest(local).get("total_samples").asInt == 8)
    assert(debris(local).isEmpty, debris(local))
  }

  test("overwrite and append through uploads") {
    val (remote, local) = freshRemotePath()
    tracked(floats(4).write.format("safetensors").option("batch_size", "2").option("generate_index", "true").save(remote))
    val oldShards = shardFiles(local).map(_.getName).toSet
    val u = tracked(floats(6, 1).write.format("safetensors").option("batch_size", "3").option("retention", "0")
      .mode("overwrite").save(remote))
    assert(shardUploads(u).size == 2 && reportUploads(u).size == 1 && taskUploads(u).size == 3, u)
    val newShards = shardFiles(local).map(_.getName).toSet
    assert(newShards.size == 2 && newShards.intersect(oldShards).isEmpty)
    assert(manifest(local).get("total_samples").asInt == 6)
    assert(!new File(local, "_tensor_index.parquet").exists(), "overwrite without generate_index drops the index")
    assert(debris(local).isEmpty, debris(local))

    tracked(floats(3, 1).write.format("safetensors").option("batch_size", "3").mode("append").save(remote))
    val m = manifest(local)
    assert(m.get("shards").size == 3 && m.get("total_samples").asInt == 9)
    assert(shardFiles(local).size == 3)
    assert(debris(local).isEmpty, debris(local))
  }

  test("a task that throws mid-write, after uploading sealed shards, leaves nothing behind, remote or local") {
    val (remote, local) = freshRemotePath()
    // Rows reach the native writer in Arrow batches of 4096: rows 0..8191 are written before row
    // 9000 throws in the third batch. Eight shards of 1000 are sealed by then; a shard is uploaded
    // once it is in place, and at most 3 can still be on the sealing thread (2 queued + 1 being
    // synced), so at least one of the 4 shards of the first batch was uploaded by the second.
    val boom = udf { (i: Int) => if (i == 9000) throw new RuntimeException("boom at 9000") else Array(i.toFloat) }
    val df = spark.range(0, 10000, 1, 1).selectExpr("cast(id as int) as i").select(boom(col("i")).as("x"))
    val uploads = tracked {
      val e = intercept[Exception](df.write.format("safetensors").option("batch_size", "1000").save(remote))
      assert(messages(e).contains("boom at 9000"), messages(e))
    }
    assert(shardUploads(uploads).nonEmpty, s"shards uploaded before the throw: $uploads")
    assert(!new File(local).exists() || allFiles(local).isEmpty, allFiles(local))
  }

  test("a failed append leaves the existing dataset byte-identical") {
    val (remote, local) = freshRemotePath()
    tracked(floats(4).write.format("safetensors").option("batch_size", "2").save(remote))
    val before = snapshot(local)
    val boom = udf { (i: Int) => if (i == 3) throw new RuntimeException("boom at 3") else Array(i.toFloat, 0f, 0f, 0f) }
    val df = spark.range(0, 6, 1, 1).selectExpr("cast(id as int) as i").select(boom(col("i")).as("x"))
    tracked {
      val e = intercept[Exception](df.write.format("safetensors").option("batch_size", "2").mode("append").save(remote))
      assert(messages(e).contains("boom at 3"), messages(e))
    }
    assert(snapshot(local) == before)
  }
}
