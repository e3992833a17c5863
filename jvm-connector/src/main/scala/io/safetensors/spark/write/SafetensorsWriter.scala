package io.safetensors.spark.write

import java.io.{File, IOException}
import java.nio.charset.StandardCharsets
import java.nio.file.Files

import scala.collection.mutable
import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.{JsonNode, ObjectMapper}
import com.fasterxml.jackson.databind.node.{ArrayNode, ObjectNode}
import io.safetensors.spark.jni.{NativeLib, NativeWriter, SafetensorsException}
import org.apache.hadoop.fs.{FileContext, FileSystem, LocalFileSystem, Options, Path}
import org.apache.spark.TaskContext
import org.apache.spark.sql.{DataFrame, SQLContext, SaveMode}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.safetensors.SparkInternals
import org.apache.spark.sql.sources.BaseRelation
import org.apache.spark.sql.types.StructType
import io.safetensors.spark.commit.{DatasetCommit, IndexParts, ObjectStoreCommit}
import io.safetensors.spark.files.{DatasetFiles, SerializableConf}

/** The driver side of a write: plan, mode, staging, job, commit (spec/jni.md, dataset.md). */
private[spark] object SafetensorsWriter {
  private val mapper = new ObjectMapper()

  /** What a write returns to Spark's V1 route: the written DataFrame's schema. */
  final class WrittenRelation(val sqlContext: SQLContext, val schema: StructType)
    extends BaseRelation

  /** The error of `SaveMode.ErrorIfExists` on an existing path (a dataset or a partitioned root). */
  def pathExists(dest: Path): IllegalArgumentException =
    new IllegalArgumentException(
      s"safetensors: path $dest already exists (SaveMode ErrorIfExists, the default); " +
        "use .mode(\"overwrite\"), .mode(\"append\") or .mode(\"ignore\")")

  /** One micro-batch of a streaming query ([[SafetensorsStreamSink]]): its commit records the
   *  batch in the manifest, and a batch the manifest already records changes nothing (§5.7). */
  final case class StreamBatch(queryId: String, batchId: Long)

  def write(sqlContext: SQLContext, mode: SaveMode, parameters: Map[String, String],
      data: DataFrame, stream: Option[StreamBatch] = None): BaseRelation = {
    val relation = new WrittenRelation(sqlContext, data.schema)
    // (1) exactly one path
    val path = parameters.collectFirst { case (k, v) if k.equalsIgnoreCase("path") => v }
    val extra = parameters.collectFirst { case (k, v) if k.equalsIgnoreCase("paths") => v }
      .filter(v => v.nonEmpty && v != "[]")
    if (path.forall(_.isEmpty) || extra.isDefined) {
      throw new IllegalArgumentException(
        "safetensors: exactly one output path is required (.save(path)); got path=" +
          path.getOrElse("<none>") + extra.map(e => s", paths=$e").getOrElse(""))
    }
    val root = new Path(path.get)
    // (2) Hadoop conf of this session + options; shipped to tasks
    val conf = SparkInternals.hadoopConf(sqlContext, parameters)
    // (3) plan: all validation before anything on disk changes
    NativeLib.ensureLoaded()
    val optionsJson = mapper.writeValueAsString(parameters.asJava)
    val planJson = NativeWriter.planWrite(data.schema.json, optionsJson,
      SparkInternals.caseSensitive(sqlContext))
    val fs = root.getFileSystem(conf)
    val dest = fs.makeQualified(root)
    // A local destination's directories, manifest and index go through java.nio: Hadoop's local
    // file system without its native library forks a `chmod` for every mkdirs and create and two
    // `readlink`s for every FileContext.rename (20-90 ms each, a third of a small write).
    val localDest: Option[File] = DatasetFiles.localFile(fs, dest)
    // On an object store tasks upload their shards to their final names (spec/dataset.md §5.6).
    val objectStore = localDest.isEmpty && ObjectStoreCommit.applies(fs)
    // (4) mode. The dataset's current manifest (if any) is validated now, before anything on
    // disk changes: a tampered one (e.g. a shard named ../x) fails the write here.
    val commits = new DatasetCommit(fs, dest, conf, localDest)
    val exists = fs.exists(dest)
    mode match {
      case SaveMode.ErrorIfExists if exists => throw pathExists(dest)
      case SaveMode.Ignore if exists =>
        return relation
      case _ =>
    }
    val current: Option[String] = if (exists) commits.latest().map(_._2) else None
    current.foreach(NativeWriter.checkManifest)
    // a replayed micro-batch (its query committed it already): no job, nothing changes
    if (stream.exists(b => NativeWriter.streamBatchCommitted(current.orNull, b.queryId, b.batchId))) {
      return relation
    }
    val append = mode == SaveMode.Append
    if (append) current match {
      case Some(m) => NativeWriter.checkAppend(planJson, m)
      case None if exists && DatasetFiles.listShards(fs, dest).nonEmpty =>
        throw new IllegalArgumentException(
          s"safetensors: cannot append to $dest: it holds .safetensors files but no ${DatasetFiles.ManifestName} " +
            "(not a dataset written by this connector)")
      case None =>
    }
    val createdRoot = !exists
    // (5) staging
    val writeId = mapper.readTree(planJson).get("write_id").asText()
    val staging = new Path(dest, s"_staging-$writeId")
    val promoted = mutable.ArrayBuffer[Path]()
    val localTemps = mutable.ArrayBuffer[File]()
    var committed = false
    try {
      localDest match {
        case Some(d) => Files.createDirectories(new File(d, staging.getName).toPath)
        case None => if (!fs.mkdirs(staging)) throw new IOException(s"safetensors: cannot create $staging")
      }
      // (6) the job
      val job = TaskJob(planJson, data.schema, staging.toString, new SerializableConf(conf),
        WriteMetrics(sqlContext.sparkContext))
      val rdd = SparkInternals.internalRows(data)
      val results: Array[TaskResult] = sqlContext.sparkContext.runJob(rdd,
        (ctx: TaskContext, it: Iterator[InternalRow]) => WriteTask.run(ctx, it, job))
      // (7) this write's manifest. Task reports hold O(shards): a KV shard reports its tensor
      // count, its index part (staged with it) lists the tensors (spec/dataset.md §6.1).
      val staged = mutable.Map[String, Path]()
      results.foreach(_.staged.foreach { case (f, p) => staged(f) = new Path(p) })
      val stagedParts = mutable.Map[String, Path]()
      results.foreach(_.indexParts.foreach { case (f, p) => stagedParts(f) = new Path(p) })
      val reports: Array[ObjectNode] = results.sortBy(_.partition)
        .map(r => mapper.readTree(DatasetFiles.readText(fs, new Path(r.reportFile))).asInstanceOf[ObjectNode])
      val parts = new IndexParts(fs, dest, planJson, localTemps, objectStore)
      val kv = mapper.readTree(planJson).path("layout").path("layout").asText() == "kv"
      val generateIndex = planGeneratesIndex(planJson)
      if (kv) {
        // KV keys across this write's shards: a streaming merge of their sorted index parts;
        // fail throws, lastWin rewrites the shards whose keys won elsewhere
        val runs = reports.toSeq.flatMap(_.path("shards").elements().asScala).map { s =>
          val f = s.get("file").asText()
          val part = stagedParts.getOrElse(f, throw new IllegalStateException(
            s"safetensors: internal error: shard $f has no index part"))
          (f, parts.local(part), false, s.get("partition").asLong(), s.get("shard").asLong())
        }
        parts.merge(runs).foreach { case (file, keys, _) =>
          // on an object store the task uploaded the shard under its final name, still unlisted:
          // the rewrite replaces that object with one PUT (a rename there would copy it)
          val out =
            if (objectStore) new Path(dest, file) else new Path(new Path(staging, "rewritten"), file)
          val partOut = new Path(new Path(staging, "rewritten"), parts.partName(file))
          val src = staged(file)
          val r = parts.rewrite(src, out, Some(partOut), keys)
          if (r.get("delete").asBoolean() || src != out) fs.delete(src, false)
          fs.delete(stagedParts(file), false)
          if (r.get("delete").asBoolean()) {
            staged.remove(file)
            stagedParts.remove(file)
          } else {
            staged(file) = out
            stagedParts(file) = partOut
          }
          reports.filter(_.has("shards")).foreach { rep =>
            val shards = rep.get("shards").asInstanceOf[ArrayNode]
            (0 until shards.size()).find(i => shards.get(i).get("file").asText() == file).foreach { i =>
              if (r.get("delete").asBoolean()) shards.remove(i)
              else shards.get(i).asInstanceOf[ObjectNode].put("samples", r.get("samples").asLong())
                .put("bytes", r.get("bytes").asLong()).put("num_tensors", r.get("num_tensors").asLong())
            }
          }
        }
      }
      val finalReports = arrayJson(reports.toSeq)
      val commit = mapper.readTree(NativeWriter.commitJob(planJson, finalReports))
      if (commit.get("rewrites").size() != 0) {
        throw new IllegalStateException("safetensors: internal error: the job commit asks for shard rewrites")
      }
      val writeManifest = mapper.writeValueAsString(commit.get("manifest"))
      // promote staged shards (every staged shard is one of this write's manifest's), and with
      // generate_index their parts (an unlisted part is never read through a manifest)
      val listed = commit.get("manifest").get("shards").elements().asScala
        .map(_.get("shard_path").asText()).toSet
      staged.foreach { case (file, src) =>
        if (!listed(file)) {
          throw new IllegalStateException(s"safetensors: staged shard $file is not in the manifest")
        }
        val target = new Path(dest, file)
        // on an object store the task placed it under its final name already
        if (src != target && !fs.rename(src, target)) {
          throw new IOException(s"safetensors: cannot rename $src to $target")
        }
        promoted += target
        stagedParts.get(file).foreach { part =>
          if (generateIndex) {
            val placed = parts.publish(file, part)
            promoted += placed
            stagedParts(file) = placed
          }
        }
      }
      // (8) the commit: the next manifest version on top of the latest one, retried on top of a
      // newer one when another writer committed first (spec/dataset.md §5.3)
      var base: Option[(Long, String)] = None
      var next: JsonNode = null
      var attempts = 0
      val kvAppend = append && kv
      // shards of the dataset known to hold none of this write's keys (their content never changes)
      val keysClean = mutable.Set[String]()
      // lastWin across writes: this attempt's rewritten copies of older shards (and their parts)
      var rewritten = Seq.empty[Path]
      var replacements = mapper.createArrayNode()
      var replayed = false
      while (!committed && !replayed) {
        if (attempts == MaxCommitAttempts) {
          throw new IOException(s"safetensors: could not commit to $dest: $attempts attempts " +
            "each found a newer manifest version committed by another writer")
        }
        attempts += 1
        base = commits.latest()
        // a previous attempt's rewrites were made against another base: start over
        rewritten.foreach { p => fs.delete(p, false); promoted -= p }
        rewritten = Seq.empty
        replacements = mapper.createArrayNode()
        // the stream's record is checked on the very manifest this attempt builds on, so the
        // check and the listing of the batch's shards are one atomic version (§5.7)
        replayed = stream.exists(b => NativeWriter.streamBatchCommitted(base.map(_._2).orNull,
          b.queryId, b.batchId))
        if (kvAppend && !replayed) {
          // KV keys hold across the whole dataset: this write's against every listed shard
          // (dataset.md §3), by merging index parts (an existing shard without one gets a
          // temporary part from its header); fail throws, lastWin names the older shards that
          // lose keys
          val unchecked = base.toSeq.flatMap { case (_, text) =>
            mapper.readTree(text).path("shards").elements().asScala.map(_.get("shard_path").asText())
          }.filterNot(keysClean)
          if (unchecked.nonEmpty && stagedParts.nonEmpty) {
            val runs = unchecked.map(f => (f, parts.existingPart(f), true, 0L, 0L)) ++
              reports.toSeq.flatMap(_.path("shards").elements().asScala).map { s =>
                val f = s.get("file").asText()
                (f, parts.local(stagedParts.getOrElse(f, new Path(new Path(staging, "rewritten"), parts.partName(f)))),
                  false, s.get("partition").asLong(), s.get("shard").asLong())
              }
            val losers = parts.merge(runs)
            val hit = losers.map(_._1).toSet
            keysClean ++= unchecked.filterNot(hit)
            val copyId = java.util.UUID.randomUUID().toString
            losers.foreach { case (old, keys, _) =>
              val entry = replacements.addObject().put("old", old)
              val newName = old.replaceFirst("^(part-[0-9]{5,}-[0-9]{4,})-.*$", "$1-" + copyId + ".safetensors")
              val target = new Path(dest, newName)
              val partTarget = if (generateIndex) Some(parts.partPath(newName)) else None
              val r = parts.rewrite(new Path(dest, old), target, partTarget, keys)
              if (r.get("delete").asBoolean()) entry.putNull("new")
              else {
                promoted += target
                rewritten :+= target
                partTarget.foreach { p => promoted += p; rewritten :+= p }
                entry.putObject("new").put("shard_path", newName)
                  .put("samples_count", r.get("samples").asLong())
                  .put("bytes", r.get("bytes").asLong())
                  .put("partition", parsePartition(old))
                  .put("padded_samples", 0)
                  .put("num_tensors", r.get("num_tensors").asLong())
              }
            }
          }
        }
        if (!replayed) {
          val replacementsJson =
            if (replacements.isEmpty) null else mapper.writeValueAsString(replacements)
          next = mapper.readTree(stream match {
            case Some(b) => NativeWriter.nextStreamManifest(base.map(_._2).orNull, writeManifest,
              replacementsJson, b.queryId, b.batchId)
            case None => NativeWriter.nextManifest(base.map(_._2).orNull, writeManifest, append,
              replacementsJson)
          })
          Option(DatasetCommit.beforeCreate).foreach(_(next.get("version").asLong()))
          committed = commits.tryCommit(next.get("version").asLong(), base.map(_._1).getOrElse(0L),
            next.get("manifest").asText(), writeId)
        }
      }
      if (replayed) {
        // another run of this query committed the batch since the check before the job: this
        // run's shards go, the dataset is left as that commit made it
        promoted.foreach(p => quietly(null)(fs.delete(p, false)))
        return relation
      }
      val version = next.get("version").asLong()
      // after the commit: the version exists in the log; readers of dataset_manifest.json see it
      // once it is published (spec/dataset.md §5.3 step 4)
      try commits.publish(version, next.get("manifest").asText(), writeId)
      catch {
        case e: Exception =>
          throw new IOException(s"safetensors: the write to $dest was committed as manifest " +
            s"version $version (${DatasetCommit.LogDir}/${DatasetCommit.logName(version)}), but " +
            s"replacing ${DatasetFiles.ManifestName} failed: ${e.getMessage}. Readers of " +
            s"${DatasetFiles.ManifestName} see the previous version until the next write to this " +
            "path publishes a newer one, which includes this write's rows: do not run this write " +
            "again (spec/dataset.md §5.3)", e)
      }
      if (objectStore) {
        // uploads of attempts that did not commit (a task that failed after its upload)
        ObjectStoreCommit.removeUnlisted(fs, dest, writeId, listed, null)
      }
      val nowListed = mapper.readTree(next.get("manifest").asText()).path("shards").elements().asScala
        .map(_.get("shard_path").asText()).toSeq
      val superseded = next.get("superseded").elements().asScala.map(_.asText()).toSeq
      if (generateIndex) {
        // earlier shards without a part (an append that creates the first index) get one
        parts.completeIndex(nowListed)
        parts.remove(superseded)
      } else {
        // no index: no listed shard keeps a part (a partial index is never published)
        parts.remove(nowListed ++ superseded)
      }
      superseded.foreach { f =>
        quietly(null)(fs.delete(new Path(dest, f), false))
      }
      commits.prune(version)
      // this write's shards as listed (a KV lastWin copy of an older shard is not counted)
      val mine = commit.get("manifest").get("shards").elements().asScala.toSeq
      WriteStats.report(WriteStats(mine.map(_.path("samples_count").asLong()).sum, mine.size.toLong,
        mine.map(_.path("bytes").asLong()).sum, job.metrics.writeNanos.value))
      relation
    } catch {
      case t: Throwable if !committed =>
        // the dataset is untouched: remove everything this write added
        promoted.foreach(p => quietly(t)(fs.delete(p, false)))
        if (objectStore) ObjectStoreCommit.removeUnlisted(fs, dest, writeId, Set.empty, t)
        quietly(t)(fs.delete(staging, true))
        if (createdRoot) quietly(t) {
          if (fs.exists(dest) && fs.listStatus(dest).isEmpty) fs.delete(dest, false)
        }
        throw t
    } finally {
      quietly(null)(fs.delete(staging, true))
      // recursive: a rewrite's temp dir is registered before the files inside it
      localTemps.foreach(LocalWorkDir.deleteTree)
    }
  }

  /** The partition in a shard name of this connector (0 for another name). */
  private def parsePartition(file: String): Long =
    "^part-([0-9]{5,})-".r.findFirstMatchIn(file).map(_.group(1).toLong).getOrElse(0L)

  /** How many times a commit is retried on top of newer versions before the write fails. */
  private val MaxCommitAttempts = 100

  private def quietly(t: Throwable)(f: => Any): Unit =
    try f catch { case e: Throwable => if (t != null) t.addSuppressed(e) }

  private def planGeneratesIndex(planJson: String): Boolean =
    mapper.readTree(planJson).path("generate_index").asBoolean(false)

  private def arrayJson(nodes: Seq[JsonNode]): String = {
    val a = mapper.createArrayNode()
    nodes.foreach(a.add)
    mapper.writeValueAsString(a)
  }
}
