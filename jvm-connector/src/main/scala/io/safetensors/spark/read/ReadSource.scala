package io.safetensors.spark.read

import io.safetensors.spark.internal.Json
import java.util.concurrent.{Callable, Executors, TimeUnit}

import scala.collection.mutable
import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.JsonNode
import com.fasterxml.jackson.databind.node.ObjectNode
import io.safetensors.spark.commit.DatasetCommit
import io.safetensors.spark.jni.{NativeLib, NativeReader, NativeVersions}
import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FileSystem, Path}
import org.apache.spark.sql.sources.Filter
import org.apache.spark.sql.types.{ArrayType, DataType, StructType}
import io.safetensors.spark.files.{DatasetFiles, LogReads, ShardHeaders}
import io.safetensors.spark.streaming.StreamOptions

/** The read options (spec/options.md, "Read options"). */
private[spark] final case class ReadOptions(
    paths: Seq[String],
    layout: String,
    recursive: Boolean,
    ignoreCorruptFiles: Boolean,
    batchRows: Long,
    ignoreMissingFiles: Boolean = false,
    fileLayoutMaxTensors: Option[Long] = None,
    versionAsOf: Option[String] = None,
    timestampAsOf: Option[String] = None,
    verifyChecksums: Boolean = false,
    stream: StreamOptions = StreamOptions())

private[spark] object ReadOptions {
  val Keys: Seq[String] =
    Seq("layout", "inferSchema", "recursiveFileLookup", "ignoreCorruptFiles", "ignoreMissingFiles",
      "read_batch_rows", "file_layout_max_tensors", "versionAsOf", "timestampAsOf",
      "verify_checksums")
  val BatchBytes: Long = 64L << 20

  private val mapper = Json.mapper

  private def bool(options: Map[String, String], name: String, default: Boolean): Boolean =
    io.safetensors.spark.internal.ConnectorOptions.boolean(options.get(name), s"option '$name'", default)

  /** `options` with case-insensitive keys (Spark's CaseInsensitiveStringMap, lower-cased). */
  def parse(options: Map[String, String], ignoreCorruptDefault: Boolean,
      ignoreMissingDefault: Boolean = false): ReadOptions = {
    val o = options.map { case (k, v) => k.toLowerCase -> v }
    val unknown = o.keySet -- Keys.map(_.toLowerCase) -- StreamOptions.Keys.map(_.toLowerCase) --
      Set("path", "paths")
    if (unknown.nonEmpty) {
      throw new IllegalArgumentException(
        s"safetensors: unknown read option(s) ${unknown.toSeq.sorted.map(k => s"'$k'").mkString(", ")}; " +
          s"valid read options: ${Keys.mkString(", ")}; readStream options: " +
          StreamOptions.Keys.mkString(", "))
    }
    val paths = o.get("paths").toSeq.flatMap { json =>
      mapper.readTree(json).elements().asScala.map(_.asText()).toSeq
    } ++ o.get("path").toSeq
    if (paths.isEmpty) {
      throw new IllegalArgumentException(
        "safetensors: no path given; use spark.read.format(\"safetensors\").load(path, ...)")
    }
    // the layout's values are the engine's (`RowLayoutOption`): a value it refuses is refused here
    NativeLib.ensureLoaded()
    val givenLayout = o.get("layout").map(NativeReader.layoutOption)
    // `inferSchema` is the other Spark connector's way to read files (reading.md §2): one row per file,
    // a column per tensor, which is our `file` layout; the schema always comes from the headers
    val layout = o.get("inferschema").map(_.trim.toLowerCase) match {
      case None => givenLayout.getOrElse("auto")
      case Some("true") => givenLayout match {
        case None | Some("file") => "file"
        case Some(other) => throw new IllegalArgumentException(
          s"safetensors: option 'inferSchema' = true reads one row per file (layout 'file'); it " +
            s"cannot be combined with layout '$other': drop one of the two options")
      }
      case Some(other) => throw new IllegalArgumentException(
        s"safetensors: option 'inferSchema' (the other connector's name for layout 'file') can " +
          s"only be true, got '$other': the schema always comes from the files' headers; use " +
          s"option 'layout' (${NativeReader.layoutOptionNames()}) to choose the rows")
    }
    val batchRows = o.get("read_batch_rows").map { v =>
      val n = scala.util.Try(v.trim.toLong).getOrElse(-1L)
      if (n < 1 || n > Int.MaxValue) {
        throw new IllegalArgumentException(
          s"safetensors: option 'read_batch_rows' must be an integer in [1, ${Int.MaxValue}], got '$v'")
      }
      n
    }.getOrElse(4096L)
    // the per-file layout's limit on tensors (columns) per file and over the scan (reading.md
    // §2.3); the default is the engine's
    val maxTensors = o.get("file_layout_max_tensors").map { v =>
      val n = scala.util.Try(v.trim.toLong).getOrElse(-1L)
      if (n < 1) {
        throw new IllegalArgumentException(
          s"safetensors: option 'file_layout_max_tensors' must be a positive integer, got '$v'")
      }
      n
    }
    // time travel (spec/reading.md §1.1): the values are checked by the engine (Rust) when the
    // dataset's log is read; both at once is refused here
    val versionAsOf = o.get("versionasof")
    val timestampAsOf = o.get("timestampasof")
    if (versionAsOf.isDefined && timestampAsOf.isDefined) {
      throw new IllegalArgumentException(
        "safetensors: give one of the options 'versionAsOf' and 'timestampAsOf', not both")
    }
    ReadOptions(paths, layout, bool(o, "recursivefilelookup", default = true),
      bool(o, "ignorecorruptfiles", ignoreCorruptDefault), batchRows,
      bool(o, "ignoremissingfiles", ignoreMissingDefault), maxTensors, versionAsOf, timestampAsOf,
      // every shard a task reads is checked whole against its manifest's crc32c
      // (spec/reading.md §5, "Checksums")
      bool(o, "verify_checksums", default = false),
      // readStream's own options (spec/reading.md §8), checked here so a bad value fails load()
      StreamOptions.parse(o))
  }
}

