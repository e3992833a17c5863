package io.safetensors.spark.write

import io.safetensors.spark.internal.Json
import java.io.{File, IOException}
import java.nio.file.Files

import scala.collection.mutable
import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.JsonNode
import com.fasterxml.jackson.databind.node.{ArrayNode, ObjectNode}
import io.safetensors.spark.commit.{CommitAnswer, DatasetCommit, IndexParts, ObjectStoreCommit}
import io.safetensors.spark.files.DatasetFiles
import io.safetensors.spark.internal.{ConnectorOptions, SerializableConf}
import io.safetensors.spark.jni.{NativeLib, NativeLog, NativeNames, NativeReader, NativeWriter}
import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FileSystem, Path}
import org.apache.spark.TaskContext
import org.apache.spark.sql.{DataFrame, SQLContext, SaveMode}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.safetensors.SparkInternals
import org.apache.spark.sql.sources.BaseRelation
import org.apache.spark.sql.types.StructType

/**
 * The driver side of a write (spec/jni.md, dataset.md), in steps: [[outputPath]] and
 * [[planWrite]] (all validation before anything on disk changes), [[start]] (the SaveMode against
 * the dataset's current manifest), then a [[DriverWrite]]: staging, the tasks, their reports, the
 * job commit, promotion of the staged files, the manifest commit and its publication.
 */
