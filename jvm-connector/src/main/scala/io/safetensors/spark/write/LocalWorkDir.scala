package io.safetensors.spark.write

import java.io.File
import java.nio.channels.{FileChannel, FileLock, OverlappingFileLockException}
import java.nio.file.{Files, Path => JPath, StandardCopyOption, StandardOpenOption}
import scala.util.control.NonFatal

/**
 * The local work directory of a task that writes to a non-local file system (an object store,
 * HDFS): `java.io.tmpdir/safetensors-task-*`, where the engine seals shards before they are
 * uploaded (spec/dataset.md §5.6). The task deletes it when it ends; a killed executor cannot.
 *
 * So each directory holds a file `.owner` locked (a POSIX record lock, `FileChannel.lock`) by
 * the JVM of its task for the task's life. The operating system drops a process's locks when
 * it dies, SIGKILL included; every task that creates a work directory first removes the
 * `safetensors-task-*` directories whose `.owner` it can lock: their JVM is gone. A directory
 * whose `.owner` is locked (another live executor) or that has no `.owner` yet (being created,
 * or made by an older version) is left alone; so are this JVM's own, which the sweep never opens:
 * closing any descriptor of a file drops all of the process's POSIX locks on it.
 */
private[spark] final class LocalWorkDir private (val dir: File, channel: FileChannel, lock: FileLock) {

  /** Deletes the directory, then drops the lock. */
  def delete(): Unit = {
    try LocalWorkDir.deleteTree(dir)
    finally try try lock.release() finally channel.close() finally LocalWorkDir.owned.remove(dir.getAbsoluteFile)
  }
}

private[spark] object LocalWorkDir {
  val Prefix = "safetensors-task-"
  val OwnerFile = ".owner"
  /** The work directories of this JVM's tasks, from creation until their lock is dropped. */
  private[spark] val owned = java.util.concurrent.ConcurrentHashMap.newKeySet[File]()

  /** A new work directory in `parent` (default java.io.tmpdir), owned by this JVM, after
   *  removing the directories of dead JVMs there. */
  def create(parent: JPath = defaultParent): LocalWorkDir = {
    sweep(parent)
    val dir = Files.createTempDirectory(parent, Prefix)
    owned.add(dir.toFile.getAbsoluteFile)
    try {
      // locked under a temporary name, then renamed: a sweeper never sees an unlocked .owner
      val pending = dir.resolve(OwnerFile + ".pending")
      val channel = FileChannel.open(pending, StandardOpenOption.CREATE_NEW, StandardOpenOption.WRITE)
      try {
        val lock = channel.lock()
        Files.move(pending, dir.resolve(OwnerFile), StandardCopyOption.ATOMIC_MOVE)
        new LocalWorkDir(dir.toFile, channel, lock)
      } catch {
        case t: Throwable => channel.close(); throw t
      }
    } catch {
      case t: Throwable => deleteTree(dir.toFile); owned.remove(dir.toFile.getAbsoluteFile); throw t
    }
  }

  def defaultParent: JPath = new File(System.getProperty("java.io.tmpdir")).toPath

  /** Removes the work directories in `parent` whose owner is gone; returns how many. */
  def sweep(parent: JPath = defaultParent): Int = {
    val entries = try Option(parent.toFile.listFiles()).getOrElse(Array.empty[File])
    catch { case NonFatal(_) => Array.empty[File] }
    entries.count { d =>
      d.getName.startsWith(Prefix) && !owned.contains(d.getAbsoluteFile) && d.isDirectory &&
        ownerGone(new File(d, OwnerFile)) && {
        deleteTree(d)
        true
      }
    }
  }

  private def ownerGone(owner: File): Boolean = {
    if (!owner.isFile) return false
    try {
      val channel = FileChannel.open(owner.toPath, StandardOpenOption.WRITE)
      try {
        val lock = channel.tryLock()
        if (lock == null) false else { lock.release(); true }
      } catch {
        case _: OverlappingFileLockException => false // a task of this JVM holds it
      } finally channel.close()
    } catch {
      case NonFatal(_) => false // gone meanwhile (its task deleted it), or not ours to open
    }
  }

  def deleteTree(f: File): Unit = {
    if (f.isDirectory) Option(f.listFiles()).foreach(_.foreach(deleteTree))
    f.delete()
  }
}
