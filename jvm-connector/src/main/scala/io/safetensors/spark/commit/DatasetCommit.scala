package io.safetensors.spark.commit

import io.safetensors.spark.internal.Json
import java.io.{File, IOException}
import java.nio.channels.FileChannel
import java.nio.charset.StandardCharsets
import java.nio.file.{FileAlreadyExistsException, Files}
import java.nio.file.StandardCopyOption.ATOMIC_MOVE
import java.nio.file.StandardOpenOption.{CREATE, READ, TRUNCATE_EXISTING, WRITE}

import io.safetensors.spark.files.{DatasetFiles, LogReads}
import io.safetensors.spark.files.DatasetFiles.{ManifestName, readText}
import io.safetensors.spark.jni.{NativeLog, NativeNames}
import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FileContext, FileSystem, LocalFileSystem, Options, Path}

/**
 * The commit protocol of a dataset directory (spec/dataset.md §5.3): every commit is one
 * versioned manifest `_manifest_log/<version, 20 digits>.json`, created only if that version does
 * not exist yet (hard link on a local file system, rename-without-overwrite elsewhere), so two
 * writers can never both commit the same version; `dataset_manifest.json` is then replaced by
 * the latest version's text. A writer whose version was taken reads the newest version again (a
 * batch append its own log entry, the head; other writes its whole manifest) and tries again on
 * top of it.
 *
 * Local destinations go through java.nio (no forked `chmod`, fsync of files and directories);
 * others through Hadoop's FileContext.
 */
