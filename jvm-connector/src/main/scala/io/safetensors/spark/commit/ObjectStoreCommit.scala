package io.safetensors.spark.commit

import java.io.IOException

import org.apache.hadoop.fs.{FileSystem, Path}
import io.safetensors.spark.files.DatasetFiles

/**
 * The commit of a write on an object store (spec/dataset.md §5.6): stores whose rename is a copy
 * of every byte. There a task keeps its shards on local disk until Spark's output commit
 * coordinator lets that attempt commit, then uploads them once, straight to their final names in
 * the dataset directory; the manifest commit is what makes them part of the dataset. Nothing is
 * staged and renamed, so no shard byte is copied at job commit.
 */
private[spark] object ObjectStoreCommit {
  /** URI schemes of Hadoop file systems over object stores (rename = copy + delete). */
  val Schemes: Set[String] = Set("s3a", "s3", "s3n", "gs", "oss", "cos", "cosn", "obs", "wasb", "wasbs")

  /** Whether writes to `fs` use the direct protocol. */
  def applies(fs: FileSystem): Boolean =
    DatasetFiles.localFile(fs, new Path("/")).isEmpty &&
      Option(fs.getUri.getScheme).exists(s => Schemes(s.toLowerCase(java.util.Locale.ROOT)))

  /** Whether `fs` is Hadoop's S3A (by class name: hadoop-aws need not be on the classpath). */
  def isS3A(fs: FileSystem): Boolean = fs.getClass.getName == "org.apache.hadoop.fs.s3a.S3AFileSystem"

  /** Shard files of write `writeId` in `dest` (their names end in `-<writeId>.safetensors`). */
  def filesOfWrite(fs: FileSystem, dest: Path, writeId: String): Seq[Path] =
    if (!fs.exists(dest)) Seq.empty
    else fs.listStatus(dest).toSeq.filter(_.isFile).map(_.getPath)
      .filter(_.getName.endsWith(s"-$writeId${DatasetFiles.Extension}"))

  /** Deletes the shard files of write `writeId` that `keep` does not name: after a commit, the
   *  uploads of attempts that did not become part of the dataset; after a failure (`keep` empty),
   *  everything the write uploaded. Failures are added to `t` (when given) and otherwise ignored:
   *  such files are never part of the dataset (§1). */
  def removeUnlisted(fs: FileSystem, dest: Path, writeId: String, keep: Set[String], t: Throwable): Unit =
    try {
      filesOfWrite(fs, dest, writeId).filterNot(p => keep(p.getName)).foreach { p =>
        try fs.delete(p, false) catch { case e: IOException => if (t != null) t.addSuppressed(e) }
      }
    } catch { case e: IOException => if (t != null) t.addSuppressed(e) }
}