/**
 * What a table reads: one dataset tree ([[ReadSource]]) or the Hive-style partition directories
 * under a root ([[PartitionedSource]]).
 */
private[spark] trait TableSource {
  def options: ReadOptions
  def conf: Configuration
  /** Layout, schema (partition columns last), metadata columns, excluded files. */
  def description: Description
  /** The partition columns (the last columns of `description.schema`); empty when none. */
  def partitionSchema: StructType = new StructType()
  /** For the scan's description, e.g. `files=3`. */
  def summary: String
  /** The input partitions of a scan of `required` (`partitionFilters` name partition columns only). */
  def plan(required: StructType, predicates: Seq[ReadPredicate], partitionFilters: Seq[Filter],
      maxPartitionBytes: Long, openCostBytes: Long, minPartitions: Int): Seq[SafetensorsInputPartition]
}

/** A listed file. `header` is filled in when read. */
private[spark] final case class ListedFile(uri: String, length: Long)

/**
 * The files and manifests a read covers, and the driver's conversations with the Rust planner
 * (which answers `need_headers` until it has every header it wants, and `need_index` when a
 * dataset's `_tensor_index.parquet` can serve a key lookup instead of its headers).
 */
private[spark] final class ReadSource(val options: ReadOptions, val conf: Configuration,
    chosen: Option[ReadSource.Listing] = None) extends TableSource {
  import ReadSource._

  override def summary: String = s"files=${files.size}"

  override def plan(required: StructType, predicates: Seq[ReadPredicate],
      partitionFilters: Seq[Filter], maxPartitionBytes: Long, openCostBytes: Long,
      minPartitions: Int): Seq[SafetensorsInputPartition] =
    planSpecs(required, predicates, maxPartitionBytes, openCostBytes, minPartitions).map {
      case (json, bytes) => SafetensorsInputPartition(json, bytes)
    }

  val (files: Seq[ListedFile], manifests: Seq[(String, String)], indexes: Map[String, String]) =
    chosen.map(l => (l.files, l.manifests, Map.empty[String, String])).getOrElse(list())

  /** Header JSON text (or the error that stopped reading it) per file URI. */
  private val headers = mutable.Map[String, Either[String, String]]()

  /** Index summaries (`NativeReader.indexEntries` JSON) per (dir, predicates JSON). */
  private val summaries = mutable.Map[(String, String), JsonNode]()

  /**
   * Files, manifests (dir → text) and, for a directory with a manifest, its
   * `_tensor_index.parquet` (dir → URI; read only when the planner asks, `need_index`).
   *
   * The walk (spec/reading.md §1): a directory holding a manifest is a dataset, listed at its
   * top level only (its shards have no directory part; what the manifest lists the Rust planner
   * decides, and it leaves out any file below a manifest's directory); other directories are
   * walked recursively. Each directory is entered once and each file listed once, by its real
   * path on the local file system (symbolic links resolved), so a link loop ends at once and a
   * file or directory reached by a second name is not read twice; a dataset's own files are
   * always listed under the dataset's name.
   */
  private def list(): (Seq[ListedFile], Seq[(String, String)], Map[String, String]) = {
    // uri → (file, its path, in a dataset); real names are resolved only where two names of one
    // file can meet (a file outside a dataset), not once per shard of a dataset
    val found = mutable.LinkedHashMap[String, (ListedFile, FileSystem, Path, Boolean)]()
    val manifests = mutable.LinkedHashMap[String, String]()
    val indexes = mutable.LinkedHashMap[String, String]()
    val entered = mutable.Set[String]()
    def addFile(fs: FileSystem, path: Path, uri: String, length: Long, inDataset: Boolean): Unit =
      if (!found.contains(uri)) found(uri) = (ListedFile(uri, length), fs, path, inDataset)
    def walk(fs: FileSystem, dir: Path): Unit = if (entered.add(realName(fs, dir))) {
      val children = DatasetFiles.listChildren(fs, dir)
      val manifest = children.find(c => c.isFile && c.name == DatasetFiles.ManifestName)
      manifest.foreach { m =>
        val key = dir.toString.stripSuffix("/")
        val text = manifests.getOrElseUpdate(key,
          if (timeTravel) versionText(fs, dir, children) else DatasetFiles.readText(fs, m.path))
        // the index directory: one part per shard (spec/dataset.md §6.1), read when asked
        // (a linked one is not used, spec/dataset.md §5.9: the shards' headers answer)
        children.find(c => c.isDirectory && c.name == DatasetFiles.IndexDir)
          .filter(i => DatasetFiles.isOwnSubdir(fs, i.path)).foreach { i =>
          indexes.getOrElseUpdate(key, i.uri)
        }
      }
      // sorted by URI, made once per child (a sort by `getPath.toString` made it at every
      // comparison: 3.4 million URI decodes, 40 % of planning a dataset of 100,000 shards)
      children.filterNot(c => DatasetFiles.isHidden(c.name)).sortBy(_.uri).foreach { c =>
        if (c.isDirectory) { if (options.recursive && manifest.isEmpty) walk(fs, c.path) }
        else if (c.name.endsWith(DatasetFiles.Extension)) addFile(fs, c.path, c.uri, c.length, manifest.nonEmpty)
      }
    }
    options.paths.foreach { raw =>
      val path = new Path(raw)
      val fs = path.getFileSystem(conf)
      val qualified = fs.makeQualified(path)
      val isGlob = raw.exists(c => "*?[{".contains(c))
      val matches = Option(fs.globStatus(qualified)).map(_.toSeq).getOrElse(Seq.empty)
      if (matches.isEmpty) {
        throw new IllegalArgumentException(s"safetensors: path does not exist: $qualified")
      }
      matches.sortBy(_.getPath.toString).foreach { s =>
        if (s.isDirectory) walk(fs, s.getPath)
        else if (!isGlob || DatasetFiles.isShardName(s.getPath.getName)) {
          addFile(fs, s.getPath, s.getPath.toString, s.getLen, inDataset = false)
        }
      }
    }
    if (timeTravel && manifests.isEmpty) {
      throw new IllegalArgumentException("safetensors: options 'versionAsOf' and 'timestampAsOf' " +
        s"read a version of a dataset; no dataset (${DatasetFiles.ManifestName}) found under " +
        options.paths.mkString(", "))
    }
    // one file, one name: a dataset's files keep theirs, others the first found
    val kept = if (found.values.forall(_._4)) found.values.map(_._1) else {
      val taken = mutable.Set[String]() ++ found.values.collect {
        case (_, fs, path, true) => realName(fs, path)
      }
      found.values.collect {
        case (f, _, _, true) => f
        case (f, fs, path, false) if taken.add(realName(fs, path)) => f
      }
    }
    (kept.toSeq.sortBy(_.uri), manifests.toSeq, indexes.toMap)
  }

  private def timeTravel: Boolean = options.versionAsOf.isDefined || options.timestampAsOf.isDefined

  /**
   * The manifest of the version `versionAsOf` / `timestampAsOf` names in the dataset `dir`
   * (spec/dataset.md §5.8): the log entry the engine selects, after the engine has checked that
   * every shard it lists is there with its recorded size (else an error naming version and
   * shard: never a partial read). The sizes are the directory's listing (`children`), not a
   * status request per shard: 100,000 of them on an object store.
   */
  private def versionText(fs: FileSystem, dir: Path, children: Seq[DatasetFiles.Child]): String = {
    NativeLib.ensureLoaded()
    val logDir = new Path(dir, DatasetCommit.LogDir)
    // a linked _manifest_log is refused naming it (spec/dataset.md §5.9)
    val entries = if (DatasetFiles.ownDir(fs, dir, DatasetCommit.LogDir).isEmpty) mapper.createArrayNode()
    else LogReads.entries(fs, logDir, withTexts = options.timestampAsOf.isDefined)
    val version = NativeVersions.selectVersion(mapper.writeValueAsString(entries),
      options.versionAsOf.orNull, options.timestampAsOf.orNull)
    // the version's whole manifest, rebuilt from its checkpoint and entries (spec/dataset.md §5.10)
    val text = DatasetCommit.rebuildListing(fs, logDir, version)
    // a shard's name has no directory part (§1): the files beside the manifest are all there is
    val found = mapper.createObjectNode()
    children.filter(c => c.isFile && c.name.endsWith(DatasetFiles.Extension)).foreach(c => found.put(c.name, c.length))
    NativeVersions.checkVersionShards(text, version, mapper.writeValueAsString(found))
    text
  }

  /**
   * Reads and summarises (`NativeReader.indexEntries`) the indexes of `dirs` for
   * `predicatesJson`, unless already done. An index that cannot be read or is invalid becomes `{"error": ...}`: the planner then
   * reads that directory's headers instead.
   */
  private def readIndexes(dirs: Seq[String], predicatesJson: String): Unit =
    dirs.distinct.filterNot(d => summaries.contains((d, predicatesJson))).foreach { dir =>
      val summary = try {
        val uri = indexes.getOrElse(dir, throw new IllegalStateException(
          s"safetensors: the planner asked for an unlisted index in $dir"))
        val text = manifests.collectFirst { case (d, t) if d == dir => t }.getOrElse(
          throw new IllegalStateException(s"safetensors: no manifest for $dir"))
        val indexDir = new Path(uri)
        val fs = indexDir.getFileSystem(conf)
        val out = mapper.createObjectNode()
        val files = out.putObject("files")
        val rows = out.putArray("rows")
        // the parts of the listed shards only; a missing one: the index does not cover them
        mapper.readTree(text).path("shards").elements().asScala.map(_.path("shard_path").asText())
          .foreach { shard =>
            val part = new Path(indexDir, NativeReader.indexPartName(shard))
            val s = lookupPart(fs, part, dir, shard, predicatesJson)
            s.get("files").fields().asScala.foreach(e => files.set[JsonNode](e.getKey, e.getValue))
            s.get("rows").elements().asScala.foreach(r => rows.add(r))
          }
        out
      } catch {
        case e: IllegalStateException => throw e
        case e: Exception => mapper.createObjectNode().put("error", message(e))
      }
      summaries((dir, predicatesJson)) = summary
    }

  /**
   * A key lookup in one index part (`NativeReader.indexPartLookup`): the last 64 KiB first,
   * then whatever the engine asks for (the whole footer, the row groups whose key statistics can
   * hold a wanted key), by positioned reads. Returns the part's IndexSummary.
   */
  private def lookupPart(fs: FileSystem, part: Path, dir: String, shard: String,
      predicatesJson: String): JsonNode = {
    val len = fs.getFileStatus(part).getLen
    val in = fs.open(part)
    try {
      val ranges = mutable.ArrayBuffer[(Long, Long)]()
      val data = new java.io.ByteArrayOutputStream()
      def fetch(start: Long, n: Long): Unit = {
        val buf = new Array[Byte](Math.toIntExact(n))
        in.readFully(start, buf)
        ranges += start -> n
        data.write(buf)
      }
      val tail = math.min(len, 64L * 1024)
      fetch(len - tail, tail)
      var rounds = 0
      while (true) {
        val r = mapper.createArrayNode()
        ranges.foreach { case (s, n) => r.addArray().add(s).add(n) }
        val answer = mapper.readTree(NativeReader.indexPartLookup(dir, shard, len,
          mapper.writeValueAsString(r), data.toByteArray, predicatesJson))
        if (answer.has("summary")) return answer.get("summary")
        rounds += 1
        if (rounds > 3) throw new IllegalStateException(s"safetensors: index part $part: lookup does not converge")
        answer.get("need").elements().asScala.foreach(n => fetch(n.get(0).asLong(), n.get(1).asLong()))
      }
      throw new IllegalStateException("unreachable")
    } finally in.close()
  }

  /** Reads the headers of `uris` in parallel (at most 16 threads). */
  private def readHeaders(uris: Seq[String]): Unit = {
    val todo = uris.filterNot(headers.contains).distinct
    if (todo.isEmpty) return
    val byUri = files.map(f => f.uri -> f).toMap
    val pool = Executors.newFixedThreadPool(math.min(16, todo.size))
    try {
      val futures = todo.map { uri =>
        uri -> pool.submit(new Callable[Either[String, String]] {
          override def call(): Either[String, String] = {
            val length = byUri.get(uri).map(_.length).getOrElse(
              throw new IllegalStateException(s"safetensors: planner asked for unlisted file $uri"))
            try Right(ShardHeaders.validated(new Path(uri), length, conf))
            catch { case e: Exception => Left(message(e)) }
          }
        })
      }
      futures.foreach { case (uri, f) => headers(uri) = f.get() }
    } finally {
      pool.shutdownNow()
      pool.awaitTermination(1, TimeUnit.MINUTES)
    }
  }

  /** The request body shared by describe and plan: files, manifests, ignore_corrupt. */
  private def input(node: ObjectNode, predicatesJson: String): ObjectNode = {
    val fs = node.putArray("files")
    files.foreach { f =>
      val o = fs.addObject().put("file", f.uri).put("length", f.length)
      headers.get(f.uri).foreach {
        case Right(text) => o.put("header", text)
        case Left(err) => o.put("header_error", err)
      }
    }
    // (each manifest's text goes beside the request, `manifestTexts`, in this order)
    val ms = node.putArray("manifests")
    manifests.foreach { case (dir, _) =>
      val m = ms.addObject().put("dir", dir).put("has_index", indexes.contains(dir))
      summaries.get((dir, predicatesJson)).foreach(s => m.set[JsonNode]("index", s))
    }
    node.put("ignore_corrupt", options.ignoreCorruptFiles)
    node.put("ignore_missing", options.ignoreMissingFiles)
    options.fileLayoutMaxTensors.foreach(n => node.put("file_layout_max_tensors", n))
    node
  }

  /**
   * Asks `call` until it answers `ready`, reading in between the headers (`need_headers`) or the
   * dataset indexes (`need_index`, summarised for `predicatesJson`) it asks for.
   */
  private def converse(build: ObjectNode => Unit, call: (String, Array[String]) => String,
      predicatesJson: String = "[]"): JsonNode = synchronized {
    NativeLib.ensureLoaded()
    var rounds = 0
    val texts = manifests.map(_._2).toArray
    while (true) {
      val req = mapper.createObjectNode()
      build(req)
      input(req, predicatesJson)
      val answer = mapper.readTree(call(mapper.writeValueAsString(req), texts))
      if (answer.has("ready")) return answer.get("ready")
      rounds += 1
      if (answer.has("need_index")) {
        val dirs = answer.get("need_index").elements().asScala.map(_.asText()).toSeq
        if (rounds > 4 || dirs.forall(d => summaries.contains((d, predicatesJson)))) {
          throw new IllegalStateException(
            s"safetensors: the planner keeps asking for indexes it was given: ${dirs.take(3)}")
        }
        readIndexes(dirs, predicatesJson)
      } else {
        val need = answer.get("need_headers").elements().asScala.map(_.asText()).toSeq
        if (rounds > 4 || need.forall(headers.contains)) {
          throw new IllegalStateException(
            s"safetensors: the planner keeps asking for headers it was given: ${need.take(3)}")
        }
        readHeaders(need)
      }
    }
    throw new IllegalStateException("unreachable")
  }

  /** Layout, schema, metadata columns and excluded files. */
  lazy val description: Description = {
    val d = converse(_.put("layout", options.layout), NativeReader.describe)
    Description(
      d.get("layout").asText(),
      DataType.fromJson(mapper.writeValueAsString(d.get("schema"))).asInstanceOf[StructType],
      DataType.fromJson(mapper.writeValueAsString(d.get("metadata_columns"))).asInstanceOf[StructType],
      d.get("excluded").elements().asScala.map(e =>
        e.get("file").asText() -> e.get("reason").asText()).toSeq)
  }

  /** The last plan made and its arguments: Spark asks a scan for its partitions more than once
   *  (twice for one `load` + action; 0.6 s each at 100,000 shards), and a source's files and
   *  headers do not change under it. One plan is kept, not one per query of a long-lived
   *  DataFrame (a plan of 100,000 shards is 27 MB of specs). */
  private var lastPlan: Option[(AnyRef, Seq[(String, Long)])] = None

  /** Partition specs (JSON each) and their data bytes. */
  def planSpecs(required: StructType, predicates: Seq[ReadPredicate], maxPartitionBytes: Long,
      openCostBytes: Long, minPartitions: Int): Seq[(String, Long)] = synchronized {
    val key = (required, predicates, maxPartitionBytes, openCostBytes, minPartitions)
    lastPlan.collect { case (k, specs) if k == key => specs }.getOrElse {
      val specs = makePlan(required, predicates, maxPartitionBytes, openCostBytes, minPartitions)
      lastPlan = Some(key -> specs)
      specs
    }
  }

  private def makePlan(required: StructType, predicates: Seq[ReadPredicate], maxPartitionBytes: Long,
      openCostBytes: Long, minPartitions: Int): Seq[(String, Long)] = {
    val preds = mapper.createArrayNode()
    predicates.foreach { p =>
      val v = preds.addObject().put("column", p.column).put("op", p.op).putArray("values")
      p.values.foreach(v.add)
    }
    val parts = converse({ req =>
      req.put("layout", description.layout)
      val r = req.putArray("required")
      required.fields.foreach { f =>
        val c = r.addObject().put("name", f.name)
        f.dataType match {
          // A struct column (Tensor Struct, model_info) or an array of structs (flags) that
          // Spark's nested-column pruning cut to some fields: those fields.
          case s: StructType =>
            val fs = c.putArray("fields")
            s.fieldNames.foreach(fs.add)
          case ArrayType(s: StructType, _) =>
            val fs = c.putArray("fields")
            s.fieldNames.foreach(fs.add)
          case _ =>
        }
      }
      req.set[JsonNode]("predicates", preds)
      req.put("max_partition_bytes", maxPartitionBytes)
      req.put("open_cost_bytes", openCostBytes)
      req.put("min_partitions", minPartitions)
      req.put("batch_rows", options.batchRows)
      req.put("batch_bytes", ReadOptions.BatchBytes)
      req.put("verify_checksums", options.verifyChecksums)
    }, NativeReader.plan, mapper.writeValueAsString(preds))
    parts.elements().asScala.map(p => mapper.writeValueAsString(p) -> p.get("bytes").asLong()).toSeq
  }
}

private[spark] final case class Description(layout: String, schema: StructType,
    metadataColumns: StructType, excluded: Seq[(String, String)])

/** A pushed filter: `column` equal to one of `values` (`op` = in) or starting with one (prefix). */
private[spark] final case class ReadPredicate(column: String, op: String, values: Seq[String])

private[spark] object ReadSource {
  private val mapper = Json.mapper

  /** What a read covers when the caller has chosen it rather than listed the paths: a
   *  micro-batch of readStream reads `files` through `manifests` (dir → text) listing only them
   *  (spec/reading.md §8); no index is used (the planner reads the shards' headers). */
  final case class Listing(files: Seq[ListedFile], manifests: Seq[(String, String)])

  /**
   * What makes two names of one file or directory the same: on the local file system its real
   * path (symbolic links resolved; the name itself when that fails, e.g. a dangling link); on
   * other file systems (object stores have no links) the qualified name.
   */
  def realName(fs: FileSystem, p: Path): String =
    if (fs.getScheme == "file") {
      scala.util.Try(java.nio.file.Paths.get(p.toUri).toRealPath().toString).getOrElse(p.toString)
    } else p.toString

  def message(e: Throwable): String = Option(e.getMessage).getOrElse(e.getClass.getName)
}
