package io.safetensors.spark.files

import java.io.{EOFException, IOException}
import java.nio.charset.StandardCharsets

import io.safetensors.spark.jni.NativeReader
import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FSDataInputStream, FileSystem, Path}

/**
 * The JVM's one reader of a shard's 8-byte prefix and header (spec/format.md §2): the scan's
 * planner and tasks and the writer's KV checks of existing shards all read through it. N is
 * checked by the engine ([[NativeReader.headerLength]]: the file's length and the format's cap,
 * rust-core `header::MAX_HEADER_SIZE`, 100,000,000 bytes) before anything is allocated.
 */
private[spark] object ShardHeaders {
  /**
   * Opens a file for positioned reads of a few ranges (spec/reading.md §5): with the `random`
   * read policy, object-store connectors (S3A, ABFS, GCS) request just the ranges read (S3A: at
   * least `fs.s3a.readahead.range`, 64 KiB by default) instead of the rest of the file from the
   * first read on, and with the known length S3A skips its HEAD request. File systems that do
   * not know these options ignore them (`opt`, not `must`).
   */
  def openForRanges(fs: FileSystem, path: Path, length: Long): FSDataInputStream = {
    val future = fs.openFile(path)
      .opt("fs.option.openfile.read.policy", "random")
      .opt("fs.s3a.experimental.input.fadvise", "random") // S3A before Hadoop 3.3.5
      .opt("fs.option.openfile.length", length.toString)
      .build()
    try future.get()
    catch {
      case e: java.util.concurrent.ExecutionException if e.getCause != null => throw e.getCause
    }
  }

  /** The first 8 + N bytes of a file, read with two positioned reads. */
  def readPrefixAndHeader(in: FSDataInputStream, file: String, length: Long): Array[Byte] = {
    val prefix = new Array[Byte](math.min(8L, length).toInt)
    in.readFully(0L, prefix)
    val n = NativeReader.headerLength(file, prefix, length)
    val all = new Array[Byte]((8L + n).toInt)
    System.arraycopy(prefix, 0, all, 0, prefix.length)
    try in.readFully(8L, all, 8, n.toInt)
    catch {
      case e: EOFException => throw new IOException(s"$file: file ended while reading its header", e)
    }
    all
  }

  /** The validated header JSON text of a file of `length` bytes. */
  def validated(path: Path, length: Long, conf: Configuration): String = {
    val fs = path.getFileSystem(conf)
    val in = openForRanges(fs, path, length)
    try NativeReader.validatedHeader(path.toString, readPrefixAndHeader(in, path.toString, length),
      length)
    finally in.close()
  }

  /** The header text of a shard as stored (the N bytes after the prefix) and the file's length. */
  def raw(fs: FileSystem, path: Path): (String, Long) = {
    val length = fs.getFileStatus(path).getLen
    val in = openForRanges(fs, path, length)
    try {
      val bytes = readPrefixAndHeader(in, path.toString, length)
      (new String(bytes, 8, bytes.length - 8, StandardCharsets.UTF_8), length)
    } finally in.close()
  }
}