private[spark] final class DatasetCommit(fs: FileSystem, dest: Path, conf: Configuration,
    localDest: Option[File]) {
  import DatasetCommit._

  private val logDir = new Path(dest, LogDir)
  private val smallFs: FileSystem = fs match {
    case l: LocalFileSystem => l.getRawFileSystem
    case other => other
  }

  /** The latest committed manifest: (version, text), or None when the directory has none. The
   *  version is the larger of the log's newest entry and `dataset_manifest.json`'s own
   *  `manifest_version` (0 for a manifest written by another tool, or before the log existed). */
  def latest(): Option[(Long, String)] = latestWithSource().map { case (v, text, _) => (v, text) }

  /** [[latest]] and the file its text was read from (`dataset_manifest.json` or a log entry),
   *  for errors that name it. */
  def latestWithSource(): Option[(Long, String, Path)] = {
    val published = new Path(dest, ManifestName)
    val pub: Option[(Long, String, Path)] =
      if (fs.exists(published)) {
        val text = readText(fs, published)
        Some((versionOf(text), text, published))
      } else None
    newestVersion(pub.map(_._1)) match {
      case Some(v) if pub.forall(_._1 < v) => Some((v, manifestAt(v), new Path(logDir, logName(v))))
      case _ => pub
    }
  }

  /** The log's newest version, probed from `known` (a version the caller read: two probes when
   *  that is still the newest), else listed; None when the log has no entry. */
  def newest(known: Option[Long]): Option[Long] = newestVersion(known)

  /** The text of `version`'s own log entry; None when it is not there (pruned). */
  def entryText(version: Long): Option[String] =
    try Some(readText(fs, new Path(logDir, logName(version))))
    catch { case _: java.io.FileNotFoundException => None }

  /** [[latest]] for a writer that read `known` (version, text) a moment ago: `known` itself,
   *  without reading or scanning the manifest again, while the log has no entry after it (one
   *  probe: entries are created in version order); else [[latest]]. */
  def latestAfter(known: Option[(Long, String)]): Option[(Long, String)] = known match {
    case Some((v, _)) if v > 0 && !hasEntry(v + 1) && hasEntry(v) => known
    case _ => latest()
  }

  /** The log's newest version, `known` being the version of `dataset_manifest.json`: two probes
   *  when that is the newest (its entry there, the next one not: entries are created in version
   *  order and pruned from the oldest), else the log is listed (spec/dataset.md §5.10). */
  private def newestVersion(known: Option[Long]): Option[Long] = known match {
    case Some(k) if k > 0 && !hasEntry(k + 1) && hasEntry(k) => Some(k)
    case _ => logVersions().lastOption
  }

  private def hasEntry(version: Long): Boolean = fs.exists(new Path(logDir, logName(version)))

  /** Names of the log's files (entries, checkpoints, others), as listed now. */
  private def logNames(): Seq[(String, Long)] =
    if (DatasetFiles.ownDir(fs, dest, LogDir).isEmpty) Seq.empty
    else fs.listStatus(logDir).toSeq.map(s => (s.getPath.getName, s.getModificationTime))

  /** The whole manifest text of `version`, rebuilt from the log by the engine's rule
   *  (spec/dataset.md §5.10): its newest checkpoint at or below it and the entries after. */
  def manifestAt(version: Long): String = DatasetCommit.rebuildListing(fs, logDir, version)

  /** Versions in the log, ascending. A `_manifest_log` that is a symbolic link is refused naming
   *  it (spec/dataset.md §5.9): a writer, a vacuum or a compaction never reads or extends
   *  another dataset's log through it. */
  def logVersions(): Seq[Long] =
    if (DatasetFiles.ownDir(fs, dest, LogDir).isEmpty) Seq.empty
    else fs.listStatus(logDir).toSeq.flatMap(s => parseLogName(s.getPath.getName)).sorted

  /**
   * Tries to commit `text` as `version`, built on `baseVersion`: false if that version exists
   * already (another writer committed first), or if the base's log entry is gone (pruned: far
   * behind, so read the latest again). A created version is never removed: other writers may
   * already have built on it.
   */
  def tryCommit(version: Long, base: Option[(Long, String)], text: String, writeId: String): Boolean =
    tryCommit(version, base.map(_._1).getOrElse(0L), text,
      NativeLog.logEntry(base.map(_._2).orNull, text), writeId)

  /** [[tryCommit]] with the version's log entry made already (a writer's [[CommitAnswer]]). The
   *  version's whole manifest `text` is used only by the chores when a checkpoint is due (or the
   *  log is listed for them): a commit on the base's head does not make it otherwise. */
  def tryCommit(version: Long, baseVersion: Long, text: => String, entry: String,
      writeId: String, baseEntryRead: Option[String] = None): Boolean = {
    DatasetFiles.ownDir(fs, dest, LogDir) // a linked log is refused (§5.9), never written through
    // the base's own entry (small: what it changed); gone means pruned, so read the latest again
    // (a commit on the base's head read it already: not read twice)
    val baseEntry: Option[String] =
      if (baseVersion <= 0) None
      else if (baseEntryRead.isDefined) baseEntryRead
      else {
        try Some(readText(fs, new Path(logDir, logName(baseVersion))))
        catch {
          case _: java.io.FileNotFoundException =>
            if (logVersions().nonEmpty) return false
            None
        }
      }
    // the entry records what the version changes (spec/dataset.md §5.10), not the whole manifest
    val created = createLogFile(logName(version), entry, writeId)
    // the chores are best effort: the version is committed whatever they meet (a checkpoint not
    // written is written by a later commit; a reader then replays more entries). They list the
    // log only when they may have work (the engine's rule: a checkpoint version, an older log)
    if (created) {
      try {
        if (NativeLog.choresNeedListing(entry, baseEntry.orNull, false)) {
          afterCommit(version, text, pruneEntries = false, writeId)
        }
      } catch { case scala.util.control.NonFatal(_) => }
    }
    created
  }

  /** The committer's chores once `version`'s entry exists (the engine's rule): its checkpoint
   *  when due, superseded checkpoints and, with `pruneEntries` (retention 0), the log below the
   *  newest checkpoint far enough behind removed. Best effort: a reader that finds a file gone
   *  lists again; a failed checkpoint is written by a later commit. */
  private def afterCommit(version: Long, text: String, pruneEntries: Boolean, writeId: String): Unit = {
    val listing = mapper.createArrayNode()
    logNames().foreach { case (n, t) => listing.addObject().put("name", n).put("modified_ms", t) }
    val chores = mapper.readTree(NativeLog.afterCommit(mapper.writeValueAsString(listing), version,
      text, pruneEntries, System.currentTimeMillis()))
    if (chores.path("write_checkpoint").asBoolean(false)) {
      try createLogFile(NativeNames.checkpointFileName(version), text, writeId)
      catch { case _: IOException => }
    }
    chores.path("delete").elements().forEachRemaining { n =>
      try fs.delete(new Path(logDir, n.asText()), false) catch { case _: IOException => }
    }
  }

  /** Creates `_manifest_log/<name>` with `text` only if it does not exist: false if it does. */
  private def createLogFile(name: String, text: String, writeId: String): Boolean = {
    val bytes = text.getBytes(StandardCharsets.UTF_8)
    localDest match {
      case Some(d) =>
        val dir = new File(d, LogDir)
        Files.createDirectories(dir.toPath)
        val tmp = new File(dir, s".${name}.$writeId.tmp")
        writeSynced(tmp, bytes)
        try {
          Files.createLink(new File(dir, name).toPath, tmp.toPath)
          syncDir(dir)
          true
        } catch {
          case _: FileAlreadyExistsException => false
        } finally Files.deleteIfExists(tmp.toPath)
      case None if ObjectStoreCommit.isS3A(fs) =>
        // S3: one PUT with If-None-Match: * (a rename there is an existence check and a copy)
        S3ConditionalCreate.createIfAbsent(fs, new Path(logDir, name), bytes)
      case None =>
        fs.mkdirs(logDir)
        val tmp = new Path(logDir, s".${name}.$writeId.tmp")
        val out = smallFs.create(tmp, true)
        try out.write(bytes) finally out.close()
        try {
          FileContext.getFileContext(dest.toUri, conf)
            .rename(tmp, new Path(logDir, name), Options.Rename.NONE)
          true
        } catch {
          case _: org.apache.hadoop.fs.FileAlreadyExistsException | _: FileAlreadyExistsException =>
            false
        } finally if (fs.exists(tmp)) fs.delete(tmp, false)
    }
  }

  /**
   * Replaces `dataset_manifest.json` with the latest committed version's text, starting from the
   * just committed `version`; repeats while a newer version appears, so the last writer to
   * publish leaves the newest manifest even when publications of two commits overlap.
   */
  def publish(version: Long, text: String, writeId: String): Unit = {
    var (v, t) = (version, text)
    var done = false
    while (!done) {
      replaceManifest(t, writeId)
      // a newer version committed meanwhile: one probe, a listing only then
      (if (hasEntry(v + 1)) logVersions().lastOption else None) match {
        case Some(newer) if newer > v =>
          v = newer
          t = manifestAt(newer)
        case _ => done = true
      }
    }
  }

  private def replaceManifest(text: String, writeId: String): Unit = {
    val bytes = text.getBytes(StandardCharsets.UTF_8)
    val tmpName = s".$ManifestName.$writeId.tmp"
    localDest match {
      case Some(d) =>
        val tmp = new File(d, tmpName)
        writeSynced(tmp, bytes)
        Files.move(tmp.toPath, new File(d, ManifestName).toPath, ATOMIC_MOVE)
        syncDir(d)
      case None if ObjectStoreCommit.applies(fs) =>
        // one PUT replaces the object whole (a rename would be a copy, §5.6)
        val out = fs.create(new Path(dest, ManifestName), true)
        try out.write(bytes) finally out.close()
      case None =>
        val tmp = new Path(dest, tmpName)
        val out = smallFs.create(tmp, true)
        try out.write(bytes) finally out.close()
        FileContext.getFileContext(dest.toUri, conf)
          .rename(tmp, new Path(dest, ManifestName), Options.Rename.OVERWRITE)
    }
  }

  /** After a commit of a dataset with retention 0 (nothing kept for time travel): the log below
   *  the newest checkpoint at least [[KeptVersions]] versions behind `version` is removed once it
   *  is an hour old (the engine's rule, spec/dataset.md §5.10): a writer that read one of those
   *  versions as its base long ago finds its entry gone and reads the latest again. */
  def prune(version: Long, text: String, writeId: String): Unit =
    afterCommit(version, text, pruneEntries = true, writeId)
}