private[spark] object SafetensorsWriter {
  private val mapper = Json.mapper

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
    val root = outputPath(parameters)
    // Hadoop conf of this session + options; shipped to tasks
    val conf = SparkInternals.hadoopConf(sqlContext, parameters)
    val target = new Target(root, conf)
    // an append plans on top of the dataset's latest manifest: its settings fill the options
    // left out, and the plan must fit it; any other write is planned from its options alone
    val base = if (mode == SaveMode.Append) appendBase(target) else None
    val planJson = planWrite(sqlContext, keepIndex(target, parameters, base.map(_.text)),
      data.schema, base)
    start(target, mode, base.map(b => (b.version, b.text)), stream).foreach { s =>
      new DriverWrite(sqlContext, data, planJson, target, s, stream,
        ConnectorOptions.get(parameters, "commit_message")).run()
    }
    relation
  }

  /** Step 1: exactly one output path. */
  private def outputPath(parameters: Map[String, String]): Path = {
    val path = ConnectorOptions.path(parameters)
    val extra = ConnectorOptions.get(parameters, "paths")
      .filter(v => v.nonEmpty && v != "[]")
    if (path.forall(_.isEmpty) || extra.isDefined) {
      throw new IllegalArgumentException(
        "safetensors: exactly one output path is required (.save(path)); got path=" +
          path.getOrElse("<none>") + extra.map(e => s", paths=$e").getOrElse(""))
    }
    new Path(path.get)
  }

  /**
   * Step 2: the write plan (Rust; every option and column checked). An append to an existing
   * dataset passes its latest manifest (`base`), validated there (a tampered one, e.g. a shard
   * named ../x, fails the write here, naming the file it was read from): the plan takes the
   * dataset's settings for the options left out and is checked against the dataset
   * (spec/dataset.md §5.2).
   */
  private def planWrite(sqlContext: SQLContext, parameters: Map[String, String],
      schema: StructType, base: Option[Base]): String = {
    NativeLib.ensureLoaded()
    NativeWriter.planWrite(schema.json, mapper.writeValueAsString(parameters.asJava),
      SparkInternals.caseSensitive(sqlContext), base.map(_.text).orNull,
      base.map(_.source.toString).orNull)
  }

  /**
   * Steps 1 and 2 alone, for a write of rows of `schema` that runs later ([[PartitionedWriter]]
   * checks every directory's plan before it writes the first): throws what [[write]] would throw
   * for its options and columns. Changes nothing on disk.
   */
  def checkPlan(sqlContext: SQLContext, mode: SaveMode, parameters: Map[String, String],
      schema: StructType): Unit = {
    val target = new Target(outputPath(parameters), SparkInternals.hadoopConf(sqlContext, parameters))
    val base = if (mode == SaveMode.Append) appendBase(target) else None
    planWrite(sqlContext, keepIndex(target, parameters, base.map(_.text)), schema, base)
  }

  /**
   * An append keeps the dataset's index: with `generate_index` left out, an append to a dataset
   * whose `_tensor_index.parquet` holds parts of shards its latest manifest lists indexes its new
   * shards too (the manifest does not record the option; the index on disk does). Parts of
   * shards only older versions list (kept for them until a vacuum) do not count.
   * `generate_index=false` drops the index (spec/dataset.md §5.2).
   */
  private def keepIndex(target: Target, parameters: Map[String, String],
      base: Option[String]): Map[String, String] = {
    val dir = new Path(target.dest, DatasetFiles.IndexDir)
    // a linked index directory is refused before anything changes (spec/dataset.md §5.9)
    def hasParts = DatasetFiles.ownDir(target.fs, target.dest, DatasetFiles.IndexDir).isDefined && {
      val names = target.fs.listStatus(dir).filter(_.isFile).map(_.getPath.getName).toSet
      // (an index of the earlier one-part-per-version layout counts too)
      names.exists(n => DatasetCommit.parseIndexPartName(n).isDefined) ||
        base.exists(m => listedShards(m).exists(s => names(NativeReader.indexPartName(s))))
    }
    if (base.isEmpty || ConnectorOptions.get(parameters, "generate_index").isDefined || !hasParts) parameters
    else parameters + ("generate_index" -> "true")
  }

  /** The shard names of a manifest not validated yet: none when it is not JSON (its plan fails
   *  next, naming the file). */
  private def listedShards(text: String): Seq[String] =
    try Json.topLevelArrayStrings(text, "shards", "shard_path")
    catch { case _: com.fasterxml.jackson.core.JsonProcessingException => Seq.empty }

  /** The latest manifest of a dataset an append goes on top of: its version, its text and the
   *  file that was read from (validated by the append's plan, [[planWrite]]). */
  private final case class Base(version: Long, text: String, source: Path)

  /**
   * The latest manifest an append goes on top of, when the path holds a dataset. A directory
   * with shards but no manifest is not a dataset of this connector: an append to it fails.
   */
  private def appendBase(target: Target): Option[Base] = {
    import target.{dest, fs}
    if (!fs.exists(dest)) return None
    target.commits.latestWithSource() match {
      case Some((v, m, source)) => Some(Base(v, m, source))
      case None if DatasetFiles.listShards(fs, dest).nonEmpty =>
        throw new IllegalArgumentException(
          s"safetensors: cannot append to $dest: it holds ${DatasetFiles.Extension} files but no " +
            s"${DatasetFiles.ManifestName} (not a dataset written by this connector)")
      case None => None
    }
  }

  /** Where a write goes: the qualified destination on its file system, and how it commits there. */
  private final class Target(root: Path, val conf: Configuration) {
    val fs: FileSystem = root.getFileSystem(conf)
    val dest: Path = fs.makeQualified(root)
    // A local destination's directories, manifest and index go through java.nio: Hadoop's local
    // file system without its native library forks a `chmod` for every mkdirs and create and two
    // `readlink`s for every FileContext.rename (20-90 ms each, a third of a small write).
    val localDest: Option[File] = DatasetFiles.localFile(fs, dest)
    // On an object store tasks upload their shards to their final names (spec/dataset.md §5.6).
    val objectStore: Boolean = localDest.isEmpty && ObjectStoreCommit.applies(fs)
    val commits = new DatasetCommit(fs, dest, conf, localDest)
  }

  /** What a write that goes ahead starts from; `read`: the latest manifest (version, text) as
   *  read before the job, which its first commit attempt builds on while no version came after. */
  private final case class Start(createdRoot: Boolean, append: Boolean, read: Option[(Long, String)])

  /**
   * Step 3, the mode: None when nothing is to be written (`ignore` on an existing path, or a
   * micro-batch the manifest records already). The dataset's current manifest (if any) is
   * validated now, before anything on disk changes: a tampered one (e.g. a shard named ../x)
   * fails the write here. An append's manifest (`base`) was read before its plan, which validated it.
   */
  private def start(target: Target, mode: SaveMode, base: Option[(Long, String)],
      stream: Option[StreamBatch]): Option[Start] = {
    import target.{dest, fs}
    val exists = fs.exists(dest)
    mode match {
      case SaveMode.ErrorIfExists if exists => throw pathExists(dest)
      case SaveMode.Ignore if exists => return None
      case _ =>
    }
    val append = mode == SaveMode.Append
    val current: Option[(Long, String)] =
      if (append) base
      else if (exists) {
        val latest = target.commits.latestWithSource()
        // named as the file it came from: a damaged log entry is not dataset_manifest.json's fault
        latest.foreach { case (_, text, source) => NativeWriter.checkManifest(text, source.toString) }
        latest.map { case (v, text, _) => (v, text) }
      } else None
    // a replayed micro-batch (its query committed it already): no job, nothing changes
    if (stream.exists(b => NativeWriter.streamBatchCommitted(current.map(_._2).orNull, b.queryId,
        b.batchId))) {
      return None
    }
    Some(Start(createdRoot = !exists, append, current))
  }

  /**
   * What the tasks left, by shard name: staged shards and index parts (staged with them,
   * spec/dataset.md §6.1), and the task reports in partition order (edited by KV rewrites). Task
   * reports hold O(shards): a KV shard reports its tensor count, its index part lists the tensors.
   */
  private final class Staged(val shards: mutable.Map[String, Path],
      val parts: mutable.Map[String, Path], val reports: Array[ObjectNode]) {
    /** The shard entries of all reports. */
    def shardReports: Seq[JsonNode] = reports.toSeq.flatMap(_.path("shards").elements().asScala)
  }

  /** This write's manifest, as the job commit (`NativeWriter.commitJob`) made it. */
  private final class JobManifest(val manifest: JsonNode) {
    val json: String = mapper.writeValueAsString(manifest)
    val listed: Set[String] =
      manifest.get("shards").elements().asScala.map(_.get("shard_path").asText()).toSet
  }

  /**
   * One write that goes ahead, from staging to publication. Everything it adds to the dataset
   * directory is removed again if it fails before its manifest commit.
   */
  private final class DriverWrite(sqlContext: SQLContext, data: DataFrame, planJson: String,
      target: Target, start: Start, stream: Option[StreamBatch], commitMessage: Option[String]) {
    import target.{dest, fs}
    private val plan = mapper.readTree(planJson)
    private val writeId = plan.get("write_id").asText()
    private val staging = new Path(dest, s"_staging-$writeId")
    private val rewrittenDir = new Path(staging, "rewritten")
    private val kv = plan.path("layout").path("layout").asText() == "kv"
    private val generateIndex = plan.path("generate_index").asBoolean(false)
    /** Files placed in the dataset directory (removed again if the write fails). */
    private val promoted = mutable.ArrayBuffer[Path]()
    private val localTemps = mutable.ArrayBuffer[File]()
    private val parts = new IndexParts(fs, dest, planJson, localTemps, target.objectStore)
    private var committed = false
    /** KV appends: shards of the dataset known to hold none of this write's keys (their content
     *  never changes), and this commit attempt's rewritten copies of older shards (and parts). */
    private val keysClean = mutable.Set[String]()
    private var rewritten = Seq.empty[Path]

    def run(): Unit =
      try {
        createStaging()
        val job = TaskJob(planJson, data.schema, staging.toString, new SerializableConf(target.conf),
          WriteMetrics(sqlContext.sparkContext))
        val staged = collectReports(runTasks(sqlContext, data, job))
        if (kv) resolveKeysWithinWrite(staged)
        val mine = commitJob(staged)
        promote(staged, mine)
        commitManifest(staged, mine) match {
          case Some(next) =>
            publish(next)
            cleanUp(next, mine)
            report(mine, job)
          case None =>
            // another run of this query committed the batch since the check before the job:
            // this run's shards go, the dataset is left as that commit made it
            promoted.foreach(p => quietly(null)(fs.delete(p, false)))
        }
      } catch {
        case t: Throwable if !committed =>
          rollBack(t)
          throw t
      } finally {
        quietly(null)(fs.delete(staging, true))
        // recursive: a rewrite's temp dir is registered before the files inside it
        localTemps.foreach(LocalWorkDir.deleteTree)
      }

    private def createStaging(): Unit = target.localDest match {
      case Some(d) => Files.createDirectories(new File(d, staging.getName).toPath)
      case None => if (!fs.mkdirs(staging)) throw new IOException(s"safetensors: cannot create $staging")
    }

    /** The tasks' reports read back, and their staged files. */
    private def collectReports(results: Array[TaskResult]): Staged = {
      val shards = mutable.Map[String, Path]()
      results.foreach(_.staged.foreach { case (f, p) => shards(f) = new Path(p) })
      val stagedParts = mutable.Map[String, Path]()
      results.foreach(_.indexParts.foreach { case (f, p) => stagedParts(f) = new Path(p) })
      val reports: Array[ObjectNode] = results.sortBy(_.partition).map(r =>
        mapper.readTree(DatasetFiles.readText(fs, new Path(r.reportFile))).asInstanceOf[ObjectNode])
      new Staged(shards, stagedParts, reports)
    }

    /**
     * KV keys across this write's shards: a streaming merge of their sorted index parts; `fail`
     * throws, `lastWin` rewrites the shards whose keys won elsewhere.
     */
    private def resolveKeysWithinWrite(staged: Staged): Unit = {
      val runs = staged.shardReports.map { s =>
        val f = s.get("file").asText()
        val part = staged.parts.getOrElse(f, throw new IllegalStateException(
          s"safetensors: internal error: shard $f has no index part"))
        (f, parts.local(part), false, s.get("partition").asLong(), s.get("shard").asLong())
      }
      parts.merge(runs).foreach { case (file, keys, _) => rewriteStaged(staged, file, keys) }
    }

    /** Rewrites this write's shard `file` without the keys in `keys` (a local keys file). */
    private def rewriteStaged(staged: Staged, file: String, keys: String): Unit = {
      // on an object store the task uploaded the shard under its final name, still unlisted:
      // the rewrite replaces that object with one PUT (a rename there would copy it)
      val out = if (target.objectStore) new Path(dest, file) else new Path(rewrittenDir, file)
      val partOut = new Path(rewrittenDir, parts.partName(file))
      val src = staged.shards(file)
      val r = parts.rewrite(src, out, Some(partOut), keys)
      val delete = r.get("delete").asBoolean()
      if (delete || src != out) fs.delete(src, false)
      fs.delete(staged.parts(file), false)
      if (delete) {
        staged.shards.remove(file)
        staged.parts.remove(file)
      } else {
        staged.shards(file) = out
        staged.parts(file) = partOut
      }
      staged.reports.filter(_.has("shards")).foreach { rep =>
        val shards = rep.get("shards").asInstanceOf[ArrayNode]
        (0 until shards.size()).find(i => shards.get(i).get("file").asText() == file).foreach { i =>
          if (delete) shards.remove(i)
          else shards.get(i).asInstanceOf[ObjectNode].put("samples", r.get("samples").asLong())
            .put("bytes", r.get("bytes").asLong()).put("num_tensors", r.get("num_tensors").asLong())
            .put("crc32c", r.get("crc32c").asText())
        }
      }
    }

    /** The job commit: this write's manifest from the (final) task reports. */
    private def commitJob(staged: Staged): JobManifest = {
      val commit = mapper.readTree(NativeWriter.commitJob(planJson, arrayJson(staged.reports.toSeq)))
      if (commit.get("rewrites").size() != 0) {
        throw new IllegalStateException("safetensors: internal error: the job commit asks for shard rewrites")
      }
      new JobManifest(commit.get("manifest"))
    }

    /**
     * Moves the staged shards to their names in the dataset (every staged shard is one of this
     * write's manifest's), and with generate_index their parts (an unlisted part is never read
     * through a manifest).
     */
    private def promote(staged: Staged, mine: JobManifest): Unit =
      staged.shards.foreach { case (file, src) =>
        if (!mine.listed(file)) {
          throw new IllegalStateException(s"safetensors: staged shard $file is not in the manifest")
        }
        val placed = new Path(dest, file)
        // on an object store the task placed it under its final name already
        if (src != placed && !fs.rename(src, placed)) {
          throw new IOException(s"safetensors: cannot rename $src to $placed")
        }
        promoted += placed
        staged.parts.get(file).foreach { part =>
          if (generateIndex) {
            val placedPart = parts.publish(file, part)
            promoted += placedPart
            staged.parts(file) = placedPart
          }
        }
      }

    /**
     * The commit: the next manifest version on top of the latest one, retried on top of a newer
     * one when another writer committed first (spec/dataset.md §5.3). Its answer (version,
     * entry, superseded, the manifest), or None when the stream's batch turned out committed
     * already.
     */
    private def commitManifest(staged: Staged, mine: JobManifest): Option[CommitAnswer] = {
      var attempts = 0
      while (true) {
        if (attempts == DatasetCommit.MaxCommitAttempts) {
          throw new IOException(s"safetensors: could not commit to $dest: $attempts attempts " +
            "each found a newer manifest version committed by another writer")
        }
        attempts += 1
        // a batch append builds on the newest version's own log entry (its head): the critical
        // section costs the write, not the dataset's shards (spec/dataset.md §5.10)
        val attempt = if (start.append && !kv) onHead(attempts == 1, mine) else None
        val next: CommitAnswer = attempt match {
          case Some(Some(a)) => a
          case Some(None) => return None // the base records the stream's batch: a replay
          case None =>
            // the first attempt builds on the manifest read before the job while no version
            // came after it (one probe, not a second read and scan of a manifest of tens of MB)
            val base =
              if (attempts == 1) target.commits.latestAfter(start.read) else target.commits.latest()
            // a previous attempt's rewrites were made against another base: start over
            rewritten.foreach { p => fs.delete(p, false); promoted -= p }
            rewritten = Seq.empty
            // the stream's record is checked on the very manifest this attempt builds on, so the
            // check and the listing of the batch's shards are one atomic version (§5.7)
            if (stream.exists(b => NativeWriter.streamBatchCommitted(base.map(_._2).orNull,
                b.queryId, b.batchId))) {
              return None
            }
            val replacements =
              if (start.append && kv) resolveKeysAcrossDataset(staged, base) else mapper.createArrayNode()
            nextManifest(base, mine, replacements)
        }
        Option(DatasetCommit.beforeCreate).foreach(_(next.version))
        committed = target.commits.tryCommit(next.version, next.baseVersion, next.manifest,
          next.entry, writeId, next.baseEntry)
        if (committed) return Some(next)
        triedOn = Some(next.baseVersion)
      }
      throw new IllegalStateException("unreachable")
    }

    /** The version the last failed attempt built on (the next attempt looks past it). */
    private var triedOn: Option[Long] = None

    /**
     * One commit attempt of a batch append (or a stream's micro-batch) on the newest version's
     * head: its own `_manifest_log/` entry, found with a probe past the version known (read
     * before the job, or the last attempt's base). The engine checks the write against it and
     * makes the entry; the version's whole manifest is made only after the commit
     * ([[manifestAfter]]). Some(None): the base records the batch already. None: the newest
     * version has no entry that gives its head (an older log, or none yet): the attempt builds
     * on the whole manifest.
     */
    private def onHead(first: Boolean, mine: JobManifest): Option[Option[CommitAnswer]] = {
      val known = if (first) start.read.map(_._1) else triedOn
      for {
        v <- target.commits.newest(known)
        baseEntry <- target.commits.entryText(v)
        texts <- Option(NativeLog.appendOnHead(baseEntry, v, mine.json, stream.map(_.queryId).orNull,
          stream.map(_.batchId).getOrElse(0L), commitInfoJson()))
      } yield {
        val a = mapper.readTree(texts(0))
        val entry = texts(1)
        if (a.path("replay").asBoolean(false)) None
        else Some(CommitAnswer.fromAnswer(a, v, entry,
          () => manifestAfter(v, a.get("version").asLong(), entry), Some(baseEntry)))
      }
    }

    /** The whole manifest of `version`, committed with `entry` on `baseVersion`: the manifest
     *  read before the job with the entry applied when that is the base, else rebuilt from the
     *  log. Tens of MB at 100,000 shards: made after the commit, to publish it. */
    private def manifestAfter(baseVersion: Long, version: Long, entry: String): String =
      start.read match {
        case Some((v, text)) if v == baseVersion => NativeLog.applyEntry(text, version, entry)
        case _ => target.commits.manifestAt(version)
      }

    /**
     * KV appends: this write's keys against every listed shard of `base` (dataset.md §3), by
     * merging index parts (an existing shard without one gets a temporary part from its header);
     * `fail` throws, `lastWin` rewrites the older shards that lose keys. Their replacements in
     * the next manifest.
     */
    private def resolveKeysAcrossDataset(staged: Staged, base: Option[(Long, String)]): ArrayNode = {
      val replacements = mapper.createArrayNode()
      val unchecked = base.toSeq.flatMap { case (_, text) =>
        Json.topLevelArrayStrings(text, "shards", "shard_path")
      }.filterNot(keysClean)
      if (unchecked.nonEmpty && staged.parts.nonEmpty) {
        val runs = unchecked.map(f => (f, parts.existingPart(f), true, 0L, 0L)) ++
          staged.shardReports.map { s =>
            val f = s.get("file").asText()
            (f, parts.local(staged.parts.getOrElse(f, new Path(rewrittenDir, parts.partName(f)))),
              false, s.get("partition").asLong(), s.get("shard").asLong())
          }
        val losers = parts.merge(runs)
        val hit = losers.map(_._1).toSet
        keysClean ++= unchecked.filterNot(hit)
        val copyId = java.util.UUID.randomUUID().toString
        losers.zipWithIndex.foreach { case ((old, keys, _), copy) =>
          rewriteOlder(old, keys, NativeNames.rewrittenShardFileName(old, copy, copyId),
            replacements.addObject().put("old", old))
        }
      }
      replacements
    }

    /** Copies the dataset's shard `old` without the keys in `keys` as `newName` (none when no
     *  tensor is left), recorded in `entry` as its replacement. */
    private def rewriteOlder(old: String, keys: String, newName: String, entry: ObjectNode): Unit = {
      val copy = new Path(dest, newName)
      val partCopy = if (generateIndex) Some(parts.partPath(newName)) else None
      val r = parts.rewrite(new Path(dest, old), copy, partCopy, keys)
      if (r.get("delete").asBoolean()) entry.putNull("new")
      else {
        promoted += copy
        rewritten :+= copy
        partCopy.foreach { p => promoted += p; rewritten :+= p }
        entry.putObject("new").put("shard_path", newName)
          .put("samples_count", r.get("samples").asLong())
          .put("bytes", r.get("bytes").asLong())
          .put("partition", parsePartition(old))
          .put("padded_samples", 0)
          .put("num_tensors", r.get("num_tensors").asLong())
          .put("crc32c", r.get("crc32c").asText())
      }
    }

    /** The next manifest (Rust) on top of `base`: version, manifest and entry texts, superseded
     *  shards. */
    private def nextManifest(base: Option[(Long, String)], mine: JobManifest,
        replacements: ArrayNode): CommitAnswer = {
      val replacementsJson =
        if (replacements.isEmpty) null else mapper.writeValueAsString(replacements)
      val infoJson = commitInfoJson()
      CommitAnswer(base.map(_._1).getOrElse(0L), stream match {
        case Some(b) => NativeWriter.nextStreamManifest(base.map(_._2).orNull, mine.json,
          replacementsJson, b.queryId, b.batchId, infoJson)
        case None => NativeWriter.nextManifest(base.map(_._2).orNull, mine.json, start.append,
          replacementsJson, infoJson)
      })
    }

    /** Who and when (spec/dataset.md §5.8): the time is taken now, just before this attempt
     *  creates its version, so a retry records its own. */
    private def commitInfoJson(): String = {
      val info = mapper.createObjectNode().put("committed_at_ms", System.currentTimeMillis())
        .put("app_id", sqlContext.sparkContext.applicationId)
      commitMessage.foreach(m => info.put("commit_message", m))
      mapper.writeValueAsString(info)
    }

    /**
     * After the commit: the version exists in the log; readers of dataset_manifest.json see it
     * once it is published (spec/dataset.md §5.3 step 4).
     */
    private def publish(next: CommitAnswer): Unit = {
      val version = next.version
      try target.commits.publish(version, next.manifest, writeId)
      catch {
        case e: Exception =>
          throw new IOException(s"safetensors: the write to $dest was committed as manifest " +
            s"version $version (${DatasetCommit.LogDir}/${DatasetCommit.logName(version)}), but " +
            s"replacing ${DatasetFiles.ManifestName} failed: ${e.getMessage}. Readers of " +
            s"${DatasetFiles.ManifestName} see the previous version until the next write to this " +
            "path publishes a newer one, which includes this write's rows: do not run this write " +
            "again (spec/dataset.md §5.3)", e)
      }
    }

    /** What the published version no longer needs: unlisted uploads, index parts a version
     *  without an index must not keep, and (by the commit answer) superseded shards. */
    private def cleanUp(next: CommitAnswer, mine: JobManifest): Unit = {
      if (target.objectStore) {
        // uploads of attempts that did not commit (a task that failed after its upload)
        ObjectStoreCommit.removeUnlisted(fs, dest, writeId, mine.listed, null)
      }
      // (scanned only when there are parts to keep or remove: tens of MB at 100,000 shards)
      lazy val nowListed = Json.topLevelArrayStrings(next.manifest, "shards", "shard_path")
      if (generateIndex) {
        // earlier shards without a part (an append that creates the first index) get one; parts
        // of the earlier one-part-per-version layout go
        parts.completeIndex(nowListed)
        parts.remove(Seq.empty)
      } else if (parts.present) {
        // no index: no listed shard keeps a part (a partial index is never published)
        parts.remove(nowListed)
      }
      cleanUpSuperseded(fs, dest, target.commits, parts, next)
    }

    /** This write's shards as listed (a KV lastWin copy of an older shard is not counted). */
    private def report(mine: JobManifest, job: TaskJob): Unit = {
      val shards = mine.manifest.get("shards").elements().asScala.toSeq
      WriteStats.report(WriteStats(shards.map(_.path("samples_count").asLong()).sum,
        shards.size.toLong, shards.map(_.path("bytes").asLong()).sum, job.metrics.writeNanos.value))
    }

    /** The dataset is untouched: removes everything this write added. */
    private def rollBack(t: Throwable): Unit = {
      promoted.foreach(p => quietly(t)(fs.delete(p, false)))
      if (target.objectStore) ObjectStoreCommit.removeUnlisted(fs, dest, writeId, Set.empty, t)
      quietly(t)(fs.delete(staging, true))
      if (start.createdRoot) quietly(t) {
        if (fs.exists(dest) && fs.listStatus(dest).isEmpty) fs.delete(dest, false)
      }
    }
  }

  /**
   * After a commit is published: the one place a commit decides what happens to the shards it
   * superseded (an overwrite's, the older copies a KV `lastWin` append replaced, a compaction's
   * inputs). `next` is the commit answer of `NativeWriter.nextManifest` / `nextStreamManifest`
   * (Rust decides, spec/dataset.md §5.8.1): with `retain` (the dataset's retention is not 0)
   * they, their index parts and every log entry stay, for older versions to read, until a vacuum
   * removes them; without it (retention 0) they and their parts are deleted now and log entries
   * more than [[DatasetCommit.KeptVersions]] versions behind are pruned (§5.3 step 5).
   */
  private[spark] def cleanUpSuperseded(fs: FileSystem, dest: Path, commits: DatasetCommit,
      parts: IndexParts, next: CommitAnswer): Unit = {
    if (next.retain) return
    val superseded = next.superseded
    parts.remove(superseded)
    superseded.foreach(f => quietly(null)(fs.delete(new Path(dest, f), false)))
    commits.prune(next.version, next.manifest,
      s"prune-${java.util.UUID.randomUUID()}")
  }

  /** The tasks: each writes its rows' shards to staging and returns where they are. */
  private def runTasks(sqlContext: SQLContext, data: DataFrame, job: TaskJob): Array[TaskResult] =
    sqlContext.sparkContext.runJob(SparkInternals.internalRows(data),
      (ctx: TaskContext, it: Iterator[InternalRow]) => WriteTask.run(ctx, it, job))

  /** The partition in a shard name of this connector (0 for another name). */
  private def parsePartition(file: String): Long = math.max(NativeNames.shardFilePartition(file), 0L)

  private def quietly(t: Throwable)(f: => Any): Unit =
    try f catch { case e: Throwable => if (t != null) t.addSuppressed(e) }

  private def arrayJson(nodes: Seq[JsonNode]): String = {
    val a = mapper.createArrayNode()
    nodes.foreach(a.add)
    mapper.writeValueAsString(a)
  }
}
