package io.safetensors.spark.write

import java.io.File
import java.nio.file.Files

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.{JsonNode, ObjectMapper}
import org.apache.spark.sql.{DataFrame, Row}
import org.apache.spark.sql.types._
import io.safetensors.spark.{SafetensorsDataset, SafetensorsExtensions, SparkSuiteBase, Vacuum}

/**
 * DELETE (spec/dataset.md §5.11): SQL `DELETE FROM` on a path (SQL on files) and on a catalog
 * table through Spark's row-level operations (copy-on-write), `SafetensorsDataset.delete`, the
 * provenance columns (spec/reading.md §2.1), partitioned roots, forced races, and that after a
 * vacuum with retention 0 no byte of a deleted row is left in the dataset directory.
 */
class DeleteSuite extends SparkSuiteBase {
  private val mapper = new ObjectMapper()

  override protected def appName: String = "safetensors-delete"

  override protected def sparkConf: Seq[(String, String)] = Seq(
    "spark.sql.extensions" -> classOf[SafetensorsExtensions].getName,
    "spark.sql.warehouse.dir" -> new File(base, "warehouse").getAbsolutePath,
    "spark.sql.catalogImplementation" -> "in-memory")

  private val schema = StructType(Seq(StructField("id", LongType), StructField("x", ArrayType(FloatType)),
    StructField("tok", ArrayType(IntegerType))))

  /** Rows `from until from + n`: id, x = [id + 0.25, -id], tok = id % 3 ints (ragged). */
  private def rows(n: Int, from: Int = 0, parts: Int = 2): DataFrame =
    spark.createDataFrame(spark.sparkContext.parallelize((from until from + n).map { i =>
      Row(i.toLong, Seq(i + 0.25f, -i.toFloat), Seq.tabulate(i % 3)(k => i * 100 + k))
    }, parts), schema)

  private def write(df: DataFrame, path: String, mode: String = "append", opts: Map[String, String] = Map.empty): Unit =
    df.write.format("safetensors").option("batch_size", "4").option("ragged", "tok").options(opts)
      .mode(mode).save(path)

  private def manifest(path: String): JsonNode = mapper.readTree(new File(path, "dataset_manifest.json"))

  private def ids(path: String): Seq[Long] =
    spark.read.format("safetensors").load(path).select("id").collect().map(_.getLong(0)).toSeq.sorted

  private def shardNames(path: String): Set[String] =
    manifest(path).get("shards").elements().asScala.map(_.get("shard_path").asText()).toSet

  import DeleteSuite.{filesContaining, xBytes}

  test("provenance columns: _file, _row_index and _added_version of every row") {
    val path = freshPath()
    write(rows(6, parts = 1), path, "errorifexists")
    write(rows(2, from = 100, parts = 1), path)
    val df = spark.read.format("safetensors").load(path)
    assert(df.columns.toSeq == Seq("id", "x", "tok"), "hidden unless selected")
    val got = df.select("id", "_file", "_row_index", "_added_version").collect()
      .map(r => r.getLong(0) -> (new File(new java.net.URI(r.getString(1))).getName, r.getLong(2), r.getLong(3)))
      .toMap
    val m = manifest(path)
    val added = m.get("shards").elements().asScala.map(s =>
      s.get("shard_path").asText() -> s.get("added_version").asLong()).toMap
    assert(added.values.toSet == Set(1L, 2L))
    got.foreach { case (id, (file, row, version)) =>
      assert(added(file) == version, (id, file))
      assert(row >= 0 && row < 4)
    }
    assert(got(100L)._3 == 2L && got(0L)._3 == 1L)
    // a row's provenance finds exactly that row again
    val (file, row, _) = got(5L)
    assert(df.where(s"_row_index = $row AND _file LIKE '%$file'").select("id").collect().map(_.getLong(0)).toSeq ==
      Seq(5L))
  }

