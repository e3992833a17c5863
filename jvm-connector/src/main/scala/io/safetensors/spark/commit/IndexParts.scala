package io.safetensors.spark.commit

import io.safetensors.spark.internal.Json
import java.io.{File, IOException}
import java.nio.charset.StandardCharsets
import java.nio.file.Files

import scala.collection.mutable
import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.JsonNode
import com.fasterxml.jackson.databind.node.ObjectNode
import io.safetensors.spark.jni.{NativeReader, NativeWriter, SafetensorsException}
import org.apache.hadoop.fs.{FileSystem, Path}
import io.safetensors.spark.files.{DatasetFiles, ShardHeaders}

/**
 * The driver's side of the per-shard index parts (spec/dataset.md §6.1): each shard's part
 * lives at `_tensor_index.parquet/<shard stem>.parquet`, written by the task that wrote the shard
 * (and staged with it), or from a shard's header for a shard written without one. The commit
 * checks KV keys by a streaming merge of the parts in Rust ([[NativeWriter.mergeKeys]]): the
 * driver holds O(shards), never the keys. On an object store (`objectStore`, spec/dataset.md
 * §5.6) a part is placed with one PUT of its bytes, never a rename (there a server-side copy).
 */
private[spark] final class IndexParts(fs: FileSystem, dest: Path, planJson: String,
    localTemps: mutable.ArrayBuffer[File], objectStore: Boolean = false) {
  private val mapper = Json.mapper
  val indexDir = new Path(dest, DatasetFiles.IndexDir)
  // a linked index directory is refused (spec/dataset.md §5.9): a write never places or deletes
  // parts through it
  DatasetFiles.ownDir(fs, dest, DatasetFiles.IndexDir)
  /** A local directory for parts downloaded or built here and for mergeKeys' key lists. */
  lazy val workDir: File = {
    val d = Files.createTempDirectory("safetensors-index-").toFile
    localTemps += d
    d
  }
  /** Local copies of existing shards' parts, by shard name (kept across commit attempts). */
  private val existingLocal = mutable.Map[String, File]()

  /** The index part's name of shard `file` (the rule lives in Rust). */
  def partName(file: String): String = NativeReader.indexPartName(file)

  def partPath(file: String): Path = new Path(indexDir, partName(file))

  /** A local file with the bytes of `p` (itself when `p` is local, else a download). */
  def local(p: Path): File = DatasetFiles.localFile(fs, p).getOrElse {
    val f = new File(workDir, s"dl-${java.util.UUID.randomUUID()}-${p.getName}")
    fs.copyToLocalFile(false, p, new Path(f.getAbsolutePath), true)
    f
  }

  /** A local part for the dataset's shard `file`: its published part when there is one, else one
   *  built from its header (one header in memory at a time). */
  def existingPart(file: String): File = existingLocal.getOrElseUpdate(file, {
    val published = partPath(file)
    if (fs.exists(published)) local(published)
    else {
      val f = new File(workDir, s"hdr-${existingLocal.size}-${partName(file)}")
      val (header, len) = ShardHeaders.raw(fs, new Path(dest, file))
      NativeWriter.indexPartFromHeader(planJson, file, header, len, f.getAbsolutePath)
      f
    }
  })

  /** mergeKeys over `runs` (file, local part, existing, partition, shard): the shards that lose
   *  keys, (file, local keys file, count). */
  def merge(runs: Seq[(String, File, Boolean, Long, Long)]): Seq[(String, String, Long)] = {
    if (runs.size < 2) return Seq.empty
    val a = mapper.createArrayNode()
    runs.foreach { case (f, part, existing, partition, shard) =>
      a.addObject().put("file", f).put("part", part.getAbsolutePath).put("existing", existing)
        .put("partition", partition).put("shard", shard)
    }
    mapper.readTree(NativeWriter.mergeKeys(planJson, mapper.writeValueAsString(a), workDir.getAbsolutePath))
      .elements().asScala.map(n => (n.get("file").asText(), n.get("keys").asText(), n.get("count").asLong()))
      .toSeq
  }

  /** Copies shard `src` without the keys in `keysFile` to `out`, its new part to `partOut` (if
   *  set), directly when all are local files, else through local copies. The answer of
   *  rewriteShardKeys ({"delete", "bytes", "samples", "num_tensors"}). */
  def rewrite(src: Path, out: Path, partOut: Option[Path], keysFile: String): JsonNode = {
    val direct = for {
      i <- DatasetFiles.localFile(fs, src); o <- DatasetFiles.localFile(fs, out)
      p <- partOut.map(q => DatasetFiles.localFile(fs, q).map(Some(_))).getOrElse(Some(None))
    } yield (i, o, p)
    direct match {
      case Some((i, o, p)) =>
        o.getParentFile.mkdirs()
        p.foreach(_.getParentFile.mkdirs())
        mapper.readTree(NativeWriter.rewriteShardKeys(planJson, i.getAbsolutePath, o.getAbsolutePath,
          out.getName, p.map(_.getAbsolutePath).orNull, keysFile))
      case None =>
        val in = local(src)
        val o = new File(workDir, s"rw-${java.util.UUID.randomUUID()}-${out.getName}")
        val p = partOut.map(q => new File(workDir, s"rw-${java.util.UUID.randomUUID()}-${q.getName}"))
        val r = mapper.readTree(NativeWriter.rewriteShardKeys(planJson, in.getAbsolutePath, o.getAbsolutePath,
          out.getName, p.map(_.getAbsolutePath).orNull, keysFile))
        if (!r.get("delete").asBoolean()) {
          DatasetFiles.uploadLocal(fs, o, out)
          for (pf <- p; q <- partOut) DatasetFiles.uploadLocal(fs, pf, q)
        }
        r
    }
  }

  /** Places a part file (staged, or a local file) at `partPath(file)`. */
  def publish(file: String, from: Path): Path = {
    val target = partPath(file)
    fs.mkdirs(indexDir)
    if (objectStore) {
      DatasetFiles.uploadLocal(fs, local(from), target)
      fs.delete(from, false)
    } else if (!fs.rename(from, target)) {
      throw new IOException(s"safetensors: cannot rename $from to $target")
    }
    target
  }

  /** After a commit with `generate_index`: every listed shard without a part gets one, from its
   *  header (an append that creates the first index; old shards' parts are never rewritten).
   *  The parts there are found by one listing of the index, not a probe a listed shard (100,000
   *  probes an append at 100,000 shards). */
  def completeIndex(listed: Seq[String]): Unit = {
    val have: Set[String] =
      if (!fs.exists(indexDir)) Set.empty
      else fs.listStatus(indexDir).iterator.filter(_.isFile).map(_.getPath.getName).toSet
    listed.filterNot(f => have(partName(f))).foreach(buildPart)
  }

  private def buildPart(f: String): Unit = {
    val built = existingPart(f)
    val target = partPath(f)
    fs.mkdirs(indexDir)
    if (objectStore) DatasetFiles.uploadLocal(fs, built, target) // one PUT: appears whole
    else {
      val tmp = new Path(indexDir, s".${target.getName}.${java.util.UUID.randomUUID()}.tmp")
      DatasetFiles.uploadLocal(fs, built, tmp)
      if (!fs.rename(tmp, target)) {
        fs.delete(tmp, false)
        if (!fs.exists(target)) throw new IOException(s"safetensors: cannot place index part $target")
      }
    }
  }

  /** Whether the dataset has an index directory (or a file in its place). */
  def present: Boolean = fs.exists(indexDir)

  /** Deletes the parts of `shards` and parts of the earlier one-part-per-version layout (best
   *  effort), then the directory if it is empty. */
  def remove(shards: Iterable[String]): Unit = if (fs.exists(indexDir)) {
    if (!fs.getFileStatus(indexDir).isDirectory) quietly(fs.delete(indexDir, false))
    else {
      shards.foreach(f => quietly(fs.delete(partPath(f), false)))
      fs.listStatus(indexDir).foreach { s =>
        if (DatasetCommit.parseIndexPartName(s.getPath.getName).isDefined) quietly(fs.delete(s.getPath, false))
      }
      if (fs.listStatus(indexDir).isEmpty) quietly(fs.delete(indexDir, false))
    }
  }

  private def quietly(f: => Any): Unit = try f catch { case _: Exception => }
}
