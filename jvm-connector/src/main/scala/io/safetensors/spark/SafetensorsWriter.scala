package io.safetensors.spark

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

/** The driver side of a write: plan, mode, staging, job, commit (spec/jni.md, dataset.md). */
private[spark] object SafetensorsWriter {
  val ManifestName: String = DatasetCommit.ManifestName

  private val mapper = new ObjectMapper()

  /** What a write returns to Spark's V1 route: the written DataFrame's schema. */
  final class WrittenRelation(val sqlContext: SQLContext, val schema: StructType)
    extends BaseRelation

  /** The error of `SaveMode.ErrorIfExists` on an existing path (a dataset or a partitioned root). */
  def pathExists(dest: Path): IllegalArgumentException =
    new IllegalArgumentException(
      s"safetensors: path $dest already exists (SaveMode ErrorIfExists, the default); " +
        "use .mode(\"overwrite\"), .mode(\"append\") or .mode(\"ignore\")")

  def write(sqlContext: SQLContext, mode: SaveMode, parameters: Map[String, String],
      data: DataFrame): BaseRelation = {
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
    val localDest: Option[File] = WriteTask.localFile(fs, dest)
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
    val append = mode == SaveMode.Append
    if (append) current match {
      case Some(m) => NativeWriter.checkAppend(planJson, m)
      case None if exists && listShards(fs, dest).nonEmpty =>
        throw new IllegalArgumentException(
          s"safetensors: cannot append to $dest: it holds .safetensors files but no $ManifestName " +
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
      val job = TaskJob(planJson, data.schema, staging.toString, new SerializableConf(conf))
      val rdd = SparkInternals.internalRows(data)
      val results: Array[TaskResult] = sqlContext.sparkContext.runJob(rdd,
        (ctx: TaskContext, it: Iterator[InternalRow]) => WriteTask.run(ctx, it, job))
      // (7) this write's manifest
      val staged = mutable.Map[String, Path]()
      results.foreach(_.staged.foreach { case (f, p) => staged(f) = new Path(p) })
      // The task reports (a KV task's has an entry per row and column) go to Rust as text; they
      // become JSON trees here only when a rewrite must edit them or the index lists their tensors.
      val reportTexts: Array[String] = results.sortBy(_.partition).map(r => readUtf8(fs, new Path(r.reportFile)))
      lazy val reports: Array[ObjectNode] = reportTexts.map(t => mapper.readTree(t).asInstanceOf[ObjectNode])
      var finalReports = reportTexts.mkString("[", ",", "]")
      var commit = mapper.readTree(NativeWriter.commitJob(planJson, finalReports))
      val rewrites = commit.get("rewrites").elements().asScala.toSeq
      if (rewrites.nonEmpty) {
        rewrites.foreach { rw =>
          val file = rw.get("file").asText()
          // lastWin across tasks: a shard whose every key won elsewhere goes; others lose tensors.
          val newReport: Option[JsonNode] =
            if (rw.get("delete").asBoolean()) {
              fs.delete(staged(file), false)
              staged.remove(file)
              None
            } else {
              Some(rewriteStaged(fs, staged, staging, file, mapper.writeValueAsString(rw), localTemps,
                objectStore))
            }
          reports.foreach { r =>
            val shards = r.get("shards").asInstanceOf[ArrayNode]
            (0 until shards.size()).find(i => shards.get(i).get("file").asText() == file)
              .foreach(i => newReport match {
                case Some(n) => shards.set(i, n)
                case None => shards.remove(i)
              })
          }
        }
        finalReports = arrayJson(reports.toSeq)
        commit = mapper.readTree(NativeWriter.commitJob(planJson, finalReports))
        if (commit.get("rewrites").size() != 0) {
          throw new IllegalStateException("safetensors: internal error: shard rewrites did not converge")
        }
      }
      val writeManifest = mapper.writeValueAsString(commit.get("manifest"))
      lazy val newShards: Seq[JsonNode] = reports.toSeq.flatMap(_.get("shards").elements().asScala)
      // promote staged shards (every staged shard is one of this write's manifest's)
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
      }
      // (8) the commit: the next manifest version on top of the latest one, retried on top of a
      // newer one when another writer committed first (spec/dataset.md §5.3)
      var base: Option[(Long, String)] = None
      var next: JsonNode = null
      var attempts = 0
      val kvAppend = append && mapper.readTree(planJson).path("layout").path("layout").asText() == "kv"
      // shards of the dataset known to hold none of this write's keys (their content never changes)
      val keysClean = mutable.Set[String]()
      // lastWin across writes: this attempt's rewritten copies of older shards (new name -> report)
      var rewritten = Seq.empty[(Path, JsonNode)]
      var replacements = mapper.createArrayNode()
      while (!committed) {
        if (attempts == MaxCommitAttempts) {
          throw new IOException(s"safetensors: could not commit to $dest: $attempts attempts " +
            "each found a newer manifest version committed by another writer")
        }
        attempts += 1
        base = commits.latest()
        // a previous attempt's rewrites were made against another base: start over
        rewritten.foreach { case (p, _) => fs.delete(p, false); promoted -= p }
        rewritten = Seq.empty
        replacements = mapper.createArrayNode()
        if (kvAppend) {
          // KV keys hold across the whole dataset: this write's against every listed shard
          // (dataset.md §3); fail throws, lastWin answers which older shards lose which keys
          val unchecked = base.toSeq.flatMap { case (_, text) =>
            mapper.readTree(text).path("shards").elements().asScala.map(_.get("shard_path").asText())
          }.filterNot(keysClean)
          if (unchecked.nonEmpty) {
            val existing = mapper.createArrayNode()
            unchecked.foreach { f =>
              val (header, len) = readHeaderJson(fs, new Path(dest, f))
              existing.addObject().put("file", f).put("header", header).put("length", len)
            }
            val rewrites = mapper.readTree(
              NativeWriter.checkKeysAgainstDataset(planJson, finalReports, mapper.writeValueAsString(existing)))
              .elements().asScala.toSeq
            val hit = rewrites.map(_.get("file").asText()).toSet
            keysClean ++= unchecked.filterNot(hit)
            val copyId = java.util.UUID.randomUUID().toString
            rewrites.foreach { rw =>
              val old = rw.get("file").asText()
              val entry = replacements.addObject().put("old", old)
              if (rw.get("delete").asBoolean()) entry.putNull("new")
              else {
                val newName = old.replaceFirst("^(part-[0-9]{5,}-[0-9]{4,})-.*$", "$1-" + copyId + ".safetensors")
                val (target, report) = rewriteExisting(fs, dest, staging, old, newName,
                  mapper.writeValueAsString(rw), localTemps, objectStore)
                promoted += target
                rewritten :+= target -> report
                entry.putObject("new").put("shard_path", newName)
                  .put("samples_count", report.get("samples").asLong())
                  .put("bytes", report.get("bytes").asLong())
                  .put("partition", report.get("partition").asLong())
                  .put("padded_samples", 0)
                  .put("num_tensors", report.get("tensors").size())
              }
            }
          }
        }
        next = mapper.readTree(NativeWriter.nextManifest(base.map(_._2).orNull, writeManifest, append,
          if (replacements.isEmpty) null else mapper.writeValueAsString(replacements)))
        Option(DatasetCommit.beforeCreate).foreach(_(next.get("version").asLong()))
        committed = commits.tryCommit(next.get("version").asLong(), base.map(_._1).getOrElse(0L),
          next.get("manifest").asText(), writeId)
      }
      val version = next.get("version").asLong()
      // after the commit: best effort, the new dataset is already consistent for readers that
      // go through the manifest
      commits.publish(version, next.get("manifest").asText(), writeId)
      if (objectStore) {
        // uploads of attempts that did not commit (a task that failed after its upload)
        ObjectStoreCommit.removeUnlisted(fs, dest, writeId, listed, null)
      }
      if (planGeneratesIndex(planJson)) {
        val replaced = replacements.elements().asScala.map(_.get("old").asText()).toSet
        writeIndex(fs, dest, localDest, planJson, version, if (append) base else None, replaced,
          newShards ++ rewritten.map(_._2), localTemps, objectStore)
      } else {
        removeIndexParts(fs, dest, version)
      }
      next.get("superseded").elements().asScala.map(_.asText()).foreach { f =>
        quietly(null)(fs.delete(new Path(dest, f), false))
      }
      commits.prune(version)
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
      localTemps.foreach(WriteTask.deleteLocal)
    }
  }

  /** How many times a commit is retried on top of newer versions before the write fails. */
  private val MaxCommitAttempts = 100

  /**
   * Writes the index part of manifest `version` into `_tensor_index.parquet/` (a hidden temporary
   * then a rename), then removes the parts of older versions; a part of a newer version already
   * there makes this one superseded and it is removed instead. An append (`base` set) reuses the
   * base version's part, or rebuilds the earlier shards' rows from their headers.
   */
  private def writeIndex(fs: FileSystem, dest: Path, localDest: Option[File], planJson: String,
      version: Long, base: Option[(Long, String)], replaced: Set[String], newShards: Seq[JsonNode],
      localTemps: mutable.ArrayBuffer[File], objectStore: Boolean): Unit = {
    val indexDir = new Path(dest, DatasetCommit.IndexDir)
    val local = Files.createTempFile("safetensors-index-", ".parquet").toFile
    localTemps += local
    val baseShards: Seq[String] = base.toSeq.flatMap { case (_, text) =>
      mapper.readTree(text).path("shards").elements().asScala.map(_.get("shard_path").asText())
    }.filterNot(replaced)
    val basePart: Option[File] = base.flatMap { case (v, _) =>
      val p = new Path(indexDir, DatasetCommit.indexPartName(v))
      // the base's part lists the replaced shards' rows: rebuilt from headers instead
      if (baseShards.nonEmpty && replaced.isEmpty && fs.exists(p)) {
        val f = Files.createTempFile("safetensors-old-index-", ".parquet").toFile
        localTemps += f
        f.delete()
        fs.copyToLocalFile(false, p, new Path(f.getAbsolutePath), true)
        Some(f)
      } else None
    }
    // Earlier shards without an index part of their version: rows rebuilt from their headers.
    val earlier: Seq[JsonNode] =
      if (basePart.isEmpty) baseShards.map { file =>
        val (headerJson, len) = readHeaderJson(fs, new Path(dest, file))
        mapper.readTree(NativeWriter.shardReportFromHeader(file, headerJson, len, planJson))
      } else Seq.empty
    local.delete()
    NativeWriter.writeIndex(local.getAbsolutePath, arrayJson(earlier ++ newShards),
      basePart.map(_.getAbsolutePath).orNull)
    val part = DatasetCommit.indexPartName(version)
    val tmpName = s".$part.tmp"
    localDest match {
      case Some(d) =>
        val dir = new File(d, DatasetCommit.IndexDir)
        Files.createDirectories(dir.toPath)
        Files.move(local.toPath, new File(dir, tmpName).toPath,
          java.nio.file.StandardCopyOption.REPLACE_EXISTING)
        val ch = java.nio.channels.FileChannel.open(new File(dir, tmpName).toPath,
          java.nio.file.StandardOpenOption.READ)
        try ch.force(true) finally ch.close()
        removeIndexParts(fs, dest, version)
        Files.move(new File(dir, tmpName).toPath, new File(dir, part).toPath,
          java.nio.file.StandardCopyOption.ATOMIC_MOVE)
        DatasetCommit.syncDir(dir)
      case None if objectStore =>
        // one PUT: an object appears whole, so no temporary and no rename (= copy) is needed
        removeIndexParts(fs, dest, version)
        DatasetCommit.uploadLocal(fs, local, new Path(indexDir, part))
      case None =>
        fs.mkdirs(indexDir)
        val tmp = new Path(indexDir, tmpName)
        DatasetCommit.uploadLocal(fs, local, tmp)
        removeIndexParts(fs, dest, version)
        FileContext.getFileContext(dest.toUri, fs.getConf)
          .rename(tmp, new Path(indexDir, part), Options.Rename.OVERWRITE)
    }
    // a newer commit placed its part meanwhile: ours is superseded
    if (indexParts(fs, dest).exists(_ > version)) removeIndexParts(fs, dest, version + 1)
  }

  /** Versions of the index parts in `_tensor_index.parquet/`. */
  private def indexParts(fs: FileSystem, dest: Path): Seq[Long] = {
    val dir = new Path(dest, DatasetCommit.IndexDir)
    if (!fs.exists(dir) || !fs.getFileStatus(dir).isDirectory) Seq.empty
    else fs.listStatus(dir).toSeq.flatMap(s => DatasetCommit.parseIndexPartName(s.getPath.getName))
  }

  /** Removes the index parts of versions below `version` (and the directory once it is empty). */
  private def removeIndexParts(fs: FileSystem, dest: Path, version: Long): Unit = {
    val dir = new Path(dest, DatasetCommit.IndexDir)
    if (fs.exists(dir)) {
      if (!fs.getFileStatus(dir).isDirectory) fs.delete(dir, false) // an index of before 0.2
      else {
        fs.listStatus(dir).foreach { s =>
          DatasetCommit.parseIndexPartName(s.getPath.getName).filter(_ < version)
            .foreach(_ => quietly(null)(fs.delete(s.getPath, false)))
        }
        if (fs.listStatus(dir).isEmpty) quietly(null)(fs.delete(dir, false))
      }
    }
  }

  private def quietly(t: Throwable)(f: => Any): Unit =
    try f catch { case e: Throwable => if (t != null) t.addSuppressed(e) }

  private def planGeneratesIndex(planJson: String): Boolean =
    mapper.readTree(planJson).path("generate_index").asBoolean(false)

  private def arrayJson(nodes: Seq[JsonNode]): String = {
    val a = mapper.createArrayNode()
    nodes.foreach(a.add)
    mapper.writeValueAsString(a)
  }

  /** Rewrites a staged shard as `rewriteJson` (an entry of commitJob's rewrites) says; returns
   *  the new ShardReport node. */
  private def rewriteStaged(fs: FileSystem, staged: mutable.Map[String, Path], staging: Path,
      file: String, rewriteJson: String, localTemps: mutable.ArrayBuffer[File],
      inPlace: Boolean): JsonNode = {
    val src = staged(file)
    // on an object store the shard is at its final name, not yet listed: replaced there
    val out = if (inPlace) src else new Path(new Path(staging, "rewritten"), file)
    val report = rewriteShardTo(fs, src, out, rewriteJson, localTemps)
    if (out != src) fs.delete(src, false)
    staged(file) = out
    mapper.readTree(report)
  }

  /** Copies the dataset's shard `old` without the tensors `rewriteJson` (a checkKeysAgainstDataset
   *  entry) drops, as `newName` in the dataset directory; returns (its path, its ShardReport). */
  private def rewriteExisting(fs: FileSystem, dest: Path, staging: Path, old: String, newName: String,
      rewriteJson: String, localTemps: mutable.ArrayBuffer[File], inPlace: Boolean): (Path, JsonNode) = {
    val target = new Path(dest, newName)
    val out = if (inPlace) target else new Path(new Path(staging, "rewritten"), newName)
    val report = rewriteShardTo(fs, new Path(dest, old), out, rewriteJson, localTemps)
    if (out != target && !fs.rename(out, target)) {
      throw new IOException(s"safetensors: cannot rename $out to $target")
    }
    val node = mapper.readTree(report).asInstanceOf[ObjectNode]
    node.put("file", out.getName)
    (target, node)
  }

  /** Writes `out` = `src` without the tensors `rewriteJson` drops (`rewriteShard`): directly when
   *  both are local files, else through local copies (download, rewrite, upload). Returns the new
   *  file's ShardReport text. */
  private def rewriteShardTo(fs: FileSystem, src: Path, out: Path, rewriteJson: String,
      localTemps: mutable.ArrayBuffer[File]): String =
    (WriteTask.localFile(fs, src), WriteTask.localFile(fs, out)) match {
      case (Some(in), Some(o)) =>
        o.getParentFile.mkdirs()
        NativeWriter.rewriteShard(in.getAbsolutePath, o.getAbsolutePath, rewriteJson)
      case _ =>
        val dir = Files.createTempDirectory("safetensors-rewrite-").toFile
        localTemps += dir
        val in = new File(dir, "in-" + src.getName)
        val o = new File(dir, out.getName)
        localTemps += in
        localTemps += o
        fs.copyToLocalFile(false, src, new Path(in.getAbsolutePath), true)
        val r = NativeWriter.rewriteShard(in.getAbsolutePath, o.getAbsolutePath, rewriteJson)
        DatasetCommit.uploadLocal(fs, o, out)
        r
    }

  /** The header text of a shard (ranged reads: the 8-byte prefix, then N bytes) and its length.
   *  N is checked against the format's cap and the file length before anything is allocated. */
  private def readHeaderJson(fs: FileSystem, p: Path): (String, Long) = {
    val len = fs.getFileStatus(p).getLen
    if (len < 8) throw new SafetensorsException(s"$p: header too small: $len bytes")
    val in = fs.open(p)
    try {
      val prefix = new Array[Byte](8)
      in.readFully(0L, prefix)
      val n = java.nio.ByteBuffer.wrap(prefix).order(java.nio.ByteOrder.LITTLE_ENDIAN).getLong
      if (n < 0 || n > 100000000L || 8 + n > len)
        throw new SafetensorsException(s"$p: invalid header length $n for a file of $len bytes")
      val header = new Array[Byte](n.toInt)
      in.readFully(8L, header)
      (new String(header, StandardCharsets.UTF_8), len)
    } finally in.close()
  }

  private def readUtf8(fs: FileSystem, p: Path): String = {
    val in = fs.open(p)
    try new String(in.readAllBytes(), StandardCharsets.UTF_8) finally in.close()
  }

  /** Top-level shard files (dataset.md §1): `*.safetensors` not starting with `_` or `.`. */
  def listShards(fs: FileSystem, dir: Path): Seq[Path] =
    if (!fs.getFileStatus(dir).isDirectory) Seq.empty
    else fs.listStatus(dir).toSeq.filter(_.isFile).map(_.getPath).filter { p =>
      val n = p.getName
      n.endsWith(".safetensors") && !n.startsWith("_") && !n.startsWith(".")
    }

}