  test("DELETE FROM safetensors.`path`: only the shards holding matching rows are rewritten; vacuum leaves no byte") {
    val path = freshPath()
    write(rows(12, parts = 1), path, "errorifexists", Map("retention" -> "0"))
    val before = manifest(path).get("shards").elements().asScala.map(s =>
      s.get("shard_path").asText() -> s.toString).toMap
    assert(filesContaining(new File(path), xBytes(5)).nonEmpty)
    spark.sql(s"DELETE FROM safetensors.`$path` WHERE id = 5 OR id = 6")
    assert(ids(path) == (0L until 12L).filterNot(Set(5L, 6L)))
    val m = manifest(path)
    assert(m.get("operation").asText() == "delete")
    assert(m.get("total_samples").asLong() == 10)
    val after = m.get("shards").elements().asScala.map(s => s.get("shard_path").asText() -> s.toString).toMap
    // rows 5 and 6 were in the second shard only: the other two are listed exactly as before
    assert((before.keySet & after.keySet).size == 2)
    (before.keySet & after.keySet).foreach(k => assert(before(k) == after(k)))
    val h = SafetensorsDataset.history(spark, path).collect().last
    assert(h.getAs[String]("operation") == "delete" && h.getAs[Long]("rows_removed") == 4 &&
      h.getAs[Long]("rows_added") == 2)
    // ragged values survive the byte-level rewrite
    val tok = spark.read.format("safetensors").load(path).where("id = 7").select("tok").head().getSeq[Int](0)
    assert(tok == Seq(700))
    Vacuum.vacuum(spark, path, "0", false, false).collect()
    assert(filesContaining(new File(path), xBytes(5)).isEmpty)
    assert(filesContaining(new File(path), xBytes(7)).nonEmpty)
  }

  test("DELETE FROM a catalog table, and a condition matching nothing commits nothing") {
    val path = freshPath()
    write(rows(8), path, "errorifexists")
    try {
      spark.sql(s"CREATE TABLE del USING safetensors LOCATION '$path'")
      val v = manifest(path).get("manifest_version").asLong()
      spark.sql("DELETE FROM del WHERE id > 100")
      assert(manifest(path).get("manifest_version").asLong() == v)
      spark.sql("DELETE FROM del WHERE id % 2 = 0")
      assert(ids(path) == Seq(1L, 3L, 5L, 7L))
      assert(manifest(path).get("operation").asText() == "delete")
      assert(spark.sql("SELECT count(*) FROM del").head().getLong(0) == 4)
    } finally spark.sql("DROP TABLE IF EXISTS del")
  }

  test("SafetensorsDataset.delete by provenance; a partition predicate drops whole partitions' shards") {
    val path = freshPath()
    write(rows(8), path, "errorifexists")
    val victim = spark.read.format("safetensors").load(path).where("id = 3").select("_file", "_row_index").head()
    val r = SafetensorsDataset.delete(spark, path,
      s"_file = '${victim.getString(0)}' AND _row_index = ${victim.getLong(1)}", "request 7").collect()
    assert(r.length == 1 && r.head.getLong(1) == 1)
    assert(ids(path) == (0L until 8L).filterNot(_ == 3L))
    assert(manifest(path).get("commit_message").asText() == "request 7")

    val root = freshPath()
    rows(8).withColumn("split", org.apache.spark.sql.functions.expr("if(id < 4, 'a', 'b')"))
      .write.format("safetensors").option("batch_size", "4").option("ragged", "tok").partitionBy("split").save(root)
    val b = new File(root, "split=b").getPath
    val bShards = shardNames(b)
    val aVersion = manifest(new File(root, "split=a").getPath).get("manifest_version").asLong()
    val out = SafetensorsDataset.delete(spark, root, "split = 'b'").collect()
    assert(out.length == 1 && out.head.getLong(1) == 4 && out.head.getLong(3) == 0, out.toSeq)
    assert(shardNames(b).isEmpty && manifest(b).get("operation").asText() == "delete")
    assert(bShards.forall(s => new File(b, s).exists()), "kept for the retention period")
    assert(manifest(new File(root, "split=a").getPath).get("manifest_version").asLong() == aVersion)
    assert(spark.read.format("safetensors").load(root).select("id").collect().map(_.getLong(0)).sorted.toSeq ==
      Seq(0L, 1L, 2L, 3L))
    // SQL DELETE on the root: one delete version in the partition holding the row
    spark.sql(s"DELETE FROM safetensors.`$root` WHERE split = 'a' AND id = 0")
    assert(manifest(new File(root, "split=a").getPath).get("operation").asText() == "delete")
    assert(spark.read.format("safetensors").load(root).select("id").collect().map(_.getLong(0)).sorted.toSeq ==
      Seq(1L, 2L, 3L))
  }

