package io.safetensors.spark.commit

import java.io.File
import java.nio.charset.StandardCharsets
import java.nio.file.Files

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.{JsonNode, ObjectMapper}
import io.safetensors.spark.{Compaction, SafetensorsDataset, SparkSuiteBase, Vacuum}
import io.safetensors.spark.jni.NativeNames
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.{DataFrame, Row}
import org.apache.spark.sql.types._

/** The manifest log through Spark (spec/dataset.md §5.10): delta entries, checkpoints, rebuilt
 *  versions, and an old full-copy log continued. */
class ManifestLogSuite extends SparkSuiteBase {
  private val mapper = new ObjectMapper()

  override protected def appName: String = "safetensors-log"

  private val schema = StructType(Seq(StructField("x", ArrayType(FloatType))))

  private def rows(n: Int, tag: Int): DataFrame =
    spark.createDataFrame(spark.sparkContext.parallelize(
      (0 until n).map(i => Row(Seq((tag * 1000 + i).toFloat))), 1), schema)

  private def append(path: String, tag: Int, opts: (String, String)*): Unit =
    opts.foldLeft(rows(2, tag).write.format("safetensors").option("batch_size", "2").mode("append")) {
      case (w, (k, v)) => w.option(k, v)
    }.save(path)

  private def logDir(path: String) = new File(path, "_manifest_log")
  private def logNames(path: String): Seq[String] = Option(logDir(path).list()).toSeq.flatten.sorted
  private def entry(path: String, v: Long): JsonNode =
    mapper.readTree(new File(logDir(path), DatasetCommit.logName(v)))

  /** The first floats of each row of `version` (None: the latest), sorted. */
  private def values(path: String, version: Option[Long] = None): Seq[Float] = {
    val r = spark.read.format("safetensors")
    version.fold(r)(v => r.option("versionAsOf", v)).load(path).collect().map(_.getSeq[Float](0).head).toSeq.sorted
  }

  private def tagged(tags: Int*): Seq[Float] = tags.flatMap(t => Seq(t * 1000f, t * 1000f + 1)).sorted

  test("each commit writes what it changed; checkpoints every checkpoint_interval versions; every " +
      "version, history and a stale dataset_manifest.json rebuild from them") {
    val path = freshPath()
    append(path, 1, "checkpoint_interval" -> "3")
    (2 to 7).foreach(t => append(path, t))
    val names = logNames(path)
    assert(names.filter(_.endsWith(".checkpoint.json")) ==
      Seq(1L, 3L, 6L).map(v => NativeNames.checkpointFileName(v)), names)
    // an append's entry: its own shard, not the six before it
    val e7 = entry(path, 7)
    assert(e7.get("log_format").asInt() == 2 && e7.get("base_version").asLong() == 6)
    assert(e7.get("add").size() == 1 && e7.get("remove").size() == 0 && e7.get("shards_count").asLong() == 7)
    assert(!e7.has("shards") && e7.get("manifest").get("total_samples").asLong() == 14)
    // the interval is the dataset's: a later write without the option keeps it
    assert(mapper.readTree(new File(path, "dataset_manifest.json")).get("checkpoint_interval").asLong() == 3)
    (1 to 7).foreach(v => assert(values(path, Some(v.toLong)) == tagged(1 to v: _*), s"version $v"))
    val h = SafetensorsDataset.history(spark, path).collect()
    assert(h.map(_.getAs[Long]("shards_added")).toSeq == Seq.fill(7)(1L))
    assert(h.map(_.getAs[Long]("total_rows")).toSeq == (1 to 7).map(_ * 2L))
    // dataset_manifest.json behind the log (a publication that failed): the next writer builds on
    // the rebuilt latest version, and nothing is lost
    val v3 = new String(Files.readAllBytes(new File(logDir(path), NativeNames.checkpointFileName(3)).toPath),
      StandardCharsets.UTF_8)
    Files.write(new File(path, "dataset_manifest.json").toPath, v3.getBytes(StandardCharsets.UTF_8))
    append(path, 8)
    assert(values(path) == tagged(1 to 8: _*))
    // a damaged entry fails the versions that need it, naming it
    val e5 = new File(logDir(path), DatasetCommit.logName(5))
    val text = new String(Files.readAllBytes(e5.toPath), StandardCharsets.UTF_8)
    val shard5 = entry(path, 5).get("add").get(0).get("shard_path").asText()
    Files.write(e5.toPath, text.replace(shard5, "part-99999-0000-00000000-0000-0000-0000-000000000000.safetensors")
      .getBytes(StandardCharsets.UTF_8))
    val err = intercept[Exception](values(path, Some(5L)))
    assert(messages(err).contains("version 5 rebuilt from _manifest_log/"), messages(err))
    // an entry that removes a shard its base does not list: the error names the entry
    val f7 = new File(logDir(path), DatasetCommit.logName(7))
    val t7 = mapper.readTree(f7).asInstanceOf[com.fasterxml.jackson.databind.node.ObjectNode]
    t7.putArray("remove").add(entry(path, 4).get("add").get(0))
    t7.put("shards_count", 6)
    Files.write(f7.toPath, mapper.writeValueAsBytes(t7))
    // (version 6 is a checkpoint: 7 replays from it) the shard entry 7 removes is listed — so
    // remove one that version 6 does not list as recorded
    val wrong = mapper.readTree(f7).asInstanceOf[com.fasterxml.jackson.databind.node.ObjectNode]
    wrong.get("remove").get(0).asInstanceOf[com.fasterxml.jackson.databind.node.ObjectNode].put("bytes", 1)
    Files.write(f7.toPath, mapper.writeValueAsBytes(wrong))
    val err7 = intercept[Exception](values(path, Some(7L)))
    assert(messages(err7).contains("00000000000000000007.json") && messages(err7).contains("the log is damaged"),
      messages(err7))
    assert(values(path, Some(4L)) == tagged(1 to 4: _*)) // below the damage: its checkpoint (3) and entry 4
  }

