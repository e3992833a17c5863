package io.safetensors.spark.read

import java.io.File
import java.nio.file.Files
import java.util.zip.CRC32C

import com.fasterxml.jackson.databind.ObjectMapper
import com.fasterxml.jackson.databind.node.ObjectNode
import org.apache.spark.sql.{DataFrame, Row}
import org.apache.spark.sql.execution.datasources.v2.BatchScanExec
import org.apache.spark.sql.types._
import io.safetensors.spark.{SparkSuiteBase, TestRemoteFileSystem}
import io.safetensors.spark.write.SafetensorsWriteSuite

/**
 * Read option `verify_checksums` (spec/reading.md §5, "Checksums"): every shard a task reads
 * whose manifest entry records `crc32c` is read whole once and checked in the engine, on local
 * files and through a non-local Hadoop file system (`testfs`, whose streams count the bytes
 * that went through them). The S3 cases (a real server on loopback) are in
 * tests/python/test_s3.py.
 */
class VerifyChecksumsSuite extends SparkSuiteBase {
  import SafetensorsWriteSuite._

  override protected def appName: String = "safetensors-verify"

  override protected def sparkConf: Seq[(String, String)] = TestRemoteFileSystem.sparkConf

  private val mapper = new ObjectMapper()

  private def remote(local: String): String = s"${TestRemoteFileSystem.Scheme}://$local"

  /** A batch dataset of 64 rows in 4 shards; its path. */
  private def dataset(): String = {
    val path = freshPath()
    val schema = StructType(Seq(StructField("id", LongType), StructField("x", ArrayType(FloatType))))
    val rows = (0 until 64).map(i => Row(i.toLong, Seq.fill(8)(i.toFloat)))
    spark.createDataFrame(spark.sparkContext.parallelize(rows, 4), schema)
      .write.format("safetensors").option("batch_size", "16").save(path)
    assert(shardFiles(path).size == 4)
    path
  }

  private def read(uri: String, verify: Boolean): DataFrame =
    spark.read.format("safetensors").option("verify_checksums", verify.toString).load(uri)

  private def crc32c(bytes: Array[Byte]): String = {
    val c = new CRC32C()
    c.update(bytes, 0, bytes.length)
    f"${c.getValue}%08x"
  }

  /** The last byte of `f` flipped: same size, header intact, one value changed. */
  private def flipLastByte(f: File): Unit = {
    val b = Files.readAllBytes(f.toPath)
    b(b.length - 1) = (b(b.length - 1) ^ 0xff).toByte
    Files.write(f.toPath, b)
  }

  private def recorded(path: String, shard: File): String = {
    val entries = manifest(path).get("shards")
    (0 until entries.size()).map(entries.get).find(_.get("shard_path").asText() == shard.getName)
      .get.get("crc32c").asText()
  }

  test("a shard with one byte changed fails the read with the option, naming it, both CRC-32Cs and the option; without it the read returns rows") {
    val path = dataset()
    val bad = shardFiles(path)(2)
    val want = recorded(path, bad)
    assert(want == crc32c(Files.readAllBytes(bad.toPath)), "the writer's crc32c is the file's")
    flipLastByte(bad)
    val got = crc32c(Files.readAllBytes(bad.toPath))
    for (uri <- Seq(path, remote(path))) {
      val e = intercept[Exception](read(uri, verify = true).collect())
      val msg = messages(e)
      assert(msg.contains(bad.getName), msg)
      assert(msg.contains(s"CRC-32C $got") && msg.contains(s"records $want"), msg)
      assert(msg.contains("verify_checksums"), msg)
      assert(read(uri, verify = false).count() == 64, "without the option nothing is checked")
      // with ignoreCorruptFiles the bad shard is skipped like any corrupt file
      assert(spark.read.format("safetensors").option("verify_checksums", "true")
        .option("ignoreCorruptFiles", "true").load(uri).count() == 48)
    }
  }

  test("a manifest without crc32c (older datasets, other tools) reads with the option, unchecked") {
    val path = dataset()
    val m = manifest(path).asInstanceOf[ObjectNode]
    val entries = m.get("shards")
    (0 until entries.size()).foreach(i => entries.get(i).asInstanceOf[ObjectNode].remove("crc32c"))
    Files.write(new File(path, "dataset_manifest.json").toPath, mapper.writeValueAsBytes(m))
    flipLastByte(shardFiles(path).head)
    for (uri <- Seq(path, remote(path))) {
      assert(read(uri, verify = true).select("id").collect().map(_.getLong(0)).sorted.toSeq ==
        (0L until 64L))
    }
  }

  test("with the option safetensorsBytesRead grows by exactly the shards' sizes (each read whole once), as do the bytes through the remote streams") {
    val path = dataset()
    val total = shardFiles(path).map(_.length()).sum
    def measured(uri: String, verify: Boolean): (Long, Long) = {
      val before = TestRemoteFileSystem.bytesRead.get()
      val df = read(uri, verify).select("id")
      val rows = df.collect()
      assert(rows.map(_.getLong(0)).sorted.toSeq == (0L until 64L))
      val scans = df.queryExecution.executedPlan.collect { case s: BatchScanExec => s }
      assert(scans.size == 1)
      (scans.head.metrics(BytesReadMetric.Name).value, TestRemoteFileSystem.bytesRead.get() - before)
    }
    for (uri <- Seq(path, remote(path))) {
      val (plain, plainStreamed) = measured(uri, verify = false)
      val (verified, streamed) = measured(uri, verify = true)
      assert(verified == plain + total, (uri, plain, verified, total))
      if (uri != path) assert(streamed == plainStreamed + total, (plainStreamed, streamed, total))
    }
  }
}
