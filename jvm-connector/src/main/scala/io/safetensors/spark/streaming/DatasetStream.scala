package io.safetensors.spark.streaming

import java.nio.charset.StandardCharsets

import scala.collection.mutable

import com.fasterxml.jackson.databind.JsonNode
import io.safetensors.spark.files.DatasetFiles
import io.safetensors.spark.internal.{Json, SerializableConf}
import io.safetensors.spark.jni.NativeLog
import io.safetensors.spark.read.{ListedFile, PartitionedSource, ReadOptions, ReadPredicate,
  ReadSource, SafetensorsReaderFactory, SafetensorsTable, TableSource}
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.connector.read.{InputPartition, PartitionReaderFactory}
import org.apache.spark.sql.connector.read.streaming.{MicroBatchStream, Offset, ReadAllAvailable,
  ReadLimit, ReportsSourceMetrics, SupportsAdmissionControl, SupportsTriggerAvailableNow}
import org.apache.spark.sql.safetensors.SparkInternals
import org.apache.spark.sql.types.StructType

/**
 * `spark.readStream.format("safetensors").load(path)` (spec/reading.md §8): a micro-batch
 * source over the versions of one dataset. Its offsets ([[StreamOffset]]) are positions in the
 * stream's shards: the snapshot it started from, then what each later version added
 * ([[FollowedLog]]: the engine's rule, spec/dataset.md §5.12). Each micro-batch reads its shards
 * through the batch read path ([[ReadSource]] with a manifest listing only them), with the
 * columns the stream was defined with. The same (start, end) offsets plan the same shards after
 * a restart: log entries never change once written.
 *
 * @param table the source the stream was defined on (its schema is the stream's)
 * @param checkpoint the source's directory in the query's checkpoint, where the first start
 *                   position is kept
 */