private[spark] object DatasetCommit {
  val LogDir: String = NativeNames.MANIFEST_LOG_DIR
  /** Log entries kept behind the newest by the prune of a retention-0 commit (Rust's bound). */
  val KeptVersions: Long = NativeNames.LOG_KEPT_VERSIONS

  private val mapper = Json.mapper

  /** Tests only: called with the version a commit attempt is about to create, after the attempt
   *  read its base (lets a test make concurrent writers race for one version). */
  @volatile private[spark] var beforeCreate: Long => Unit = null

  /** How many times a commit is tried on top of newer versions before it fails (Rust's bound). */
  val MaxCommitAttempts: Int = NativeNames.MAX_COMMIT_ATTEMPTS

  def logName(version: Long): String = NativeNames.manifestLogFileName(version)

  /** [[rebuild]] on the log as listed now ([[LogReads.withListing]]: listed again when a file is
   *  removed after the listing). */
  def rebuildListing(fs: FileSystem, logDir: Path, version: Long): String =
    LogReads.withListing(fs, logDir)(names => rebuild(fs, logDir, names, version))

  /** The whole manifest text of `version` from the log in `logDir` whose file names are `names`
   *  (rebuilt by the engine: a checkpoint and the entries after it, spec/dataset.md §5.10). */
  def rebuild(fs: FileSystem, logDir: Path, names: Seq[String], version: Long): String = {
    val namesJson = mapper.writeValueAsString(names.toArray)
    LogReads.converse(fs, logDir, s"rebuilding version $version") { read =>
      NativeLog.rebuild(namesJson, version, read)
    }.get("manifest").asText()
  }

  /** The version of a `_manifest_log/` entry's name, None for another name. A name of 20 digits
   *  beyond the largest version is an error naming it (spec/dataset.md §5.9), never a bare
   *  NumberFormatException. */
  def parseLogName(name: String): Option[Long] =
    Some(NativeNames.parseManifestLogFileName(name)).filter(_ >= 0)

  /** The version of a `_manifest_log/` checkpoint's name, None for another name. */
  def parseCheckpointName(name: String): Option[Long] =
    Some(NativeNames.parseCheckpointFileName(name)).filter(_ >= 0)

  /** The version of an index part of the layout before per-shard parts, None for another name. */
  def parseIndexPartName(name: String): Option[Long] =
    Some(NativeNames.parseIndexPartFileName(name)).filter(_ >= 0)

  /** `manifest_version` of a manifest's text; 0 when it has none (or is not JSON: its parse
   *  fails later, with the reason, where it is used). */
  def versionOf(text: String): Long =
    try Json.topLevelLong(text, "manifest_version").getOrElse(0L)
    catch { case _: Exception => 0L }

  def writeSynced(f: File, bytes: Array[Byte]): Unit = {
    val ch = FileChannel.open(f.toPath, CREATE, TRUNCATE_EXISTING, WRITE)
    try {
      val buf = java.nio.ByteBuffer.wrap(bytes)
      while (buf.hasRemaining) ch.write(buf)
      ch.force(true)
    } finally ch.close()
  }

  def syncDir(dir: File): Unit = {
    val ch = FileChannel.open(dir.toPath, READ)
    try ch.force(true) finally ch.close()
  }
}

