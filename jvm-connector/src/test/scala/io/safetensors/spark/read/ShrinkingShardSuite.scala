package io.safetensors.spark.read

import java.io.{File, RandomAccessFile}
import java.nio.charset.StandardCharsets
import java.lang.management.ManagementFactory
import java.nio.file.Files

import scala.jdk.CollectionConverters._

import scala.util.control.NonFatal

import org.apache.spark.sql.Row
import org.scalatest.funsuite.AnyFunSuite

import io.safetensors.spark.TestSessions

/**
 * A shard truncated while a local-mode Spark job reads it (issue 29 item 2). The Rust task reads
 * local files with positioned reads checked against the validated length (spec/format.md
 * §"Reading a file that changes"), so the job fails with an error naming the file and the JVM
 * lives on. The old memory map took a SIGBUS in native code, which kills the JVM: the scenario
 * runs in a child JVM ([[ShrinkingShardMain]]) so this suite survives either way.
 */
class ShrinkingShardSuite extends AnyFunSuite {
  test("a shard truncated mid-read fails the job naming the file; the driver JVM survives") {
    val dir = Files.createTempDirectory("shrink").toFile
    val java = new File(System.getProperty("java.home"), "bin/java").getPath
    // The child gets this JVM's options (heap, --add-opens) and class path.
    val jvmArgs = ManagementFactory.getRuntimeMXBean.getInputArguments.asScala.toSeq
    // A crash report (the old code's SIGBUS) goes to the temporary directory, not the build tree.
    val cmd = Seq(java) ++ jvmArgs ++ Seq(s"-XX:ErrorFile=${dir.getPath}/hs_err_%p.log",
      "-cp", System.getProperty("java.class.path"),
      ShrinkingShardMain.getClass.getName.stripSuffix("$"), dir.getPath)
    val p = new ProcessBuilder(cmd.asJava).redirectErrorStream(true).start()
    val out = new String(p.getInputStream.readAllBytes(), StandardCharsets.UTF_8)
    val rc = p.waitFor()
    val lines = out.linesIterator.toSeq
    assert(rc == 0, s"the child JVM died (exit $rc):\n${out.takeRight(4000)}")
    val error = lines.find(_.startsWith("ERROR ")).getOrElse(fail(s"no error reported:\n$out"))
    assert(error.contains("part-") && error.contains(".safetensors"), error)
    assert(error.contains("changed while being read"), error)
    assert(lines.contains("ALIVE 8"), out.takeRight(4000))
  }
}

/** The child JVM: writes a 512-row dataset (x: 256 bytes a row, 128 KiB), reads it 16 rows a
 * batch, truncates the shard after the first row arrived (the unit is open, its header read),
 * then prints the job's error and the count of a second dataset. */
object ShrinkingShardMain {
  def main(args: Array[String]): Unit = {
    val spark = TestSessions.local("shrinking-shard")
    val root = args(0)
    def write(path: String, rows: Int): Unit = spark.range(rows)
      .selectExpr("id", "array_repeat(cast(id as float), 64) as x")
      .coalesce(1).write.format("safetensors").option("batch_size", rows.toString).save(path)
    write(s"$root/a", 512)
    write(s"$root/b", 8)
    val shard = new File(s"$root/a").listFiles().filter(_.getName.endsWith(".safetensors")).head
    val df = spark.read.format("safetensors").option("read_batch_rows", "16").load(s"$root/a")
    val sums = df.select("x").rdd.mapPartitions { rows =>
      val first = if (rows.hasNext) Iterator(rows.next()) else Iterator.empty
      val f = new RandomAccessFile(shard, "rw")
      try f.setLength(8192) finally f.close()
      (first ++ rows).map((r: Row) => r.getSeq[Float](0).sum)
    }
    try {
      println(s"NO ERROR ${sums.count()}")
    } catch {
      case NonFatal(e) =>
        val msgs = Iterator.iterate[Throwable](e)(_.getCause).takeWhile(_ != null).map(_.getMessage)
        println("ERROR " + msgs.mkString(" | ").replace('\n', ' '))
    }
    println(s"ALIVE ${spark.read.format("safetensors").load(s"$root/b").count()}")
    spark.stop()
  }
}
