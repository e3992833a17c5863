package io.safetensors.spark.write

import java.io.File
import java.nio.file.Files

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.{JsonNode, ObjectMapper}
import org.apache.spark.sql.{DataFrame, Row}
import org.apache.spark.sql.types._
import io.safetensors.spark.{SafetensorsDataset, SafetensorsExtensions, SparkSuiteBase, Vacuum}

/**
 * Delete by key from a KV dataset through Spark (`SafetensorsDataset.deleteKeys`, spec/dataset.md
 * §5.11): the shards holding a key are rewritten without it, the others untouched, the tensor
 * index stays right, a vacuum with retention 0 leaves no byte of a deleted tensor; forced races;
 * bad input refused.
 */
class KeyDeleteSuite extends SparkSuiteBase {
  private val mapper = new ObjectMapper()

  override protected def appName: String = "safetensors-key-delete"

  override protected def sparkConf: Seq[(String, String)] = Seq(
    "spark.sql.extensions" -> classOf[SafetensorsExtensions].getName,
    "spark.sql.catalogImplementation" -> "in-memory")

  private val schema = StructType(Seq(StructField("name", StringType), StructField("x", ArrayType(FloatType))))

  /** Keys `k<i>` for i in `ids`: x = [i + 0.25, -i], in `parts` shards. */
  private def kv(ids: Seq[Int], parts: Int): DataFrame =
    spark.createDataFrame(spark.sparkContext.parallelize(ids.map(i => Row(s"k$i", Seq(i + 0.25f, -i.toFloat))),
      parts), schema)

  private def write(df: DataFrame, path: String, mode: String, opts: Map[String, String] = Map.empty): Unit =
    df.write.format("safetensors").option("name_col", "name").options(opts).mode(mode).save(path)

  private def manifest(path: String): JsonNode = mapper.readTree(new File(path, "dataset_manifest.json"))

  private def shardNames(path: String): Seq[String] =
    manifest(path).get("shards").elements().asScala.map(_.get("shard_path").asText()).toSeq

  /** Tensor name → its bytes, as a per-tensor read gives them. */
  private def tensors(path: String): Map[String, Seq[Byte]] =
    spark.read.format("safetensors").load(path).select("key", "data").collect()
      .map(r => r.getString(0) -> r.getAs[Array[Byte]](1).toSeq).toMap

  import DeleteSuite.{filesContaining, xBytes}

  /** The tensor keys of the index parts of the shards the manifest lists. */
  private def indexKeys(path: String): Seq[String] = {
    val parts = shardNames(path).map(s => new File(new File(path, "_tensor_index.parquet"),
      s.stripSuffix(".safetensors") + ".parquet"))
    parts.foreach(p => assert(p.isFile, s"$p: every listed shard has its index part"))
    spark.read.parquet(parts.map(_.getPath): _*).select("tensor_key").collect().map(_.getString(0)).toSeq.sorted
  }

  test("deleteKeys of an indexed KV dataset: only the shards holding the keys are rewritten, the index " +
    "is right, vacuum leaves no byte") {
    val path = freshPath()
    write(kv(0 until 12, parts = 3), path, "errorifexists", Map("generate_index" -> "true", "retention" -> "0"))
    val before = tensors(path)
    val shardsBefore = shardNames(path).toSet
    assert(shardsBefore.size == 3)
    assert(filesContaining(new File(path), xBytes(3)).nonEmpty)
    val out = SafetensorsDataset.deleteKeys(spark, path, Seq("k3", "k5", "k3", "nope"), "gdpr 1").collect()
    assert(out.length == 1, out.toSeq)
    assert(out.head.getLong(1) == 2, out.head)
    val left = (0 until 12).filterNot(Set(3, 5)).map(i => s"k${i}__x").sorted
    val after = tensors(path)
    assert(after.keys.toSeq.sorted == left)
    left.foreach(k => assert(after(k) == before(k), k))
    val m = manifest(path)
    assert(m.get("operation").asText() == "delete" && m.get("commit_message").asText() == "gdpr 1")
    assert(m.get("total_samples").asLong() == 10)
    // shards not holding k3/k5 are listed as before
    val replaced = out.head.getLong(2)
    assert((shardsBefore & shardNames(path).toSet).size == 3 - replaced)
    // the index: the listed shards' parts hold exactly the keys left, and a key lookup finds them
    assert(indexKeys(path) == left)
    assert(spark.read.format("safetensors").load(path).where("key IN ('k4__x', 'k3__x')").select("key")
      .collect().map(_.getString(0)).toSeq == Seq("k4__x"))
    val h = SafetensorsDataset.history(spark, path).collect().last
    assert(h.getAs[String]("operation") == "delete" && h.getAs[Long]("rows_removed") >= 2)
    Vacuum.vacuum(spark, path, "0", false, false).collect()
    assert(filesContaining(new File(path), xBytes(3)).isEmpty)
    assert(filesContaining(new File(path), xBytes(5)).isEmpty)
    assert(filesContaining(new File(path), xBytes(4)).nonEmpty)
    // keys it does not hold: nothing committed
    val v = m.get("manifest_version").asLong()
    assert(SafetensorsDataset.deleteKeys(spark, path, java.util.List.of("nope")).collect().isEmpty)
    assert(manifest(path).get("manifest_version").asLong() == v + 1, "only the vacuum's version")
  }

