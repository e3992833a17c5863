package io.safetensors.spark.commit

import java.io.File
import java.nio.file.{Files, StandardCopyOption}

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.{JsonNode, ObjectMapper}
import org.apache.spark.sql.{DataFrame, Row}
import org.apache.spark.sql.types._
import io.safetensors.spark.{Compaction, SafetensorsDataset, SparkSuiteBase, Vacuum}

/**
 * The Spark side of spec/dataset.md §5.9 (issue #39): a dataset's own directories are never
 * followed through a link, a log entry is trusted only when it agrees with its name, and a
 * maintenance option that is not what it must be is refused naming it. Real directories,
 * real links.
 */
class HostileDatasetSuite extends SparkSuiteBase {
  private val mapper = new ObjectMapper()

  override protected def appName: String = "safetensors-hostile"

  private val schema = StructType(Seq(StructField("x", ArrayType(FloatType))))

  private def rows(n: Int, tag: Int): DataFrame =
    spark.createDataFrame(spark.sparkContext.parallelize(
      (0 until n).map(i => Row(Seq((tag * 1000 + i).toFloat))), 1), schema)

  private def manifest(path: String): JsonNode = mapper.readTree(new File(path, "dataset_manifest.json"))

  private def listed(path: String): Set[String] =
    manifest(path).get("shards").elements().asScala.map(_.get("shard_path").asText()).toSet

  private def logNames(path: String): Seq[String] =
    Option(new File(path, DatasetCommit.LogDir).list()).toSeq.flatten.sorted

  private def values(path: String, version: Option[Long] = None): Seq[Float] = {
    val r = spark.read.format("safetensors")
    version.fold(r)(v => r.option("versionAsOf", v)).load(path).collect().map(_.getSeq[Float](0).head).toSeq.sorted
  }

  /** Version 1 (4 rows, tag 1), then an overwrite (2 rows, tag 2): version 1's shards are
   *  superseded. Returns version 1's shards. */
  private def twoVersions(path: String): Set[String] = {
    rows(4, 1).write.format("safetensors").option("batch_size", "2").save(path)
    val v1 = listed(path)
    rows(2, 2).write.format("safetensors").option("batch_size", "2").mode("overwrite").save(path)
    v1
  }

  test("item 1: vacuum refuses a linked _tensor_index.parquet and deletes nothing, outside included") {
    val path = freshPath()
    val v1 = twoVersions(path)
    val outside = Files.createTempDirectory("hostile-outside").toFile
    val part = new File(outside, v1.head.stripSuffix(".safetensors") + ".parquet")
    Files.write(part.toPath, "not yours".getBytes)
    Files.createSymbolicLink(new File(path, "_tensor_index.parquet").toPath, outside.toPath)
    val e = messages(intercept[Exception](Vacuum.vacuum(spark, path, "0", false, true).collect()))
    assert(e.contains("_tensor_index.parquet: is a symbolic link"), e)
    assert(part.exists(), "the file outside the dataset is kept")
    assert(v1.forall(f => new File(path, f).exists()), "nothing was deleted")
  }

  test("item 11: Spark's vacuum keeps a symbolic link named like a superseded shard (regular files only)") {
    val path = freshPath()
    val v1 = twoVersions(path)
    val outside = Files.createTempDirectory("hostile-target").toFile
    val target = new File(outside, "kept.bin")
    Files.write(target.toPath, "not yours".getBytes)
    val linked = new File(path, v1.head)
    linked.delete()
    Files.createSymbolicLink(linked.toPath, target.toPath)
    val out = Vacuum.vacuum(spark, path, "0", false, true).collect().map(_.getString(0)).toSet
    assert(!out.contains(v1.head), out)
    assert(Files.isSymbolicLink(linked.toPath) && target.exists(), "the link and its target stay")
    assert(v1.tail.forall(f => !new File(path, f).exists()), "the other superseded shard went")
  }

  test("item 7: a FIFO dataset_manifest.json and a log entry linked to /dev/zero are refused at once") {
    import org.scalatest.concurrent.TimeLimits._
    import org.scalatest.time.SpanSugar._
    val path = freshPath()
    twoVersions(path)
    // version 2 is rebuilt from the checkpoint of version 1 and entry 2 (spec/dataset.md §5.10)
    val entry = new File(new File(path, DatasetCommit.LogDir), DatasetCommit.logName(2))
    entry.delete()
    Files.createSymbolicLink(entry.toPath, new File("/dev/zero").toPath)
    failAfter(60.seconds) {
      val e = messages(intercept[Exception](values(path, Some(2))))
      assert(e.contains("00000000000000000002.json: not a regular file (character device)"), e)
    }
    val manifest = new File(path, "dataset_manifest.json")
    manifest.delete()
    assert(new ProcessBuilder("mkfifo", manifest.getPath).start().waitFor() == 0)
    failAfter(60.seconds) {
      for (run <- Seq[() => Any](() => values(path), () => Vacuum.vacuum(spark, path, "0", true, true).collect())) {
        val e = messages(intercept[Exception](run()))
        assert(e.contains("dataset_manifest.json: not a regular file (FIFO)"), e)
      }
    }
  }

