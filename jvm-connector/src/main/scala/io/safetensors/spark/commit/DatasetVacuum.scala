package io.safetensors.spark.commit

import io.safetensors.spark.internal.Json
import java.io.FileNotFoundException
import java.util.UUID

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.JsonNode
import io.safetensors.spark.files.DatasetFiles
import io.safetensors.spark.jni.{NativeLib, NativeNames, NativeWriter}
import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path

/**
 * A vacuum of a dataset through Hadoop's file systems (local, HDFS, s3a, …), spec/dataset.md
 * §5.8.1. Rust decides (`NativeWriter.planVacuum`: which shards, index parts and log entries go;
 * `vacuumManifest`: the vacuum version); this lists the directory, deletes what the plan says, and
 * commits the vacuum version with the writers' protocol ([[DatasetCommit]]).
 */
private[spark] object DatasetVacuum {
  private val mapper = Json.mapper

  /** Tests only: runs between the plan and its execution (lets a test race a writer). */
  @volatile private[spark] var afterPlan: () => Unit = null

  /** Tests only: runs after the files are deleted, before the log is pruned (lets a test read a
   *  version whose shards are gone while its log entry is still there). */
  @volatile private[spark] var beforePrune: () => Unit = null

  /** How many times the vacuum version is retried on top of a newer one (as writers do). */

  /** What a vacuum did: its plan (Rust's JSON) and the vacuum version (None on a dry run). */
  final case class Outcome(dest: Path, plan: JsonNode, version: Option[Long])

  def run(path: String, conf: Configuration, retention: Option[String], dryRun: Boolean,
      allowShorterRetention: Boolean, appId: Option[String]): Outcome = {
    NativeLib.ensureLoaded()
    val root = new Path(path)
    val fs = root.getFileSystem(conf)
    val dest = fs.makeQualified(root)
    val commits = new DatasetCommit(fs, dest, conf, DatasetFiles.localFile(fs, dest))
    val (_, latestText, latestSource) = commits.latestWithSource().getOrElse(
      throw new IllegalArgumentException(
        s"safetensors: vacuum: $dest has no ${DatasetFiles.ManifestName}: not a dataset"))
    val logDir = new Path(dest, DatasetCommit.LogDir)
    val req0 = mapper.createObjectNode()
    val log = mapper.createArrayNode()
    commits.logVersions().foreach { v =>
      val p = new Path(logDir, DatasetCommit.logName(v))
      try {
        val st = fs.getFileStatus(p)
        log.addObject().put("version", v).put("source", p.toString)
          .put("text", DatasetFiles.readText(fs, p)).put("mtime_ms", st.getModificationTime)
      } catch { case _: FileNotFoundException => } // pruned meanwhile by another vacuum
    }
    def files(dir: Path) = {
      val o = mapper.createObjectNode()
      // regular files only: a link named like a superseded shard is never deleted (§5.9)
      if (fs.exists(dir)) fs.listStatus(dir).filter(s => s.isFile && DatasetFiles.isOwnFile(fs, s.getPath))
        .foreach(s => o.put(s.getPath.getName, s.getLen))
      o
    }
    // the replay of the oldest entries starts from the newest checkpoint at or below the first
    val checkpoints = if (DatasetFiles.ownDir(fs, dest, DatasetCommit.LogDir).isEmpty) Seq.empty[Long]
      else fs.listStatus(logDir).toSeq.flatMap(s => DatasetCommit.parseCheckpointName(s.getPath.getName)).sorted
    val firstEntry = commits.logVersions().headOption.getOrElse(0L)
    checkpoints.filter(_ <= firstEntry).lastOption.foreach { c =>
      val p = new Path(logDir, NativeNames.checkpointFileName(c))
      try {
        val st = fs.getFileStatus(p)
        req0.putObject("checkpoint").put("version", c).put("source", p.toString)
          .put("text", DatasetFiles.readText(fs, p)).put("mtime_ms", st.getModificationTime)
      } catch { case _: FileNotFoundException => }
    }
    val cps = req0.putArray("checkpoint_versions")
    checkpoints.foreach(c => cps.add(c))
    val indexDir = new Path(dest, DatasetFiles.IndexDir)
    // a linked index directory is refused (spec/dataset.md §5.9): nothing outside is deleted
    val ownIndex = DatasetFiles.ownDir(fs, dest, DatasetFiles.IndexDir)
    val req = req0
    req.set[JsonNode]("log", log)
    req.put("latest", latestText).put("latest_source", latestSource.toString)
    req.set[JsonNode]("shards", files(dest))
    req.set[JsonNode]("index_parts", ownIndex.map(files).getOrElse(mapper.createObjectNode()))
    retention.foreach(r => req.put("retention", r))
    req.put("allow_shorter_retention", allowShorterRetention)
    req.put("now_ms", System.currentTimeMillis())
    val answer = mapper.readTree(NativeWriter.planVacuum(mapper.writeValueAsString(req)))
    val plan = answer.get("plan")
    if (dryRun) return Outcome(dest, plan, None)
    Option(afterPlan).foreach(_())
    // names from the plan passed the shard-name trust rule (spec/dataset.md §5.4)
    // a file that cannot be deleted stops the vacuum before the log is pruned: the next vacuum
    // finds the same candidates
    def delete(p: Path): Unit =
      if (!fs.delete(p, false) && fs.exists(p)) {
        throw new java.io.IOException(s"safetensors: vacuum could not delete $p; nothing of the log was pruned")
      }
    plan.get("shards").elements().asScala.foreach(f => delete(new Path(dest, f.get("name").asText())))
    plan.get("index_parts").elements().asScala
      .foreach(f => delete(new Path(indexDir, f.get("name").asText())))
    Option(beforePrune).foreach(_())
    // the retained versions replay from this checkpoint once the log below them is gone
    if (answer.hasNonNull("checkpoint")) {
      val c = answer.get("checkpoint")
      val p = new Path(logDir, c.get("name").asText())
      if (!fs.exists(p)) {
        val out = fs.create(p, false)
        try out.write(c.get("text").asText().getBytes(java.nio.charset.StandardCharsets.UTF_8))
        finally out.close()
      }
    }
    plan.get("prune_versions").elements().asScala
      .foreach(v => fs.delete(new Path(logDir, DatasetCommit.logName(v.asLong())), false))
    plan.get("prune_checkpoints").elements().asScala
      .foreach(v => fs.delete(new Path(logDir, NativeNames.checkpointFileName(v.asLong())), false))
    val id = s"vacuum-${UUID.randomUUID()}"
    var attempts = 0
    while (attempts < DatasetCommit.MaxCommitAttempts) {
      attempts += 1
      val (baseVersion, baseText) = commits.latest().get
      val next = mapper.readTree(NativeWriter.vacuumManifest(baseText, answer.get("files").asLong(),
        answer.get("bytes").asLong(), appId.orNull))
      val version = next.get("version").asLong()
      val text = next.get("manifest").asText()
      if (commits.tryCommit(version, Some((baseVersion, baseText)), text, id)) {
        commits.publish(version, text, id)
        return Outcome(dest, plan, Some(version))
      }
    }
    throw new java.io.IOException(s"safetensors: vacuum of $dest deleted its files, but " +
      s"${DatasetCommit.MaxCommitAttempts} attempts to commit its version each found a newer version committed " +
      "by another writer")
  }
}