/**
 * The engine's answer to a writer's commit attempt (`NativeWriter.nextManifest` /
 * `nextStreamManifest`, or `NativeLog.appendOnHead`): the version it would create on
 * `baseVersion`, its log entry (a text, never parsed here), the base's shards it no longer lists,
 * whether they are kept for older versions (`retain`: the retention is not 0, spec/dataset.md
 * §5.8.1), and its whole manifest, made on first use: a commit on the base's head makes it only
 * after its version exists, to publish it.
 */
private[spark] final class CommitAnswer(val baseVersion: Long, val version: Long,
    manifestText: () => String, val entry: String, val superseded: Seq[String],
    val retain: Boolean, val baseEntry: Option[String] = None) {
  lazy val manifest: String = manifestText()
}

private[spark] object CommitAnswer {
  /** From the engine's `String[3]`: {answer JSON, manifest, entry}. */
  def apply(baseVersion: Long, texts: Array[String]): CommitAnswer = {
    require(texts != null && texts.length == 3, "safetensors: a commit answer is three texts")
    val manifest = texts(1)
    fromAnswer(Json.mapper.readTree(texts(0)), baseVersion, texts(2), () => manifest)
  }

  /** From the answer's JSON ({"version", "superseded", "retain"}), the entry and how to make the
   *  manifest. */
  def fromAnswer(a: com.fasterxml.jackson.databind.JsonNode, baseVersion: Long, entry: String,
      manifest: () => String, baseEntry: Option[String] = None): CommitAnswer = {
    val superseded = Seq.newBuilder[String]
    a.get("superseded").elements().forEachRemaining(n => superseded += n.asText())
    // an answer without the field keeps the files: a leftover is vacuumed, a deletion is final
    new CommitAnswer(baseVersion, a.get("version").asLong(), manifest, entry, superseded.result(),
      a.path("retain").asBoolean(true), baseEntry)
  }
}