  test("deleteKeys through the index opens only the shard holding the key") {
    val path = freshPath()
    write(kv(0 until 12, parts = 3), path, "errorifexists", Map("generate_index" -> "true"))
    val holder = new File(new java.net.URI(spark.read.format("safetensors").load(path).where("key = 'k7__x'")
      .select("file").head().getString(0))).getName
    // every other shard garbled (same size): a delete that opened one (header scan, rewrite) would fail
    val others = shardNames(path).filterNot(_ == holder)
    assert(others.size == 2)
    others.foreach { s =>
      val f = new File(path, s)
      Files.write(f.toPath, Array.fill(f.length().toInt)(0x7f.toByte))
    }
    val out = SafetensorsDataset.deleteKeys(spark, path, Seq("k7")).collect()
    assert(out.map(r => (r.getLong(1), r.getLong(2))).toSeq == Seq((1L, 1L)), out.toSeq)
    val listed = shardNames(path)
    assert(!listed.contains(holder) && others.forall(listed.contains) && listed.size == 3, listed)
  }

  test("deleteKeys without an index, on a partitioned root, and a shard left without keys is dropped") {
    val path = freshPath()
    write(kv(0 until 6, parts = 2), path, "errorifexists")
    assert(Option(new File(path, "_tensor_index.parquet").list()).forall(_.isEmpty), "no index")
    val out = SafetensorsDataset.deleteKeys(spark, path, Seq("k0", "k1", "k2", "k4")).collect()
    assert(out.head.getLong(1) == 4)
    assert(tensors(path).keys.toSeq.sorted == Seq("k3__x", "k5__x"))
    // a partitioned root: one delete version in the directory holding the key
    val root = freshPath()
    kv(0 until 8, parts = 2).withColumn("split", org.apache.spark.sql.functions.expr(
      "if(name < 'k4', 'a', 'b')")).write.format("safetensors").option("name_col", "name")
      .partitionBy("split").save(root)
    val a = new File(root, "split=a").getPath
    val aVersion = manifest(a).get("manifest_version").asLong()
    val r = SafetensorsDataset.deleteKeys(spark, root, Seq("k6")).collect()
    assert(r.length == 1 && r.head.getLong(1) == 1)
    assert(manifest(a).get("manifest_version").asLong() == aVersion)
    assert(manifest(new File(root, "split=b").getPath).get("operation").asText() == "delete")
    assert(tensors(new File(root, "split=b").getPath).keys.toSeq.sorted == Seq("k4__x", "k5__x", "k7__x"))
  }

  test("forced races: an append during deleteKeys is kept, a delete of the same shard fails it") {
    val path = freshPath()
    write(kv(0 until 4, parts = 1), path, "errorifexists", Map("generate_index" -> "true"))
    Deletes.beforeCommit = () => { Deletes.beforeCommit = null; write(kv(50 until 52, parts = 1), path, "append") }
    try SafetensorsDataset.deleteKeys(spark, path, Seq("k1")).collect() finally Deletes.beforeCommit = null
    assert(tensors(path).keys.toSeq.sorted == Seq("k0__x", "k2__x", "k3__x", "k50__x", "k51__x"))
    assert(indexKeys(path) == Seq("k0__x", "k2__x", "k3__x", "k50__x", "k51__x"))
    val v = manifest(path).get("manifest_version").asLong()
    Deletes.beforeCommit = () => {
      Deletes.beforeCommit = null
      SafetensorsDataset.deleteKeys(spark, path, Seq("k2")).collect()
    }
    val e = try intercept[Exception](SafetensorsDataset.deleteKeys(spark, path, Seq("k0")).collect())
      finally Deletes.beforeCommit = null
    assert(messages(e).contains(s"version ${v + 1} (delete) removed it"), messages(e))
    assert(tensors(path).keys.toSeq.sorted == Seq("k0__x", "k3__x", "k50__x", "k51__x"))
  }

  test("bad deleteKeys are refused naming what is wrong; SQL DELETE on a KV dataset points to deleteKeys") {
    val path = freshPath()
    write(kv(0 until 2, parts = 1), path, "errorifexists")
    def refused(f: => Any): String = messages(intercept[IllegalArgumentException](f))
    assert(refused(SafetensorsDataset.deleteKeys(spark, path, Seq.empty[String])).contains("list of keys is empty"))
    assert(refused(SafetensorsDataset.deleteKeys(spark, path, Seq("k0", null))).contains("key 1 is null"))
    val raw = new java.util.ArrayList[Any](java.util.List.of("k0", Integer.valueOf(7)))
    val e = refused(SafetensorsDataset.deleteKeys(spark, path, raw.asInstanceOf[java.util.List[String]]))
    assert(e.contains("key 1 is '7' (java.lang.Integer)"), e)
    val batch = freshPath()
    spark.range(4).selectExpr("array(cast(id as float)) AS x").write.format("safetensors")
      .option("batch_size", "2").save(batch)
    assert(refused(SafetensorsDataset.deleteKeys(spark, batch, Seq("k0"))).contains("batch layout"))
    val plain = freshPath()
    new File(plain).mkdirs()
    assert(refused(SafetensorsDataset.deleteKeys(spark, plain, Seq("k0"))).contains("not a dataset"))
    assert(refused(SafetensorsDataset.deleteKeys(spark, plain + "-missing", Seq("k0"))).contains("does not exist"))
    val sql = messages(intercept[Exception](spark.sql(s"DELETE FROM safetensors.`$path` WHERE key = 'k0__x'")))
    assert(sql.contains("SafetensorsDataset.deleteKeys") && sql.contains("delete_keys"), sql)
    assert(tensors(path).keys.toSeq.sorted == Seq("k0__x", "k1__x"))
  }
}
