package io.safetensors.spark.files

import com.fasterxml.jackson.databind.JsonNode
import com.fasterxml.jackson.databind.node.ArrayNode
import io.safetensors.spark.internal.Json
import io.safetensors.spark.jni.{NativeLib, NativeNames}
import org.apache.hadoop.fs.{FileSystem, Path}

/**
 * The JVM's reads of a dataset's `_manifest_log/` (spec/dataset.md §5.10): the engine decides
 * what to read (NativeLog.rebuild, NativeLog.follow, NativeVersions), the JVM lists and reads
 * through Hadoop. The one listing-and-read loop of every such conversation: a version's rebuild
 * (DatasetCommit), a follower's plan (readStream), the listed entries of time travel and history.
 */
private[spark] object LogReads {
  private val mapper = Json.mapper

  /** `f` on the names of `logDir`'s files as listed now; a file removed after the listing (a
   *  checkpoint a commit superseded, an entry a retention-0 commit pruned) makes it list again,
   *  up to 3 times. */
  def withListing[T](fs: FileSystem, logDir: Path)(f: Seq[String] => T): T = {
    var attempt = 0
    while (true) {
      attempt += 1
      val names = fs.listStatus(logDir).toSeq.map(_.getPath.getName)
      try return f(names)
      catch { case _: java.io.FileNotFoundException if attempt < 3 => }
    }
    throw new IllegalStateException("unreachable")
  }

  /**
   * Asks `call` (given the texts read so far, `{name: text}` JSON) until it no longer answers
   * `{"read": [names]}`, reading those files of `logDir` in between; returns its last answer.
   * `what` names the conversation in the error of one that does not end.
   */
  def converse(fs: FileSystem, logDir: Path, what: String)(call: String => String): JsonNode = {
    NativeLib.ensureLoaded()
    val read = mapper.createObjectNode()
    var answer = mapper.readTree(call("{}"))
    var rounds = 0
    while (answer.has("read")) {
      rounds += 1
      if (rounds > 3) throw new IllegalStateException(s"safetensors: $what did not end")
      answer.get("read").elements().forEachRemaining { n =>
        read.put(n.asText(), DatasetFiles.readText(fs, new Path(logDir, n.asText())))
      }
      answer = mapper.readTree(call(mapper.writeValueAsString(read)))
    }
    answer
  }

  /** The log's entries as the engine's version rules take them (`[{"version", "modified_ms",
   *  "text"?}]`), each entry's text read when `withTexts` (a time's version, the history). */
  def entries(fs: FileSystem, logDir: Path, withTexts: Boolean): ArrayNode = {
    val out = mapper.createArrayNode()
    fs.listStatus(logDir).foreach { s =>
      Some(NativeNames.parseManifestLogFileName(s.getPath.getName)).filter(_ >= 0).foreach { v =>
        val e = out.addObject().put("version", v).put("modified_ms", s.getModificationTime)
        if (withTexts) e.put("text", DatasetFiles.readText(fs, s.getPath))
      }
    }
    out
  }
}