  test("a DELETE whose condition selects whole partitions reads no shard") {
    val root = freshPath()
    rows(12).withColumn("split", org.apache.spark.sql.functions.expr("case when id < 4 then 'a' when id < 8 " +
      "then 'b' else 'c' end")).write.format("safetensors").option("batch_size", "4").option("ragged", "tok")
      .partitionBy("split").save(root)
    val b = new File(root, "split=b").getPath
    val c = new File(root, "split=c").getPath
    // the shards of b and c garbled (same size): a DELETE that read them would fail
    for (d <- Seq(b, c); s <- shardNames(d)) {
      val f = new File(d, s)
      java.nio.file.Files.write(f.toPath, Array.fill(f.length().toInt)(0x7f.toByte))
    }
    val aVersion = manifest(new File(root, "split=a").getPath).get("manifest_version").asLong()
    spark.sql(s"DELETE FROM safetensors.`$root` WHERE split = 'b' OR split IN ('c', 'z')")
    for (d <- Seq(b, c)) {
      val m = manifest(d)
      assert(m.get("operation").asText() == "delete" && m.get("shards").size() == 0 &&
        m.get("total_samples").asLong() == 0, m)
    }
    assert(manifest(new File(root, "split=a").getPath).get("manifest_version").asLong() == aVersion)
    assert(spark.read.format("safetensors").load(root).select("id").collect().map(_.getLong(0)).sorted.toSeq ==
      Seq(0L, 1L, 2L, 3L))
    // a condition on a data column too reads rows: the garbled partitions are emptied, a's is read
    spark.sql(s"DELETE FROM safetensors.`$root` WHERE split = 'a' AND id = 2")
    assert(spark.read.format("safetensors").load(root).select("id").collect().map(_.getLong(0)).sorted.toSeq ==
      Seq(0L, 1L, 3L))
  }

  /** `f`'s result, failing if it ran a Spark job: a sentinel job in another group marks the end
   *  of its events (the listener bus delivers in order). */
  private def withoutJobs[T](f: => T): T = {
    val groups = new java.util.concurrent.ConcurrentLinkedQueue[String]()
    val listener = new org.apache.spark.scheduler.SparkListener {
      override def onJobStart(e: org.apache.spark.scheduler.SparkListenerJobStart): Unit =
        groups.add(String.valueOf(Option(e.properties).map(_.getProperty("spark.jobGroup.id")).orNull))
    }
    val sc = spark.sparkContext
    sc.addSparkListener(listener)
    try {
      sc.setJobGroup("under-test", "under test")
      val r = try f finally sc.clearJobGroup()
      sc.setJobGroup("sentinel", "sentinel")
      try sc.parallelize(1 to 2, 1).count() finally sc.clearJobGroup()
      val until = System.nanoTime() + 60L * 1000 * 1000 * 1000
      while (!groups.contains("sentinel") && System.nanoTime() < until) Thread.sleep(20)
      assert(groups.contains("sentinel"), "the sentinel job was not seen")
      assert(!groups.contains("under-test"), s"jobs ran: ${groups.asScala.toSeq}")
      r
    } finally sc.removeSparkListener(listener)
  }