  test("an old full-copy log reads as before and its first commit continues it with a checkpoint " +
      "and a delta entry; vacuum and compaction work on the mixed log") {
    val path = freshPath()
    (1 to 3).foreach(t => append(path, t))
    // rewrite the log as an older connector wrote it: every entry the whole manifest of its version
    val fs = new Path(path).getFileSystem(spark.sessionState.newHadoopConf())
    val whole = (1L to 3L).map(v => DatasetCommit.rebuild(fs, new Path(logDir(path).getPath), logNames(path), v))
    (1L to 3L).zip(whole).foreach { case (v, m) =>
      Files.write(new File(logDir(path), DatasetCommit.logName(v)).toPath, m.getBytes(StandardCharsets.UTF_8))
    }
    logNames(path).filter(_.endsWith(".checkpoint.json")).foreach(n => new File(logDir(path), n).delete())
    assert(entry(path, 2).has("shards") && !entry(path, 2).has("log_format"))
    assert(values(path, Some(2L)) == tagged(1, 2))
    append(path, 4)
    assert(logNames(path).contains(NativeNames.checkpointFileName(4)))
    assert(entry(path, 4).get("log_format").asInt() == 2)
    (1 to 3).foreach(v => assert(values(path, Some(v.toLong)) == tagged(1 to v: _*)))
    assert(values(path, Some(4L)) == tagged(1, 2, 3, 4))
    // compaction merges the four one-batch shards' rows into full shards (batch_size 2: the same
    // count) — what matters here is that it commits a delta on the mixed log
    Compaction.compact(spark, path)
    assert(values(path) == tagged(1, 2, 3, 4))
    // vacuum with retention 0: the checkpoint of the latest version is where the log starts now
    val out = Vacuum.vacuum(spark, path, "0", false, true).collect()
    val latest = mapper.readTree(new File(path, "dataset_manifest.json")).get("manifest_version").asLong()
    assert(out.exists(_.getAs[String]("kind") == "log_entry"))
    assert(values(path) == tagged(1, 2, 3, 4))
    assert(values(path, Some(latest)) == tagged(1, 2, 3, 4))
    val err = intercept[Exception](values(path, Some(1L)))
    assert(messages(err).contains("version 1"), messages(err))
  }

  test("the engine's answers carry manifests over Jackson's default 20-million-character string " +
      "bound (a 100,000-shard dataset's): the connector's mapper reads them") {
    val big = "x" * 21000000
    val answer = io.safetensors.spark.internal.Json.mapper.readTree("{\"manifest\": \"" + big + "\"}")
    assert(answer.get("manifest").asText().length == big.length)
    val plain = intercept[Exception](new ObjectMapper().readTree("{\"manifest\": \"" + big + "\"}"))
    assert(messages(plain).contains("exceeds the maximum"), messages(plain))
  }
}
