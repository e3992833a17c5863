package io.safetensors.spark.files

import java.io.{File, IOException}
import java.nio.charset.StandardCharsets

import io.safetensors.spark.jni.{NativeLib, NativeNames, NativeVersions}
import org.apache.hadoop.fs.{FileSystem, LocalFileSystem, Path, RawLocalFileSystem}

/**
 * The names in a dataset directory (spec/dataset.md §1) and the small-file I/O that reads and
 * writes share. The names and their rules are Rust's (`dataset::names`, through [[NativeNames]]):
 * none is written again here.
 */
private[spark] object DatasetFiles {
  val ManifestName: String = NativeNames.MANIFEST_FILE_NAME
  /** The index directory: one part per shard (spec/dataset.md §6.1). */
  val IndexDir: String = NativeNames.INDEX_DIR_NAME
  val Extension: String = NativeNames.SHARD_FILE_EXTENSION

  /** A name starting with `_` or `.` is hidden (dataset.md §1): never a shard, a partition
   *  directory or data. */
  def isHidden(name: String): Boolean = NativeNames.isHiddenName(name)

  /** A shard file's name: `*.safetensors`, not hidden. */
  def isShardName(name: String): Boolean = NativeNames.isShardFileName(name)

  /** A listed child of a directory: its path, its URI (`path.toString`), and what a listing's
   *  status gives (links followed, as Hadoop's local listing does). */
  final case class Child(path: Path, uri: String, isDirectory: Boolean, length: Long) {
    def name: String = path.getName
    def isFile: Boolean = !isDirectory
  }

  /**
   * The children of the directory `dir`, as `fs.listStatus` gives them (hidden names included:
   * the caller filters). On the local file system
   * through java.nio, each child's attributes read once: Hadoop's local listing builds a status
   * object of several system calls per child (0.8 s for a dataset directory of 100,000 shards;
   * this 0.3 s, spec/performance.md §14.1). A child that is gone between the listing and its
   * attributes (or a dangling link) is left out, as Hadoop leaves it out.
   */
  def listChildren(fs: FileSystem, dir: Path): Seq[Child] = localFile(fs, dir) match {
    case Some(f) =>
      val base = fs.makeQualified(dir)
      val out = Seq.newBuilder[Child]
      val stream = java.nio.file.Files.newDirectoryStream(f.toPath)
      try stream.forEach { c =>
        val attrs = try {
          Some(java.nio.file.Files.readAttributes(c, classOf[java.nio.file.attribute.BasicFileAttributes]))
        } catch { case _: java.nio.file.NoSuchFileException => None }
        attrs.foreach { a =>
          // Hadoop's own way to name a child (the three-argument Path: a name with a colon stays
          // a name), so a URI here is the URI Hadoop's listing gives
          val p = new Path(base, new Path(null, null, c.getFileName.toString))
          out += Child(p, p.toString, a.isDirectory, if (a.isDirectory) 0L else a.size())
        }
      } finally stream.close()
      out.result()
    case None =>
      fs.listStatus(dir).toSeq.map(s => Child(s.getPath, s.getPath.toString, s.isDirectory, s.getLen))
  }

  /** Top-level shard files of `dir` (dataset.md §1). */
  def listShards(fs: FileSystem, dir: Path): Seq[Path] =
    if (!fs.getFileStatus(dir).isDirectory) Seq.empty
    else fs.listStatus(dir).toSeq.filter(_.isFile).map(_.getPath).filter(p => isShardName(p.getName))

  /**
   * The dataset's own directory `dir/name` (`_manifest_log`, `_tensor_index.parquet`): None when
   * absent. On the local file system the Rust rule decides (spec/dataset.md §5.9,
   * `NativeVersions.checkOwnDir`): a symbolic link there is refused, naming it, so a command
   * never follows it into another dataset. Other file systems have no links to follow.
   */
  def ownDir(fs: FileSystem, dir: Path, name: String): Option[Path] = {
    val p = new Path(dir, name)
    localFile(fs, dir) match {
      case Some(f) =>
        NativeLib.ensureLoaded()
        if (NativeVersions.checkOwnDir(f.getPath, name)) Some(p) else None
      case None => if (fs.exists(p)) Some(p) else None
    }
  }

  /** Whether the listed directory `p` is one of the dataset's own: on the local file system not
   *  a symbolic link (a link under a partitioned root is never a partition, spec/dataset.md
   *  §5.9; the Rust rule, `NativeVersions.isOwnSubdir`). */
  def isOwnSubdir(fs: FileSystem, p: Path): Boolean = localFile(fs, p) match {
    case Some(f) =>
      NativeLib.ensureLoaded()
      NativeVersions.isOwnSubdir(f.getPath)
    case None => true
  }

  /** Whether the listed file `p` is one a maintenance command may delete: on the local file
   *  system a regular file that is not a symbolic link (spec/dataset.md §5.9; the Rust rule,
   *  `NativeVersions.isOwnFile`). */
  def isOwnFile(fs: FileSystem, p: Path): Boolean = localFile(fs, p) match {
    case Some(f) =>
      NativeLib.ensureLoaded()
      NativeVersions.isOwnFile(f.getPath)
    case None => true
  }

  /** The local file of `p` when `fs` is the local file system. */
  def localFile(fs: FileSystem, p: Path): Option[File] = fs match {
    case l: LocalFileSystem => Some(l.pathToFile(p))
    case r: RawLocalFileSystem => Some(r.pathToFile(p))
    case _ => None
  }

  /** Reads of a replaced-whole object made before giving up (see [[readText]]). */
  private val ReadAttempts = 10

  /**
   * The UTF-8 text of a small file that writers replace whole (`dataset_manifest.json`; a log
   * entry or a task report is read the same way). On S3, S3A opens an object with a HEAD and then
   * GETs it `If-Match` that ETag: a commit that replaces the object in between fails the GET with
   * 412 (S3A's `RemoteFileChangedException`). The object is then read again, from its HEAD, so the
   * text returned is always one whole version, the newest at that read (spec/dataset.md §5.3).
   */
  def readText(fs: FileSystem, p: Path): String = {
    // local: the Rust rule (spec/dataset.md §5.9), so a FIFO or a link to a device where a
    // manifest or log entry should be is refused at once instead of blocking the driver
    localFile(fs, p).foreach { f =>
      NativeLib.ensureLoaded()
      val text = NativeVersions.readManifestFile(f.getPath)
      if (text == null) throw new java.io.FileNotFoundException(s"File $p does not exist")
      return text
    }
    var attempt = 1
    var text: Option[String] = None
    while (text.isEmpty) {
      try {
        val in = fs.open(p)
        try text = Some(new String(in.readAllBytes(), StandardCharsets.UTF_8)) finally in.close()
      } catch {
        case e: IOException if replacedWhileRead(e) && attempt < ReadAttempts =>
          attempt += 1
          Thread.sleep(20L * attempt)
      }
    }
    text.get
  }

  /** Whether `e` says the object changed between S3A's open and its read (by class name:
   *  hadoop-aws need not be on the classpath). */
  private def replacedWhileRead(e: Throwable): Boolean =
    Iterator.iterate(e)(_.getCause).takeWhile(_ != null).take(8)
      .exists(_.getClass.getName == "org.apache.hadoop.fs.s3a.RemoteFileChangedException")

  /** Moves a local file to `dest` on `fs` (one upload on an object store). The source is passed as
   *  a qualified `file:` URI: S3A's `copyFromLocalFile` (Hadoop 3.4.1, `CopyFromLocalOperation`)
   *  relativizes the listed `file:/…` source against the path it was given and fails with
   *  "Cannot get relative path" when that path has no scheme. */
  def uploadLocal(fs: FileSystem, local: File, dest: Path): Unit =
    fs.copyFromLocalFile(true, true, new Path(local.getAbsoluteFile.toURI), dest)
}
