package io.safetensors.spark.write

import io.safetensors.spark.internal.Json
import java.io.File

import scala.jdk.CollectionConverters._

import com.fasterxml.jackson.databind.JsonNode
import io.safetensors.spark.jni.{NativeLib, NativeWriter}
import org.apache.arrow.memory.BufferAllocator
import org.apache.hadoop.fs.Path
import org.apache.spark.{SparkContext, TaskContext}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.safetensors.TaskOutput
import org.apache.spark.sql.types.StructType
import org.apache.spark.util.LongAccumulator
import io.safetensors.spark.commit.ObjectStoreCommit
import io.safetensors.spark.files.DatasetFiles
import io.safetensors.spark.internal.{ArrowMemory, SerializableConf}

/** What the driver ships to every task. */
private[spark] final case class TaskJob(planJson: String, schema: StructType, stagingDir: String,
    conf: SerializableConf, metrics: WriteMetrics = null)

/**
 * Named accumulators of a write, registered on the driver: the stage page's "Accumulators"
 * table and `SparkListener` task/stage accumulables (bytes and rows are the tasks' output
 * metrics, [[org.apache.spark.sql.safetensors.TaskOutput]]).
 */
private[spark] final case class WriteMetrics(shards: LongAccumulator, writeNanos: LongAccumulator)

private[spark] object WriteMetrics {
  val ShardsName = "safetensors shards written"
  val WriteTimeName = "safetensors conversion + shard write time (ns)"
  def apply(sc: SparkContext): WriteMetrics =
    WriteMetrics(sc.longAccumulator(ShardsName), sc.longAccumulator(WriteTimeName))
}

/**
 * A task's result: where its task report file (TaskReport JSON, written by the native writer;
 * one entry per KV row, so it is never held in executor memory) and each sealed shard now live
 * (staging URIs), and each shard's index part (shard name → staging URI; spec/dataset.md §6.1),
 * staged exactly like the shards.
 */
private[spark] final case class TaskResult(partition: Int, reportFile: String,
    staged: Map[String, String], indexParts: Map[String, String] = Map.empty)

/** Owner of one native writer handle: calls are serialised, close is idempotent. */
private[spark] final class NativeTaskWriter(planJson: String, partition: Int, workDir: String)
    extends AutoCloseable {
  private var handle: Long = NativeWriter.open(planJson, partition, workDir)

  private def live(): Long = {
    if (handle == 0L) throw new IllegalStateException("safetensors: native writer already closed")
    handle
  }

  def writeBatch(arrayAddr: Long, schemaAddr: Long): String = synchronized {
    NativeWriter.writeBatch(live(), arrayAddr, schemaAddr)
  }

  def finish(): String = synchronized(NativeWriter.finish(live()))

  def abort(): Unit = synchronized {
    if (handle != 0L) NativeWriter.abort(handle)
  }

  override def close(): Unit = synchronized {
    if (handle != 0L) {
      val h = handle
      handle = 0L
      NativeWriter.close(h)
    }
  }
}

