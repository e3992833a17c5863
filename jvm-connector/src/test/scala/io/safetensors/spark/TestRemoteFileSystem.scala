package io.safetensors.spark

import java.net.URI
import java.util.concurrent.CompletableFuture
import java.util.concurrent.ConcurrentLinkedQueue
import java.util.concurrent.atomic.AtomicLong

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.impl.FutureDataInputStreamBuilderImpl
import org.apache.hadoop.fs.{DelegateToFileSystem, FileStatus, FSDataInputStream, FutureDataInputStreamBuilder, FSInputStream, FilterFileSystem, Path, RawLocalFileSystem}
import org.apache.spark.TaskContext

/**
 * A "remote" FileSystem for tests: scheme `testfs`, paths `testfs:///abs/path` are the local
 * files `/abs/path`. It is deliberately neither a `LocalFileSystem` nor a `RawLocalFileSystem`
 * (a FilterFileSystem over a raw local FS reporting the `testfs` URI), so the writer cannot write
 * into it directly and must take the upload branch, and the reader cannot memory-map it and must
 * use positioned reads. Uploads and the bytes read through `open` streams are recorded.
 */
class TestRemoteFileSystem extends FilterFileSystem(new TestRemoteFileSystem.Raw) {
  override def getScheme: String = TestRemoteFileSystem.Scheme

  override def copyFromLocalFile(delSrc: Boolean, overwrite: Boolean, src: Path, dst: Path): Unit = {
    TestRemoteFileSystem.uploads.add(dst.toString)
    super.copyFromLocalFile(delSrc, overwrite, src, dst)
  }

  /**
   * Not FilterFileSystem's (the wrapped FS's builder): streams from `openFile(...).build()` are
   * counted like `open`'s, and the read policy asked for is recorded.
   */
  override def openFile(path: Path): FutureDataInputStreamBuilder = {
    val fs = this
    new FutureDataInputStreamBuilderImpl(fs, path) {
      override def getThisBuilder: FutureDataInputStreamBuilder = this
      override def build(): CompletableFuture[FSDataInputStream] = {
        TestRemoteFileSystem.readPolicies.add(getOptions.get("fs.option.openfile.read.policy"))
        CompletableFuture.completedFuture(fs.open(path, getBufferSize))
      }
    }
  }

  override def getFileStatus(f: Path): FileStatus = {
    TestRemoteFileSystem.statuses.add(f.toString)
    super.getFileStatus(f)
  }

  override def open(f: Path, bufferSize: Int): FSDataInputStream = {
    TestRemoteFileSystem.opens.add(
      (TaskContext.get() != null, getConf.get(TestRemoteFileSystem.MarkerKey)))
    new FSDataInputStream(new TestRemoteFileSystem.CountingStream(super.open(f, bufferSize)))
  }
}

object TestRemoteFileSystem {
  val Scheme = "testfs"
  val RootUri: URI = URI.create("testfs:///")

  /** Destination of every copyFromLocalFile call, in any JVM thread (local mode: driver + tasks). */
  val uploads = new ConcurrentLinkedQueue[String]()

  /** Hadoop key whose value each `open` records (null when the opening configuration lacks it). */
  val MarkerKey = "safetensors.test.marker"

  /** Every `open`: (called in a Spark task, the opening configuration's [[MarkerKey]]). */
  val opens = new ConcurrentLinkedQueue[(Boolean, String)]()

  /** The paths `getFileStatus` was asked about (a status request each on an object store). */
  val statuses = new ConcurrentLinkedQueue[String]()

  /** The read policy (`fs.option.openfile.read.policy`) of every `openFile`; null when unset. */
  val readPolicies = new ConcurrentLinkedQueue[String]()

  /** Bytes read through streams this FS opened (any JVM thread). */
  val bytesRead = new AtomicLong()

  /** Counts every byte read; positioned reads go through seek + read (FSInputStream). */
  final class CountingStream(in: FSDataInputStream) extends FSInputStream {
    override def seek(pos: Long): Unit = in.seek(pos)
    override def getPos: Long = in.getPos
    override def seekToNewSource(targetPos: Long): Boolean = false
    override def read(): Int = {
      val r = in.read()
      if (r >= 0) bytesRead.incrementAndGet()
      r
    }
    override def read(b: Array[Byte], off: Int, len: Int): Int = {
      val n = in.read(b, off, len)
      if (n > 0) bytesRead.addAndGet(n)
      n
    }
    override def close(): Unit = in.close()
  }

  /** The raw local FS, under the `testfs` URI (paths map onto the local disk). */
  final class Raw extends RawLocalFileSystem {
    override def getUri: URI = RootUri
    override def getScheme: String = Scheme
  }

  /** `fs.AbstractFileSystem.testfs.impl`, needed by FileContext (the manifest switch). */
  final class Afs(uri: URI, conf: Configuration)
    extends DelegateToFileSystem(uri, new TestRemoteFileSystem, conf, Scheme, false)

  /** Spark conf entries registering the scheme. */
  val sparkConf: Seq[(String, String)] = Seq(
    s"spark.hadoop.fs.$Scheme.impl" -> classOf[TestRemoteFileSystem].getName,
    s"spark.hadoop.fs.$Scheme.impl.disable.cache" -> "true",
    s"spark.hadoop.fs.AbstractFileSystem.$Scheme.impl" -> classOf[Afs].getName)
}
