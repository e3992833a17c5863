package io.safetensors.spark

import java.io.File

import io.safetensors.spark.jni.NativeLib
import org.apache.spark.sql.DataFrame
import org.apache.spark.sql.functions.{array, col, lit}
import io.safetensors.spark.internal.ArrowMemory

/**
 * Leaks over many writes and reads in one executor (local mode: the driver is the executor):
 * the Rust engine's live heap (`NativeLib.nativeLiveBytes`, its counted global allocator), the
 * Arrow root allocator of the tasks, open file descriptors and threads must come back to where
 * they were after three warm-up rounds. `-Dsafetensors.soak.rounds=N` sets the rounds (default
 * 25) and `-Dsafetensors.soak.partitions=P` the partitions of each write (default 10): 2·P write
 * batches and 100 read batches per round; the long soak (spec/jni.md §5) is 100 rounds of 50.
 */
class NativeMemorySoakSuite extends SparkSuiteBase {

  private val rounds = Integer.getInteger("safetensors.soak.rounds", 25).intValue()
  private val partitions = Integer.getInteger("safetensors.soak.partitions", 10).intValue()
  private val rowsPerRound = 100

  override protected def appName: String = "safetensors-soak"

  private def openFds(): Int = Option(new File("/proc/self/fd").list()).map(_.length).getOrElse(-1)

  private def frame(round: Int): DataFrame =
    spark.range(0, rowsPerRound, 1, partitions).select(
      col("id").cast("string").as("k"),
      array((0 until 8).map(j => (col("id") * (round + j)).cast("float")): _*).as("x"),
      (col("id") + lit(round)).as("y"))

  /** One round: a batch write and a KV write (one write batch per partition each), then reads. */
  private def round(i: Int): Unit = {
    val dir = new File(base, s"r${i % 3}").getAbsolutePath
    // retention 0: each round's overwrite deletes the previous round's shards
    frame(i).write.format("safetensors").mode("overwrite").option("retention", "0").option("batch_size", "7")
      .option("columns", "x,y").save(dir + "-batch")
    frame(i).write.format("safetensors").mode("overwrite").option("retention", "0").option("name_col", "k")
      .option("generate_index", "true").save(dir + "-kv")
    val reader = spark.read.format("safetensors").option("read_batch_rows", "1")
    val rows = reader.load(dir + "-batch").collect()
    assert(rows.length == rowsPerRound)
    assert(reader.load(dir + "-kv").where("key = '5__x'").count() == 1)
    assert(spark.read.format("safetensors").option("layout", "file").load(dir + "-kv")
      .select("sha256", "flags").count() == partitions)
  }

  private final case class Usage(native: Long, arrow: Long, fds: Int, threads: Seq[String],
      osThreads: Int) {
    /** Threads of the process the JVM does not list: the native library's and the JVM's own. */
    def nativeThreads: Int = osThreads - threads.size
  }

  /**
   * Spark's own cached pools (AQE stage creators, block manager, shuffle exchange, task launch)
   * keep idle threads for a minute and grow with the number of queries run in that time; they
   * are not the connector's.
   */
  private val sparkPools = Seq("QueryStageCreator", "ResultQueryStageExecution", "block-manager-",
    "shuffle-exchange", "Executor task launch worker", "broadcast-exchange", "subquery")

  /** Live threads by name, numbers stripped (pools name their threads `pool-3-thread-7`). */
  private def threadNames(): Seq[String] =
    Thread.getAllStackTraces.keySet.toArray(Array.empty[Thread]).toSeq.filter(_.isAlive)
      .map(_.getName.replaceAll("[0-9]+", "N")).sorted

  private def osThreads(): Int =
    Option(new File("/proc/self/task").list()).map(_.length).getOrElse(-1)

  private def usage(): Usage = {
    System.gc()
    Thread.sleep(200)
    Usage(NativeLib.nativeLiveBytes(), ArrowMemory.rootAllocator.getAllocatedMemory, openFds(),
      threadNames(), osThreads())
  }

  test(s"native heap, Arrow memory, file descriptors and threads stay flat over $rounds rounds") {
    NativeLib.ensureLoaded()
    (0 until 3).foreach(round) // warm-up: every code path, caches and thread pools once
    val before = usage()
    (3 until 3 + rounds).foreach(round)
    val after = usage()
    val grownAll = after.threads.diff(before.threads)
    val grown = grownAll.filterNot(n => sparkPools.exists(n.startsWith))
      .groupBy(identity).map { case (n, v) => s"$n x${v.size}" }
    info(s"native ${before.native} -> ${after.native} bytes, Arrow ${before.arrow} -> ${after.arrow}, " +
      s"fds ${before.fds} -> ${after.fds}, threads ${before.threads.size} -> ${after.threads.size} " +
      s"(new: ${grownAll.distinct.mkString(", ")}), threads not listed by the JVM " +
      s"${before.nativeThreads} -> ${after.nativeThreads}, rounds $rounds")
    assert(before.arrow == 0 && after.arrow == 0, "Arrow buffers outlive their tasks")
    // The engine frees what a task allocated when the task ends; what is live between queries
    // is a few thread-locals and caches that do not grow with the rounds (measured: 48 bytes
    // over 25 rounds). A round runs 2·P write tasks and 100 read batches: the bound is 32 bytes
    // per write task (16,000 in the default 25 rounds), so a leak of 64 bytes per write task or
    // per read batch fails.
    val bound = 64L * 2 * partitions * rounds / 2
    assert(after.native - before.native < bound,
      s"native heap grew by ${after.native - before.native} bytes over $rounds rounds " +
        s"(${2 * partitions * rounds} write tasks, ${100 * rounds} read batches; bound $bound)")
    assert(after.fds - before.fds <= 4, s"file descriptors grew: $before -> $after")
    assert(grown.isEmpty, s"threads outside Spark's pools grew: ${grown.mkString(", ")}")
    // the JIT may add or retire a compiler thread or two; native threads of the library would
    // grow with the rounds
    assert(after.nativeThreads - before.nativeThreads <= 4,
      s"threads the JVM does not list grew: ${before.nativeThreads} -> ${after.nativeThreads}")
  }
}
