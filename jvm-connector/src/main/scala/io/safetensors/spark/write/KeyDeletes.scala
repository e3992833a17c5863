package io.safetensors.spark.write

import io.safetensors.spark.internal.{Json, SerializableConf}

import scala.jdk.CollectionConverters._

import io.safetensors.spark.Compaction
import io.safetensors.spark.commit.DatasetCommit
import io.safetensors.spark.files.{DatasetFiles, HivePartitions, ShardHeaders}
import io.safetensors.spark.jni.{NativeCompaction, NativeLib}
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.{DataFrame, Row, SparkSession}
import org.apache.spark.sql.functions.col
import org.apache.spark.sql.safetensors.SparkInternals

/**
 * Delete by key from a KV dataset (spec/dataset.md §5.11) through Spark, on any Hadoop file
 * system. The rules are the dataset crate's (`delete::kv_tensor_names`,
 * `delete::plan_delete_keys_in`); here only the candidate shards are found, without reading
 * every header on the driver:
 *  - with a tensor index, a per-tensor read of the version with the pushed filter `key IN
 *    (<key><sep><column>, …)`: the driver reads the index parts' footers and matching row groups,
 *    tasks go to the shards with matching rows only;
 *  - without one, a job whose tasks read the listed shards' headers and keep those naming a
 *    tensor of the keys (the driver reads none; a per-tensor read would plan from every header
 *    on the driver).
 * The candidates' headers (read in tasks) go to the plan, which rewrites those holding a key;
 * the rewrite and commit are the compaction's ([[Compaction.runPlan]], index parts included).
 */
object KeyDeletes {
  private val mapper = Json.mapper

  /** [[io.safetensors.spark.SafetensorsDataset.deleteKeys]]: one result row per dataset
   *  directory holding a key (the columns of [[Deletes.ResultSchema]]). */
  def deleteKeys(spark: SparkSession, path: String, keys: Seq[String], commitMessage: Option[String]): DataFrame = {
    NativeLib.ensureLoaded()
    if (path == null) throw new IllegalArgumentException("safetensors: deleteKeys: the path is null")
    if (keys == null || keys.isEmpty) {
      throw new IllegalArgumentException("safetensors: deleteKeys: the list of keys is empty; give at " +
        "least one key")
    }
    // a java.util.List from py4j or Java may hold anything: checked as values, not by the type
    keys.asInstanceOf[Seq[Any]].zipWithIndex.foreach {
      case (_: String, _) =>
      case (other, i) => throw new IllegalArgumentException(s"safetensors: deleteKeys: key $i is " +
        s"${if (other == null) "null" else s"'$other' (${other.getClass.getName})"}; keys are strings")
    }
    val conf = SparkInternals.hadoopConf(spark, Map.empty[String, String])
    val given = new Path(path)
    val fs = given.getFileSystem(conf)
    val root = fs.makeQualified(given)
    if (!fs.exists(root)) throw new IllegalArgumentException(s"safetensors: deleteKeys: path does not exist: $root")
    // a dataset, or a partitionBy root whose directories are datasets
    val dirs = if (fs.exists(new Path(root, DatasetFiles.ManifestName))) Seq(root)
      else HivePartitions.discover(fs, root).map(_.map(_.path)).getOrElse(throw new IllegalArgumentException(
        s"safetensors: deleteKeys: $root has no ${DatasetFiles.ManifestName} and no partition " +
          "directories: not a dataset"))
    val distinct = keys.distinct
    // every directory is checked (KV layout, ours) before any is changed
    val bases = dirs.map { d =>
      val commits = new DatasetCommit(fs, d, conf, DatasetFiles.localFile(fs, d))
      val (version, text) = Deletes.latest(commits, d)
      val names = try mapper.readTree(NativeCompaction.deleteKeyTensors(text,
        mapper.writeValueAsString(distinct.asJava))).elements().asScala.map(_.asText()).toSeq
      catch { case e: Exception => throw new IllegalArgumentException(s"safetensors: deleteKeys: $d: " +
        e.getMessage, e) }
      (d, version, text, names)
    }
    val rows = bases.flatMap { case (d, version, text, names) =>
      val candidates = candidateShards(spark, fs, d, version, text, names, conf)
      if (candidates.isEmpty) None
      else {
        val request = mapper.createObjectNode()
        val ks = request.putArray("keys")
        distinct.foreach(ks.add)
        val hs = request.putObject("headers")
        candidates.foreach { case (name, (header, length)) =>
          hs.putObject(name).put("header", header).put("length", length)
        }
        Some(Deletes.run(spark, d, request, commitMessage, Some(text)))
      }
    }
    spark.createDataFrame(rows.asJava, Deletes.ResultSchema)
  }

  /** The shards of version `version` of `dir` that hold a tensor of `names`, with their headers
   *  (as stored, and the file's length). */
  private def candidateShards(spark: SparkSession, fs: org.apache.hadoop.fs.FileSystem, dir: Path,
      version: Long, text: String, names: Seq[String],
      conf: org.apache.hadoop.conf.Configuration): Seq[(String, (String, Long))] = {
    val listed = Json.topLevelArrayStrings(text, "shards", "shard_path")
    if (listed.isEmpty) Seq.empty
    else if (Compaction.hasIndex(fs, dir, text)) {
      // the index answers on the driver (footers, matching row groups); tasks only for the
      // shards with matching rows; then those shards' headers
      val found = spark.read.format("safetensors").option("layout", "tensor")
        .option("versionAsOf", version.toString).load(dir.toString).select("file", "key")
        .where(col("key").isin(names: _*)).select("file").distinct().collect()
        .map(r => new Path(r.getString(0)).getName).toSeq.distinct.sorted
      headers(spark, dir, found, conf, None)
    } else headers(spark, dir, listed, conf, Some(names.toSet))
  }

  /** The headers (as stored, with the file's length) of `shards` of `dir`, read in tasks; with
   *  `wanted`, only those of shards holding a tensor of that name (the driver reads none). */
  private def headers(spark: SparkSession, dir: Path, shards: Seq[String],
      conf: org.apache.hadoop.conf.Configuration, wanted: Option[Set[String]]): Seq[(String, (String, Long))] = {
    if (shards.isEmpty) return Seq.empty
    val sconf = new SerializableConf(conf)
    val wantedJson = wanted.map(w => Json.mapper.writeValueAsString(w.toArray))
    val d = dir.toString
    val slices = math.max(1, math.min(shards.size, spark.sparkContext.defaultParallelism))
    spark.sparkContext.parallelize(shards, slices).flatMap { name =>
      NativeLib.ensureLoaded()
      val p = new Path(new Path(d), name)
      val (text, length) = ShardHeaders.raw(p.getFileSystem(sconf.value), p)
      // which tensors a header names is the format's rule (Rust); the plan validates it again
      val holds = wantedJson.forall(w => NativeCompaction.headerHoldsAny(text, length, w))
      if (holds) Some(name -> (text, length)) else None
    }.collect().toSeq.sortBy(_._1)
  }

  def deleteKeys(spark: SparkSession, path: String, keys: java.util.List[String],
      commitMessage: String): DataFrame =
    deleteKeys(spark, path, if (keys == null) null else keys.asScala.toSeq, Option(commitMessage))
}
