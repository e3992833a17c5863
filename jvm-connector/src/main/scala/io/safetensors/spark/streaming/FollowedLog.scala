package io.safetensors.spark.streaming

import scala.collection.mutable
import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.JsonNode
import io.safetensors.spark.commit.DatasetCommit
import io.safetensors.spark.files.LogReads
import io.safetensors.spark.internal.Json
import io.safetensors.spark.jni.{NativeLib, NativeLog, NativeVersions, SafetensorsDatasetException}
import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FileSystem, Path}

/** One version as a follower sees it (spec/dataset.md §5.12): `followed` is `rows`, `nothing` or
 *  `skipped`; `add`, the shard records to read, sorted by name. */
private[spark] final case class FollowedVersion(version: Long, followed: String, add: Vector[JsonNode])

/**
 * The log of the dataset `dir` as a readStream follows it. The JVM lists and reads
 * `_manifest_log/` through Hadoop ([[LogReads]]); what each version gives the follower is the
 * engine's rule (`NativeLog.follow`, spec/dataset.md §5.12), the snapshot of a version its
 * rebuild (`NativeLog.rebuild`), the version a start time names its rule
 * (`NativeVersions.startingVersion`). Log entries never change once written, so what was asked
 * is kept until the stream commits past it. Driver side, one stream's thread.
 */
private[spark] final class FollowedLog(val fs: FileSystem, val dir: Path, conf: Configuration,
    skipChanges: Boolean) {
  import FollowedLog._

  private val logDir = new Path(dir, DatasetCommit.LogDir)
  private val commit = new DatasetCommit(fs, dir, conf, None)
  private val followed = mutable.TreeMap[Long, FollowedVersion]()
  private var refused: Option[(Long, Exception)] = None
  private val snapshots = mutable.Map[Long, Vector[JsonNode]]()
  private var base: Option[(Long, String, Boolean)] = None
  private val ownManifests = mutable.Map[Long, String]()

  /** The latest committed version; a dataset with no log (written by another tool) is refused:
   *  there are no versions to follow. */
  def latestVersion(): Long = {
    NativeLib.ensureLoaded()
    commit.logVersions().lastOption.getOrElse(throw new IllegalArgumentException(
      s"safetensors: readStream follows the versions of a dataset (its ${DatasetCommit.LogDir}/); " +
        s"$dir has none (no dataset, or one written by another tool): read it with spark.read"))
  }

  /** The latest version's whole manifest, and whether it has no columns (an empty dataset). */
  private def latestManifest(): (String, Boolean) = {
    val latest = commit.latest().getOrElse(throw new IllegalStateException(
      s"safetensors: readStream of $dir: the dataset's manifest is gone"))
    if (!base.exists(_._1 == latest._1)) {
      base = Some((latest._1, latest._2, Json.mapper.readTree(latest._2).path("schema").isEmpty))
    }
    (base.get._2, base.get._3)
  }

  /**
   * The whole manifest a micro-batch of shards up to version `version` is read with (the
   * columns and settings; `NativeLog.followManifest` makes it list only the batch's shards): the
   * latest version's, unless that one has no columns (an overwrite or delete left no shard),
   * then version `version`'s own.
   */
  def batchManifest(version: Long): String = latestManifest() match {
    case (text, false) => text
    case _ => ownManifests.getOrElseUpdate(version, DatasetCommit.rebuildListing(fs, logDir, version))
  }

  /** The shard records of version `version`'s whole manifest, sorted by name (a snapshot). */
  def snapshot(version: Long): Vector[JsonNode] = snapshots.getOrElseUpdate(version, {
    val text = DatasetCommit.rebuildListing(fs, logDir, version)
    Json.mapper.readTree(text).path("shards").elements().asScala.toVector
      .sortBy(_.path("shard_path").asText())
  })

  /**
   * What version `v` gives the follower (`upto`: the newest version that may be asked for in
   * the same read), or the engine's refusal of it: a version that removes rows (unless
   * skipChangeCommits), changes the columns, or is no longer in the log. The versions after `v`
   * up to [[Chunk]] are asked at once; when the engine refuses one of them, they are asked one at
   * a time, so the versions before the refused one are still read.
   */
  def version(v: Long, upto: Long): Either[Exception, FollowedVersion] = {
    if (!followed.contains(v) && !refused.exists(_._1 == v)) {
      val end = math.min(upto, v + Chunk - 1)
      try fetch(v - 1, end)
      catch {
        case _: SafetensorsDatasetException =>
          var cur = v
          try {
            while (cur <= end) { fetch(cur - 1, cur); cur += 1 }
          } catch { case e: SafetensorsDatasetException => refused = Some(cur -> e) }
      }
    }
    followed.get(v).map(Right(_)).getOrElse(Left(refused.filter(_._1 == v).map(_._2).getOrElse(
      new IllegalStateException(s"safetensors: readStream of $dir: version $v was not followed"))))
  }

  private def fetch(after: Long, upto: Long): Unit = LogReads.withListing(fs, logDir) { names =>
    val namesJson = Json.mapper.writeValueAsString(names.toArray)
    val answer = LogReads.converse(fs, logDir, s"following versions ${after + 1} to $upto") { read =>
      NativeLog.follow(namesJson, after, upto, read, skipChanges, StreamOptions.SkipChangeCommits)
    }
    answer.get("versions").elements().asScala.foreach { n =>
      val v = n.get("version").asLong()
      followed(v) = FollowedVersion(v, n.path("followed").asText(),
        n.path("add").elements().asScala.toVector)
    }
  }

  /** The version a stream given `startingTimestamp` starts at: the first committed at or after
   *  it, one past the latest when none was (the engine's rule). */
  def startingVersion(timestamp: String): Long = {
    latestVersion()
    NativeVersions.startingVersion(
      Json.mapper.writeValueAsString(LogReads.entries(fs, logDir, withTexts = true)), timestamp)
  }

  /** Forgets what was asked about versions before `version` (the stream committed past them). */
  def forget(version: Long): Unit = {
    followed.keys.takeWhile(_ < version).toList.foreach(followed.remove)
    snapshots.keys.filter(_ < version).toList.foreach(snapshots.remove)
    ownManifests.keys.filter(_ < version).toList.foreach(ownManifests.remove)
  }
}

private[spark] object FollowedLog {
  /** Versions asked of the engine at once. */
  val Chunk: Int = 100

  /** The log of the one dataset at `path`. */
  def apply(path: String, conf: Configuration, skipChanges: Boolean): FollowedLog = {
    val p = new Path(path)
    val fs = p.getFileSystem(conf)
    new FollowedLog(fs, fs.makeQualified(p), conf, skipChanges)
  }
}