private[spark] final class DatasetStream(table: ReadSource, required: StructType,
    predicates: Seq[ReadPredicate], checkpoint: String, opts: StreamOptions) extends MicroBatchStream
    with SupportsAdmissionControl with SupportsTriggerAvailableNow with ReportsSourceMetrics {
  import DatasetStream._

  private val (dirKey, _) = table.manifests.head
  private val versions = FollowedLog(dirKey, table.conf, opts.skipChangeCommits)
  private val dir = versions.dir
  /** Trigger.AvailableNow: the latest version when the query started. */
  private var availableNow: Option[Long] = None
  /** The dataset's latest version when the last micro-batch was sized (for [[metrics]]). */
  @volatile private var latestSeen: Option[Long] = None

  /**
   * Where the stream starts, decided once and kept in the checkpoint: a restart before the
   * first batch committed starts at the same place (the snapshot of the version current at the
   * first start, not of a newer one).
   */
  private lazy val start: StreamOffset = {
    val file = new Path(checkpoint, InitialOffsetFile)
    val cfs = file.getFileSystem(SparkInternals.hadoopConf(SparkSession.active, Map.empty[String, String]))
    if (cfs.exists(file)) StreamOffset.parse(DatasetFiles.readText(cfs, file))
    else {
      val o = firstStart()
      cfs.mkdirs(file.getParent)
      val tmp = new Path(file.getParent, s".$InitialOffsetFile.${java.util.UUID.randomUUID()}.tmp")
      val out = cfs.create(tmp, false)
      try out.write(o.json().getBytes(StandardCharsets.UTF_8)) finally out.close()
      // another start that got there first wins; both then read its text
      if (!cfs.rename(tmp, file)) cfs.delete(tmp, false)
      StreamOffset.parse(DatasetFiles.readText(cfs, file))
    }
  }

  private def firstStart(): StreamOffset = {
    val latest = versions.latestVersion()
    (opts.startingVersion, opts.startingTimestamp) match {
      case (Some(None), _) => StreamOffset(latest + 1, 0, snapshot = false)
      case (Some(Some(n)), _) if n > latest => throw new IllegalArgumentException(
        s"safetensors: option '${StreamOptions.StartingVersion}' = $n was never committed; the " +
          s"latest version of $dir is $latest")
      case (Some(Some(n)), _) => StreamOffset(n, 0, snapshot = false)
      case (None, Some(ts)) => StreamOffset(versions.startingVersion(ts), 0, snapshot = false)
      case (None, None) => StreamOffset(latest, 0, snapshot = true)
    }
  }

  override def initialOffset(): Offset = start

  override def deserializeOffset(json: String): Offset = StreamOffset.parse(json)

  override def getDefaultReadLimit: ReadLimit = ReadLimit.maxFiles(opts.maxFilesPerTrigger)

  override def latestOffset(): Offset = throw new UnsupportedOperationException(
    "safetensors: the readStream source admits shards by its limits: latestOffset(start, limit)")

  override def prepareForTriggerAvailableNow(): Unit = availableNow = Some(versions.latestVersion())

  /** The end of the next micro-batch: the shards after `startOffset`, at most
   *  `maxFilesPerTrigger` of them and `maxBytesPerTrigger` bytes (at least one shard), unless
   *  Spark asks for everything (Trigger.Once). Null when there is nothing after `startOffset`:
   *  Spark then runs no batch (not even a first, empty one). */
  override def latestOffset(startOffset: Offset, limit: ReadLimit): Offset = {
    val from = offset(startOffset)
    val unlimited = limit.isInstanceOf[ReadAllAvailable]
    var files = 0
    var bytes = 0L
    val latest = versions.latestVersion()
    latestSeen = Some(latest)
    val end = walk(from, availableNow.getOrElse(latest), strict = false) { s =>
      val b = s.shard.path("bytes").asLong()
      val full = files > 0 && (files >= opts.maxFilesPerTrigger || opts.maxBytesPerTrigger.exists(bytes + b > _))
      if (full && !unlimited) false
      else { files += 1; bytes += b; true }
    }
    if (end == from) null else end
  }

  override def planInputPartitions(startOffset: Offset, endOffset: Offset): Array[InputPartition] = {
    val (from, end) = (offset(startOffset), offset(endOffset))
    val picked = mutable.ArrayBuffer[Shard]()
    val upto = if (end.index == 0 && !end.snapshot) end.version - 1 else end.version
    walk(from, upto, strict = true) { s =>
      s.at.before(end) && { picked += s; true }
    }
    if (picked.isEmpty) return Array.empty
    val src = batchSource(picked.toSeq)
    val spark = SparkSession.active
    val (maxBytes, openCost, _) = SparkInternals.filesConf(spark)
    val parts = src.plan(required, predicates, Seq.empty, maxBytes, openCost,
      SparkInternals.filesMinPartitionNum(spark)).toArray[InputPartition]
    Option(afterPlan).foreach(_(picked.map(_.shard.path("shard_path").asText()).toSeq))
    parts
  }

  /** The batch read of `shards`: their files and the latest manifest (or, when the latest has
   *  no columns, their newest version's) listing only them; its columns must be the stream's. */
  private def batchSource(shards: Seq[Shard]): ReadSource = {
    val records = Json.mapper.createArrayNode()
    shards.foreach(s => records.add(s.shard))
    val text = NativeLog.followManifest(versions.batchManifest(shards.last.at.version),
      Json.mapper.writeValueAsString(records))
    val files = shards.map { s =>
      val name = s.shard.path("shard_path").asText()
      val status = try versions.fs.getFileStatus(new Path(dir, name)) catch {
        case e: java.io.FileNotFoundException => throw new IllegalStateException(
          s"safetensors: readStream of $dir: shard $name, which version ${s.at.version} " +
            s"${if (s.at.snapshot) "lists" else "added"}, is gone (vacuumed before the stream read " +
            "it?); start a new query (a new checkpoint) from a version still kept", e)
      }
      ListedFile(status.getPath.toString, status.getLen)
    }
    val src = new ReadSource(table.options.copy(paths = Seq(dirKey), versionAsOf = None,
      timestampAsOf = None), table.conf, Some(ReadSource.Listing(files, Seq(dirKey -> text))))
    try SafetensorsTable.checkUserSchema(table.description.schema, src)
    catch {
      case e: IllegalArgumentException => throw new IllegalStateException(
        s"safetensors: readStream of $dir: the shards of versions ${shards.head.at.version} to " +
          s"${shards.last.at.version} do not have the columns the stream was defined with (did a " +
          s"skipped version change them?): ${e.getMessage}", e)
    }
    src
  }

  /**
   * Visits the shards after `from` in stream order, through version `upto`, while `visit` takes
   * them; returns the position of the first one it did not take, or the position after `upto`.
   * A version the engine refuses ends the walk before it (its error is thrown when nothing comes
   * before it, or with `strict`: a planned batch never reads less than its offsets say).
   */
  private def walk(from: StreamOffset, upto: Long, strict: Boolean)(visit: Shard => Boolean): StreamOffset = {
    var last = upto
    if (from.snapshot) {
      last = math.max(upto, from.version)
      val shards = versions.snapshot(from.version)
      var i = from.index.toInt
      while (i < shards.length) {
        val at = StreamOffset(from.version, i, snapshot = true)
        if (!visit(Shard(at, shards(i)))) return at
        i += 1
      }
    }
    var v = if (from.snapshot) from.version + 1 else from.version
    while (v <= last) {
      versions.version(v, last) match {
        case Left(e) =>
          if (strict || (!from.snapshot && v == from.version)) throw e
          return StreamOffset(v, 0, snapshot = false)
        case Right(f) =>
          var i = if (!from.snapshot && v == from.version) from.index.toInt else 0
          while (i < f.add.length) {
            val at = StreamOffset(v, i, snapshot = false)
            if (!visit(Shard(at, f.add(i)))) return at
            i += 1
          }
      }
      v += 1
    }
    val next = StreamOffset(last + 1, 0, snapshot = false)
    if (from.before(next)) next else from
  }

  private def offset(o: Offset): StreamOffset = o match {
    case s: StreamOffset => s
    case other => StreamOffset.parse(other.json())
  }

  override def createReaderFactory(): PartitionReaderFactory =
    new SafetensorsReaderFactory(
      SparkSession.active.sparkContext.broadcast(new SerializableConf(table.conf)), required,
      new StructType(), table.options.ignoreCorruptFiles)

  /**
   * The query progress's source metrics (`StreamingQueryProgress.sources(i).metrics`):
   * `latestVersion` (the dataset's, when the last micro-batch was sized), `versionsBehind` (how
   * many versions after the last one the stream consumed whole), and `numFilesOutstanding` /
   * `numBytesOutstanding`: the shards after the consumed offset that the stream would read, over
   * at most [[FollowedLog.Chunk]] versions (`outstandingThroughVersion`: the last version
   * counted; the count stops before a version the stream refuses). Never fails the query: what
   * cannot be counted is left out.
   */
  override def metrics(latestConsumedOffset: java.util.Optional[Offset]): java.util.Map[String, String] = {
    val out = new java.util.LinkedHashMap[String, String]()
    for (latest <- latestSeen; consumed <- Option(latestConsumedOffset.orElse(null)).map(offset)) {
      out.put("latestVersion", latest.toString)
      // the versions after the last one consumed whole (a snapshot in progress is its version's)
      out.put("versionsBehind", math.max(0L, latest - (consumed.version - 1)).toString)
      val through = math.min(latest, consumed.version + FollowedLog.Chunk - 1)
      var files = 0L
      var bytes = 0L
      try {
        walk(consumed, through, strict = false) { s =>
          files += 1; bytes += s.shard.path("bytes").asLong(); true
        }
        out.put("numFilesOutstanding", files.toString)
        out.put("numBytesOutstanding", bytes.toString)
        out.put("outstandingThroughVersion", through.toString)
      } catch { case scala.util.control.NonFatal(_) => () }
    }
    out
  }

  override def commit(end: Offset): Unit = versions.forget(offset(end).version)

  override def stop(): Unit = ()

  override def toString: String = s"SafetensorsStream[$dir]"
}

