package io.safetensors.spark.write

import java.io.File
import java.nio.file.{Files, Path => JPath}
import java.util.concurrent.TimeUnit

import org.scalatest.funsuite.AnyFunSuite

/**
 * Local work dirs of tasks writing to non-local file systems: owned by a POSIX lock, removed by a
 * later task once their JVM is gone (a killed executor), never while it lives. Other processes
 * are real ones (python3 holding `fcntl.lockf`, the same kind of lock as `FileChannel.lock`).
 */
class LocalWorkDirSuite extends AnyFunSuite {

  private def withParent(body: JPath => Unit): Unit = {
    val parent = Files.createTempDirectory("local-work-dir-suite")
    try body(parent) finally LocalWorkDir.deleteTree(parent.toFile)
  }

  private def workDirs(parent: JPath): Set[String] =
    Option(parent.toFile.list()).getOrElse(Array.empty[String]).filter(_.startsWith(LocalWorkDir.Prefix)).toSet

  /** A python3 process that takes `fcntl.lockf` on `owner` (waiting for it when `block`), prints
   *  "locked" or "busy", then holds what it took until stdin closes. */
  private def lockingProcess(owner: File, block: Boolean): (Process, String) = {
    val code =
      """import fcntl, sys
        |f = open(sys.argv[1], "r+")
        |try:
        |    fcntl.lockf(f, fcntl.LOCK_EX if sys.argv[2] == "block" else fcntl.LOCK_EX | fcntl.LOCK_NB)
        |    print("locked", flush=True)
        |except OSError:
        |    print("busy", flush=True)
        |sys.stdin.read()
        |""".stripMargin
    val p = new ProcessBuilder("python3", "-c", code, owner.getPath, if (block) "block" else "try")
      .redirectError(ProcessBuilder.Redirect.INHERIT).start()
    val line = new java.io.BufferedReader(new java.io.InputStreamReader(p.getInputStream)).readLine()
    (p, line)
  }

  test("create: a directory holding a locked .owner; delete removes it and drops the lock") {
    withParent { parent =>
      val w = LocalWorkDir.create(parent)
      val owner = new File(w.dir, LocalWorkDir.OwnerFile)
      assert(w.dir.getParentFile.toPath == parent && w.dir.getName.startsWith(LocalWorkDir.Prefix))
      assert(owner.isFile && !new File(w.dir, ".owner.pending").exists())
      val (other, answer) = lockingProcess(owner, block = false)
      other.getOutputStream.close(); other.waitFor(30, TimeUnit.SECONDS)
      assert(answer == "busy", "another process could lock the .owner of a live work dir")
      w.delete()
      assert(!w.dir.exists() && !LocalWorkDir.owned.contains(w.dir.getAbsoluteFile))
    }
  }

  test("sweep removes the dirs of dead owners only; this JVM's own keep their lock") {
    withParent { parent =>
      def deadOrAlive(name: String): (File, Process) = {
        val d = new File(parent.toFile, LocalWorkDir.Prefix + name)
        assert(d.mkdir())
        Files.write(new File(d, "part-00000-0000-x.safetensors").toPath, Array[Byte](1, 2, 3))
        val owner = new File(d, LocalWorkDir.OwnerFile)
        Files.write(owner.toPath, Array.emptyByteArray)
        val (p, answer) = lockingProcess(owner, block = true)
        assert(answer == "locked")
        (d, p)
      }
      val (dead, killed) = deadOrAlive("dead")
      val (alive, living) = deadOrAlive("alive")
      val unowned = new File(parent.toFile, LocalWorkDir.Prefix + "no-owner-yet")
      assert(unowned.mkdir())
      val mine = LocalWorkDir.create(parent)
      try {
        assert(LocalWorkDir.sweep(parent) == 0, "a dir swept while every owner lives")
        killed.destroyForcibly().waitFor(30, TimeUnit.SECONDS) // SIGKILL: the OS drops its lock
        assert(LocalWorkDir.sweep(parent) == 1)
        assert(!dead.exists(), "the dead owner's dir (with its shard) is still there")
        assert(alive.exists() && unowned.exists() && mine.dir.exists())
        assert(workDirs(parent) == Set(alive.getName, unowned.getName, mine.dir.getName))
        // the sweep never opened this JVM's .owner (closing a descriptor would drop its lock)
        val (probe, answer) = lockingProcess(new File(mine.dir, LocalWorkDir.OwnerFile), block = false)
        probe.getOutputStream.close(); probe.waitFor(30, TimeUnit.SECONDS)
        assert(answer == "busy", "this JVM's work dir lost its lock in the sweep")
        // a new work dir sweeps first
        living.destroyForcibly().waitFor(30, TimeUnit.SECONDS)
        val next = LocalWorkDir.create(parent)
        assert(!alive.exists())
        next.delete()
      } finally {
        mine.delete()
        killed.destroyForcibly(); living.destroyForcibly()
      }
      assert(workDirs(parent) == Set(unowned.getName))
    }
  }
}
