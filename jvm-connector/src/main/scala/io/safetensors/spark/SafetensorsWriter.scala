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
  val ManifestName = "dataset_manifest.json"
  val IndexName = "_tensor_index.parquet"

  private val mapper = new ObjectMapper()

  private final class WrittenRelation(val sqlContext: SQLContext, val schema: StructType)
    extends BaseRelation

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
    // Small driver-side files (manifest, index) go through the raw local FS: no .crc siblings.
    val smallFs: FileSystem = fs match {
      case l: LocalFileSystem => l.getRawFileSystem
      case other => other
    }
    // A local destination's directories, manifest and index go through java.nio: Hadoop's local
    // file system without its native library forks a `chmod` for every mkdirs and create and two
    // `readlink`s for every FileContext.rename (20-90 ms each, a third of a small write).
    val localDest: Option[File] = WriteTask.localFile(fs, dest)
    // (4) mode
    val exists = fs.exists(dest)
    var existingManifest: Option[String] = None
    mode match {
      case SaveMode.ErrorIfExists if exists =>
        throw new IllegalArgumentException(
          s"safetensors: path $dest already exists (SaveMode ErrorIfExists, the default); " +
            "use .mode(\"overwrite\"), .mode(\"append\") or .mode(\"ignore\")")
      case SaveMode.Ignore if exists =>
        return relation
      case SaveMode.Append if exists =>
        val manifestPath = new Path(dest, ManifestName)
        if (fs.exists(manifestPath)) {
          val m = readUtf8(fs, manifestPath)
          NativeWriter.checkAppend(planJson, m)
          existingManifest = Some(m)
        } else if (listShards(fs, dest).nonEmpty) {
          throw new IllegalArgumentException(
            s"safetensors: cannot append to $dest: it holds .safetensors files but no $ManifestName " +
              "(not a dataset written by this connector)")
        }
      case _ =>
    }
    val createdRoot = !exists
    val oldManifest: Option[JsonNode] =
      if (mode == SaveMode.Overwrite && fs.exists(new Path(dest, ManifestName))) {
        Some(mapper.readTree(readUtf8(fs, new Path(dest, ManifestName))))
      } else None
    // (5) staging
    val writeId = mapper.readTree(planJson).get("write_id").asText()
    val staging = new Path(dest, s"_staging-$writeId")
    val promoted = mutable.ArrayBuffer[Path]()
    val tempFiles = mutable.ArrayBuffer[Path]()
    val localTemps = mutable.ArrayBuffer[File]()
    var switched = false
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
      // (7) commit
      val staged = mutable.Map[String, Path]()
      results.foreach(_.staged.foreach { case (f, p) => staged(f) = new Path(p) })
      // The task reports (a KV task's has an entry per row and column) go to Rust as text; they
      // become JSON trees here only when a rewrite must edit them or the index lists their tensors.
      val reportTexts: Array[String] = results.sortBy(_.partition).map(r => readUtf8(fs, new Path(r.reportFile)))
      lazy val reports: Array[ObjectNode] = reportTexts.map(t => mapper.readTree(t).asInstanceOf[ObjectNode])
      var commit = mapper.readTree(
        NativeWriter.commitJob(planJson, reportTexts.mkString("[", ",", "]"), existingManifest.orNull))
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
              Some(rewriteStaged(fs, staged, staging, file, mapper.writeValueAsString(rw), localTemps))
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
        commit = mapper.readTree(
          NativeWriter.commitJob(planJson, arrayJson(reports.toSeq), existingManifest.orNull))
        if (commit.get("rewrites").size() != 0) {
          throw new IllegalStateException("safetensors: internal error: shard rewrites did not converge")
        }
      }
      val manifest = commit.get("manifest")
      lazy val newShards: Seq[JsonNode] = reports.toSeq.flatMap(_.get("shards").elements().asScala)
      // promote staged shards (every staged shard is one of the manifest's)
      val listed = manifest.get("shards").elements().asScala.map(_.get("file").asText()).toSet
      staged.foreach { case (file, src) =>
        if (!listed(file)) {
          throw new IllegalStateException(s"safetensors: staged shard $file is not in the manifest")
        }
        val target = new Path(dest, file)
        if (!fs.rename(src, target)) throw new IOException(s"safetensors: cannot rename $src to $target")
        promoted += target
      }
      // index (to a hidden temp; renamed into place after the manifest switch)
      val indexPath = new Path(dest, IndexName)
      val indexTemp: Option[Path] = if (manifest != null && planGeneratesIndex(planJson)) {
        val local = Files.createTempFile("safetensors-index-", ".parquet").toFile
        localTemps += local
        val existingLocal: Option[File] =
          if (existingManifest.isDefined && fs.exists(indexPath)) {
            val f = Files.createTempFile("safetensors-old-index-", ".parquet").toFile
            localTemps += f
            f.delete()
            fs.copyToLocalFile(false, indexPath, new Path(f.getAbsolutePath), true)
            Some(f)
          } else None
        // An append that creates the first index also indexes the earlier shards, from their headers.
        val earlierShards: Seq[JsonNode] =
          if (existingManifest.isDefined && existingLocal.isEmpty) {
            mapper.readTree(existingManifest.get).path("shards").elements().asScala.toSeq.map { s =>
              val file = s.get("file").asText()
              val (headerJson, len) = readHeaderJson(fs, new Path(dest, file))
              mapper.readTree(NativeWriter.shardReportFromHeader(file, headerJson, len, planJson))
            }
          } else Seq.empty
        local.delete()
        NativeWriter.writeIndex(local.getAbsolutePath, arrayJson(earlierShards ++ newShards),
          existingLocal.map(_.getAbsolutePath).orNull)
        val tmp = new Path(dest, s".$IndexName.$writeId.tmp")
        tempFiles += tmp
        localDest match {
          case Some(d) => LocalCommit.moveSynced(local, new File(d, tmp.getName))
          case None => smallFs.copyFromLocalFile(true, true, new Path(local.getAbsolutePath), tmp)
        }
        Some(tmp)
      } else None
      // manifest: hidden temp + atomic rename (the switch)
      val manifestTmp = new Path(dest, s".$ManifestName.$writeId.tmp")
      tempFiles += manifestTmp
      val manifestBytes = mapper.writerWithDefaultPrettyPrinter().writeValueAsBytes(manifest)
      localDest match {
        case Some(d) =>
          LocalCommit.writeSynced(new File(d, manifestTmp.getName), manifestBytes)
          LocalCommit.replace(new File(d, manifestTmp.getName), new File(d, ManifestName))
        case None =>
          val out = smallFs.create(manifestTmp, true)
          try out.write(manifestBytes) finally out.close()
          FileContext.getFileContext(dest.toUri, conf)
            .rename(manifestTmp, new Path(dest, ManifestName), Options.Rename.OVERWRITE)
      }
      switched = true
      // after the switch: best effort, the new dataset is already consistent
      indexTemp match {
        case Some(tmp) => localDest match {
          case Some(d) => LocalCommit.replace(new File(d, tmp.getName), new File(d, IndexName))
          case None => FileContext.getFileContext(dest.toUri, conf)
            .rename(tmp, indexPath, Options.Rename.OVERWRITE)
        }
        case None => if (fs.exists(indexPath)) fs.delete(indexPath, false)
      }
      if (mode == SaveMode.Overwrite) {
        val keep = manifest.get("shards").elements().asScala.map(_.get("file").asText()).toSet
        val old = oldManifest.toSeq.flatMap(_.get("shards").elements().asScala.map(_.get("file").asText()))
        (listShards(fs, dest).map(_.getName) ++ old).distinct.filterNot(keep).foreach { f =>
          fs.delete(new Path(dest, f), false)
        }
      }
      relation
    } catch {
      case t: Throwable if !switched =>
        // the old dataset (if any) is untouched: remove everything this write added
        promoted.foreach(p => quietly(t)(fs.delete(p, false)))
        tempFiles.foreach(p => quietly(t)(fs.delete(p, false)))
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

  /** Driver-side files of a local destination, through java.nio, durable once a call returns. */
  private object LocalCommit {
    import java.nio.channels.FileChannel
    import java.nio.file.StandardCopyOption.{ATOMIC_MOVE, REPLACE_EXISTING}
    import java.nio.file.StandardOpenOption.{CREATE, READ, TRUNCATE_EXISTING, WRITE}

    def writeSynced(f: File, bytes: Array[Byte]): Unit = {
      val ch = FileChannel.open(f.toPath, CREATE, TRUNCATE_EXISTING, WRITE)
      try {
        val buf = java.nio.ByteBuffer.wrap(bytes)
        while (buf.hasRemaining) ch.write(buf)
        ch.force(true)
      } finally ch.close()
    }

    /** Syncs `src` and moves it to `dest` (another local file system possibly: copy + delete). */
    def moveSynced(src: File, dest: File): Unit = {
      Files.move(src.toPath, dest.toPath, REPLACE_EXISTING)
      val ch = FileChannel.open(dest.toPath, READ)
      try ch.force(true) finally ch.close()
    }

    /** Atomically renames `src` over `dest` (rename(2)) and syncs their directory. */
    def replace(src: File, dest: File): Unit = {
      Files.move(src.toPath, dest.toPath, ATOMIC_MOVE)
      val dir = FileChannel.open(dest.getParentFile.toPath, READ)
      try dir.force(true) finally dir.close()
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
      file: String, rewriteJson: String, localTemps: mutable.ArrayBuffer[File]): JsonNode = {
    val src = staged(file)
    val out = new Path(new Path(staging, "rewritten"), file)
    val report = (WriteTask.localFile(fs, src), WriteTask.localFile(fs, out)) match {
      case (Some(in), Some(o)) =>
        o.getParentFile.mkdirs()
        NativeWriter.rewriteShard(in.getAbsolutePath, o.getAbsolutePath, rewriteJson)
      case _ =>
        val dir = Files.createTempDirectory("safetensors-rewrite-").toFile
        localTemps += dir
        val in = new File(dir, "in-" + file)
        val o = new File(dir, file)
        localTemps += in
        localTemps += o
        fs.copyToLocalFile(false, src, new Path(in.getAbsolutePath), true)
        val r = NativeWriter.rewriteShard(in.getAbsolutePath, o.getAbsolutePath, rewriteJson)
        fs.copyFromLocalFile(true, true, new Path(o.getAbsolutePath), out)
        r
    }
    fs.delete(src, false)
    staged(file) = out
    mapper.readTree(report)
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