private[spark] object DatasetStream {
  /** The file in the source's checkpoint directory holding where the stream started. */
  val InitialOffsetFile = "safetensors-initial-offset.json"

  /** Tests only: runs with a micro-batch's shard names once it is planned, before its tasks. */
  @volatile private[spark] var afterPlan: Seq[String] => Unit = null

  /** A shard of the stream at its position. */
  private final case class Shard(at: StreamOffset, shard: JsonNode)

  /** The stream over `src` (a table's source): one dataset, not a partitioned root. */
  def apply(src: TableSource, required: StructType, predicates: Seq[ReadPredicate],
      checkpoint: String, opts: StreamOptions): DatasetStream = src match {
    case _: PartitionedSource => throw new UnsupportedOperationException(
      s"safetensors: readStream follows one dataset's versions; ${src.options.paths.mkString(", ")} " +
        "is a partitionBy root (one dataset per partition directory, spec/dataset.md §7): " +
        "read each partition directory as its own stream (and union them), or read the root " +
        "with spark.read")
    case r: ReadSource =>
      if (!opts.startGiven &&
          (r.options.versionAsOf.isDefined || r.options.timestampAsOf.isDefined)) {
        throw new IllegalArgumentException(
          "safetensors: options 'versionAsOf' and 'timestampAsOf' choose the version of a batch " +
            s"read; a readStream starts with '${StreamOptions.StartingVersion}' or " +
            s"'${StreamOptions.StartingTimestamp}' (or, by default, the latest version's snapshot)")
      }
      if (r.options.paths.size != 1 || r.manifests.size != 1) {
        throw new IllegalArgumentException(
          s"safetensors: readStream follows one dataset: give the path of one dataset directory " +
            s"(holding ${DatasetFiles.ManifestName}); got ${r.options.paths.mkString(", ")}, " +
            s"holding ${r.manifests.size} dataset(s)")
      }
      if (r.description.schema.isEmpty) {
        // an overwrite or delete that left no shard has no columns (spec/dataset.md §5): a
        // stream of no columns would hand its sink rows of nothing
        val (dir, _) = r.manifests.head
        throw new IllegalArgumentException(
          s"safetensors: readStream of $dir: the version its columns come from has none (the " +
            "dataset is empty: an overwrite or a delete left no shard). Give the stream the " +
            s"columns of a version that has rows with option '${StreamOptions.StartingVersion}' " +
            "(a query restarted from its checkpoint reads on from its offsets; the option then " +
            "only chooses the columns), or start it once a version with rows is committed")
      }
      new DatasetStream(r, required, predicates, checkpoint, opts)
  }

  /**
   * The read options a stream's table is described with: its columns are those of the version
   * it starts at (`startingVersion` / `startingTimestamp`: that version, read as `versionAsOf`;
   * otherwise the latest). A start after the latest version reads the latest's columns.
   */
  def schemaOptions(read: ReadOptions, conf: org.apache.hadoop.conf.Configuration): ReadOptions = {
    val s = read.stream
    val version = (s.startingVersion, s.startingTimestamp) match {
      case (Some(Some(n)), _) => Some(n)
      case (None, Some(ts)) if read.paths.size == 1 =>
        val log = FollowedLog(read.paths.head, conf, skipChanges = false)
        Some(log.startingVersion(ts)).filter(_ <= log.latestVersion())
      case _ => None
    }
    version.map(v => read.copy(versionAsOf = Some(v.toString))).getOrElse(read)
  }
}