private[spark] object WriteTask {
  /** Test hook: when set, called with each task's allocator just before it is closed. */
  @volatile var onAllocatorClose: BufferAllocator => Unit = null

  private val mapper = Json.mapper

  def run(ctx: TaskContext, rows: Iterator[InternalRow], job: TaskJob): TaskResult = {
    NativeLib.ensureLoaded()
    val partition = ctx.partitionId()
    val conf = job.conf.value
    val staging = new Path(job.stagingDir)
    val fs = staging.getFileSystem(conf)
    val attemptDir = new Path(staging, s"attempt-$partition-${ctx.taskAttemptId()}")
    val direct = DatasetFiles.localFile(fs, attemptDir)
    val wire = WirePlan.parse(job.planJson) // before the local work dir exists: nothing to leak
    // a local work dir only when the dataset is not on the local file system; owned (locked) by
    // this JVM so that a later task removes it if this executor is killed (LocalWorkDir)
    val owned = if (direct.isEmpty) Some(LocalWorkDir.create()) else None
    val workDir: File = direct.getOrElse(owned.get.dir)
    val allocator = ArrowMemory.rootAllocator.newChildAllocator(s"safetensors-task-$partition-${ctx.taskAttemptId()}",
      0, Long.MaxValue)
    val builder = new ArrowBatchBuilder(wire, job.schema, allocator)
    var writer: NativeTaskWriter = null
    var closed = false
    def closeAll(): Unit = synchronized {
      if (!closed) {
        closed = true
        try builder.close() finally try { if (writer != null) writer.close() } finally {
          val hook = onAllocatorClose
          if (hook != null) hook(allocator)
          allocator.close()
        }
      }
    }
    ctx.addTaskCompletionListener[Unit](_ => closeAll())
    val staged = scala.collection.mutable.LinkedHashMap[String, String]()
    // Object stores (spec/dataset.md §5.6): shards stay in the local work dir until the commit
    // coordinator authorises this attempt, then go straight to their final names in the dataset.
    val objectStore = direct.isEmpty && ObjectStoreCommit.applies(fs)
    val dest = staging.getParent
    val pending = scala.collection.mutable.LinkedHashMap[String, File]()
    val uploaded = scala.collection.mutable.ArrayBuffer[Path]()
    // A file the native writer left in the work dir, moved to the attempt dir if that is not it.
    def stage(f: JsonNode): Path = {
      val dest = new Path(attemptDir, f.get("file").asText())
      if (direct.isEmpty) {
        DatasetFiles.uploadLocal(fs, new File(f.get("local_path").asText()), dest)
      }
      dest
    }
    var records, bytes, sealedCount, nanos = 0L // the task's output metrics and WriteMetrics
    def timed[T](f: => T): T = { val t0 = System.nanoTime(); try f finally nanos += System.nanoTime() - t0 }
    def place(shards: JsonNode): Unit =
      shards.elements().asScala.foreach { s =>
        val file = s.get("file").asText()
        val local = new File(s.get("local_path").asText())
        bytes += local.length()
        sealedCount += 1
        if (objectStore) pending(file) = local
        else staged(file) = stage(s).toString
      }
    try {
      if (direct.isEmpty) fs.mkdirs(attemptDir)
      writer = new NativeTaskWriter(job.planJson, partition, workDir.getAbsolutePath)
      while (rows.hasNext) {
        builder.add(rows.next())
        records += 1
        if (builder.isFull) place(mapper.readTree(timed(builder.flush(writer.writeBatch))))
      }
      if (builder.rowCount > 0) place(mapper.readTree(timed(builder.flush(writer.writeBatch))))
      val done = mapper.readTree(timed(writer.finish()))
      place(done.get("sealed"))
      TaskOutput.add(ctx, bytes, records)
      Option(job.metrics).foreach { m => m.shards.add(sealedCount); m.writeNanos.add(nanos) }
      val parts = done.path("index_parts").elements().asScala
        .map(p => p.get("shard").asText() -> stage(p).toString).toMap
      val report = stage(done.get("report_file")).toString
      if (pending.nonEmpty) {
        org.apache.spark.sql.safetensors.CommitCoordination.authorize(ctx, s"its shards of $dest")
        pending.foreach { case (file, local) =>
          val target = new Path(dest, file)
          uploaded += target
          DatasetFiles.uploadLocal(fs, local, target)
          staged(file) = target.toString
        }
      }
      TaskResult(partition, report, staged.toMap, parts)
    } catch {
      case t: Throwable =>
        try { if (writer != null) writer.abort() } catch { case e: Throwable => t.addSuppressed(e) }
        try fs.delete(attemptDir, true) catch { case e: Throwable => t.addSuppressed(e) }
        uploaded.foreach(p => try fs.delete(p, false) catch { case e: Throwable => t.addSuppressed(e) })
        throw t
    } finally {
      try closeAll()
      finally owned.foreach(_.delete())
    }
  }
}