  test("a write never places or deletes index parts through a linked _tensor_index.parquet") {
    val path = freshPath()
    rows(4, 1).write.format("safetensors").option("batch_size", "2").option("generate_index", "true").save(path)
    val index = new File(path, "_tensor_index.parquet")
    val outside = Files.createTempDirectory("hostile-index").toFile
    index.listFiles().foreach(f => Files.move(f.toPath, new File(outside, f.getName).toPath))
    index.delete()
    Files.createSymbolicLink(index.toPath, outside.toPath)
    val before = outside.list().toSet
    for (gen <- Seq("true", "false")) {
      val e = messages(intercept[Exception](rows(2, 2).write.format("safetensors").option("batch_size", "2")
        .option("generate_index", gen).mode("append").save(path)))
      assert(e.contains("_tensor_index.parquet: is a symbolic link"), e)
    }
    assert(outside.list().toSet == before, "nothing placed or deleted through the link")
    // a read does not use the linked index (the headers answer) and sees version 1 only
    assert(values(path) == (0 until 4).map(i => 1000f + i), "nothing committed")
  }

  test("item 2: a _manifest_log linked to another dataset's is refused by vacuum, history and " +
      "versionAsOf; the other dataset keeps its versions and gets no vacuum version") {
    val a = freshPath()
    twoVersions(a)
    val before = logNames(a)
    val b = freshPath()
    rows(2, 3).write.format("safetensors").option("batch_size", "2").save(b)
    val bLog = new File(b, DatasetCommit.LogDir)
    bLog.listFiles().foreach(_.delete())
    bLog.delete()
    Files.createSymbolicLink(bLog.toPath, new File(a, DatasetCommit.LogDir).toPath)
    for (run <- Seq[() => Any](
        () => Vacuum.vacuum(spark, b, "0", false, true).collect(),
        () => SafetensorsDataset.history(spark, b).collect(),
        () => values(b, Some(1)))) {
      val e = messages(intercept[Exception](run()))
      assert(e.contains("_manifest_log: is a symbolic link"), e)
    }
    assert(logNames(a) == before, "A's log is untouched")
    assert(values(a, Some(1)) == (0 until 4).map(i => 1000f + i))
  }

  test("item 3: a Spark read of a partitioned root does not enter a linked partition directory") {
    val root = freshPath()
    rows(2, 1).write.format("safetensors").option("batch_size", "2").save(s"$root/split=a")
    val other = freshPath()
    rows(3, 9).write.format("safetensors").option("batch_size", "2").save(other)
    Files.createSymbolicLink(new File(root, "split=b").toPath, new File(other).toPath)
    val got = spark.read.format("safetensors").load(root).collect()
    assert(got.map(_.getAs[String]("split")).toSet == Set("a"), got.toSeq)
    assert(got.length == 2)
  }

  test("item 4: Spark compaction refuses dry_run values other than true/false, and negative numbers, " +
      "naming the option; nothing is compacted") {
    val path = freshPath()
    rows(1, 1).write.format("safetensors").option("batch_size", "2").save(path)
    rows(1, 2).write.format("safetensors").option("batch_size", "2").mode("append").save(path)
    val before = logNames(path)
    for (v <- Seq("1", "yes", "on", "")) {
      val e = messages(intercept[IllegalArgumentException](
        Compaction.compact(spark, path, Map("dry_run" -> v))))
      assert(e.contains("option 'dry_run' must be true or false") && e.contains(s"'$v'"), e)
    }
    assert(logNames(path) == before, "nothing was committed")
    val e = messages(intercept[IllegalArgumentException](
      Compaction.compact(spark, path, Map("batch_size" -> "-3"))))
    assert(e.contains("option batch_size = '-3': expected a whole number"), e)
    val dry = Compaction.compact(spark, path, Map("dry_run" -> "TRUE")).collect()
    assert(dry.head.isNullAt(0) && logNames(path) == before)
  }

  test("item 5: versionAsOf refuses a log entry whose manifest_version disagrees with its name") {
    val path = freshPath()
    twoVersions(path)
    rows(2, 3).write.format("safetensors").option("batch_size", "2").mode("append").save(path)
    val log = new File(path, DatasetCommit.LogDir)
    Files.copy(new File(log, DatasetCommit.logName(3)).toPath, new File(log, DatasetCommit.logName(2)).toPath,
      StandardCopyOption.REPLACE_EXISTING)
    val e = messages(intercept[Exception](values(path, Some(2))))
    assert(e.contains("_manifest_log/00000000000000000002.json: holds manifest_version 3, not 2"), e)
    val h = messages(intercept[Exception](SafetensorsDataset.history(spark, path).collect()))
    assert(h.contains("holds manifest_version 3, not 2"), h)
    // a stray entry beyond any version is named by every reader of the log; a writer finds its
    // next version by probing, not listing (spec/dataset.md §5.10), and commits past it
    assert(new File(log, DatasetCommit.logName(2)).delete())
    Files.write(new File(log, "99999999999999999999.json").toPath, "{}".getBytes)
    rows(2, 4).write.format("safetensors").option("batch_size", "2").mode("append").save(path)
    assert(new File(log, DatasetCommit.logName(4)).isFile)
    for (run <- Seq[() => Any](() => values(path, Some(1)), () => SafetensorsDataset.history(spark, path).collect())) {
      val e = messages(intercept[Exception](run()))
      assert(e.contains("_manifest_log/99999999999999999999.json: not a version number"), e)
    }
  }
}