  test("SafetensorsDataset.delete with a condition over partition columns only reads no row; NULL as SQL") {
    val root = freshPath()
    rows(16).withColumn("split", org.apache.spark.sql.functions.expr("case when id < 4 then 'a' when id < 8 " +
      "then 'b' when id < 12 then 'c' end")).withColumn("p", org.apache.spark.sql.functions.expr("id % 2"))
      .write.format("safetensors").option("batch_size", "4").option("ragged", "tok")
      .partitionBy("split", "p").save(root)
    val nullDir = new File(root, "split=__HIVE_DEFAULT_PARTITION__")
    assert(nullDir.isDirectory, new File(root).list().toSeq)
    def dir(split: String, p: Int) = new File(new File(root, s"split=$split"), s"p=$p").getPath
    // every shard but those of split=a garbled (same size): a delete that read them would fail
    val garbled = for (sp <- Seq("b", "c", "__HIVE_DEFAULT_PARTITION__"); p <- Seq(0, 1); d = dir(sp, p);
      s <- shardNames(d)) yield {
      val f = new File(d, s)
      java.nio.file.Files.write(f.toPath, Array.fill(f.length().toInt)(0x7f.toByte))
      f
    }
    assert(garbled.nonEmpty)
    val a0 = manifest(dir("a", 0)).get("manifest_version").asLong()
    // NULL <> 'a' is not true: the null directory is kept, as a read's WHERE keeps its rows; and
    // no Spark job runs (reading the rows' provenance would run one)
    val out = withoutJobs(SafetensorsDataset.delete(spark, root, "split <> 'a' AND p = 1", "by partition").collect())
    assert(out.map(_.getLong(1)).toSeq == Seq(2L, 2L), out.toSeq)
    for (sp <- Seq("b", "c")) {
      val m = manifest(dir(sp, 1))
      assert(m.get("operation").asText() == "delete" && m.get("shards").size() == 0 &&
        m.get("commit_message").asText() == "by partition", m)
    }
    assert(manifest(dir("__HIVE_DEFAULT_PARTITION__", 1)).get("operation").asText() != "delete")
    assert(manifest(dir("a", 0)).get("manifest_version").asLong() == a0)
    // IS NULL selects the null directories; a condition matching no directory commits nothing
    val nulls = SafetensorsDataset.delete(spark, root, "split IS NULL").collect()
    assert(nulls.map(_.getLong(1)).sum == 4, nulls.toSeq)
    assert(SafetensorsDataset.delete(spark, root, "split = 'zz'").collect().isEmpty)
    assert(SafetensorsDataset.delete(spark, root, "split IN ('b', 'c')").collect().map(_.getLong(1)).sum == 4)
    assert(spark.read.format("safetensors").load(root).select("id").collect().map(_.getLong(0)).sorted.toSeq ==
      Seq(0L, 1L, 2L, 3L))
    // a glob is no partitioned root: its rows are read
    assert(SafetensorsDataset.delete(spark, s"$root/split=a/p=*", "id = 0").collect().map(_.getLong(1)).toSeq ==
      Seq(1L))
    assert(spark.read.format("safetensors").load(root).select("id").collect().map(_.getLong(0)).sorted.toSeq ==
      Seq(1L, 2L, 3L))
  }

  test("forced races: an append during a delete is kept, a delete of the same shard fails it") {
    val path = freshPath()
    write(rows(8, parts = 1), path, "errorifexists")
    Deletes.beforeCommit = () => { Deletes.beforeCommit = null; write(rows(2, from = 50), path) }
    try spark.sql(s"DELETE FROM safetensors.`$path` WHERE id = 1") finally Deletes.beforeCommit = null
    assert(ids(path) == (0L until 8L).filterNot(_ == 1L) ++ Seq(50L, 51L))
    val v = manifest(path).get("manifest_version").asLong()
    Deletes.beforeCommit = () => {
      Deletes.beforeCommit = null
      SafetensorsDataset.delete(spark, path, "id = 2").collect()
    }
    val e = try intercept[Exception](spark.sql(s"DELETE FROM safetensors.`$path` WHERE id = 0"))
      finally Deletes.beforeCommit = null
    assert(messages(e).contains(s"version ${v + 1} (delete) removed it"), messages(e))
    assert(ids(path) == Seq(0L, 3L, 4L, 5L, 6L, 7L, 50L, 51L))
  }

  test("bad deletes are refused naming what is wrong") {
    val path = freshPath()
    write(rows(4), path, "errorifexists")
    val e1 = intercept[IllegalArgumentException](SafetensorsDataset.delete(spark, path, " "))
    assert(e1.getMessage.contains("condition is empty"))
    val e2 = intercept[Exception](spark.sql(s"UPDATE safetensors.`$path` SET id = 1 WHERE id = 2"))
    assert(messages(e2).contains("UPDATE") || messages(e2).contains("not supported"), messages(e2))
    assert(ids(path) == Seq(0L, 1L, 2L, 3L))
  }
}

private[write] object DeleteSuite {
  /** Files under `dir` holding `needle`. */
  def filesContaining(dir: File, needle: Array[Byte]): Seq[String] =
    Files.walk(dir.toPath).iterator().asScala.filter(Files.isRegularFile(_)).filter { p =>
      Files.readAllBytes(p).containsSlice(needle)
    }.map(_.toString).toSeq

  /** The bytes of the F32 values [id + 0.25, -id] (a row's `x`), little-endian. */
  def xBytes(id: Long): Array[Byte] = {
    val b = java.nio.ByteBuffer.allocate(8).order(java.nio.ByteOrder.LITTLE_ENDIAN)
    b.putFloat(id + 0.25f).putFloat(-id.toFloat)
    b.array()
  }
}
