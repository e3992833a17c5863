package io.safetensors.spark.write

import io.safetensors.spark.internal.Json
import java.util
import java.util.UUID

import scala.collection.mutable
import scala.jdk.CollectionConverters._

import io.safetensors.spark.Compaction
import io.safetensors.spark.commit.DatasetCommit
import io.safetensors.spark.files.{DatasetFiles, HivePartitions}
import io.safetensors.spark.jni.{NativeCompaction, NativeLib}
import io.safetensors.spark.read.{PartitionedSource, ReadPredicate, SafetensorsInputPartition, SafetensorsScan,
  TableSource}
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.{DataFrame, Row, SparkSession}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.connector.expressions.{Expressions, Literal, NamedReference}
import org.apache.spark.sql.connector.expressions.filter.Predicate
import org.apache.spark.sql.connector.read.{InputPartition, Scan, ScanBuilder, SupportsPushDownFilters,
  SupportsPushDownRequiredColumns, SupportsRuntimeV2Filtering}
import org.apache.spark.sql.connector.write.{BatchWrite, DataWriter, DataWriterFactory, LogicalWriteInfo,
  PhysicalWriteInfo, RowLevelOperation, RowLevelOperationBuilder, RowLevelOperationInfo, Write,
  WriteBuilder, WriterCommitMessage}
import org.apache.spark.sql.safetensors.{SparkInternals, SparkLine}
import org.apache.spark.sql.sources.Filter
import org.apache.spark.sql.types.{LongType, StringType, StructField, StructType}
import org.apache.spark.sql.util.CaseInsensitiveStringMap

/**
 * DELETE (spec/dataset.md §5.11): copy-on-write. The shards holding rows to delete are rewritten
 * without them by the dataset crate's rewrite plan (a compaction plan with `operation: delete`,
 * [[Compaction.runPlan]]), as one `delete` version per dataset directory; every other shard is
 * untouched. Rows are named by provenance (`_file`, `_row_index`, spec/reading.md §2.1): the
 * rewrite copies the kept rows' bytes, never values converted through Spark.
 */
object Deletes {
  private val mapper = Json.mapper

  /** Tests only: runs after the new shards are in place, before the commit. */
  @volatile private[spark] var beforeCommit: () => Unit = null

  val ResultSchema: StructType = StructType(Seq(
    StructField("version", LongType, nullable = true),
    StructField("rows_removed", LongType, nullable = false),
    StructField("shards_replaced", LongType, nullable = false),
    StructField("shards_written", LongType, nullable = false)))

  /**
   * Deletes the rows of the dataset at `path` (a dataset directory or a `partitionBy` root) for
   * which `condition` (a SQL boolean expression over its columns, partition columns and the
   * provenance columns) is true. Returns one row per dataset directory changed: `version`,
   * `rows_removed`, `shards_replaced`, `shards_written`. Works on every Spark line built.
   */
  def delete(spark: SparkSession, path: String, condition: String,
      commitMessage: Option[String] = None): DataFrame = {
    NativeLib.ensureLoaded()
    if (condition == null || condition.trim.isEmpty) {
      throw new IllegalArgumentException("safetensors: delete: the condition is empty; to delete " +
        "every row overwrite the dataset with an empty DataFrame")
    }
    val df = spark.read.format("safetensors").load(path)
    val provenance = try df.select("_file", "_row_index") catch {
      case e: org.apache.spark.sql.AnalysisException =>
        throw new IllegalArgumentException(s"safetensors: delete: $path is not read per sample (a " +
          "batch-mode dataset); a KV dataset's keys are deleted with SafetensorsDataset.deleteKeys " +
          "(PySpark: safetensors_spark.spark.delete_keys)", e)
    }
    // a condition over the partition columns alone: whole directories, no row read
    val whole = wholePartitionsWhere(spark, path, condition)
    if (whole.isDefined) {
      val results = whole.get.map(d => run(spark, d, mapper.createObjectNode().put("all", true), commitMessage))
        .filter(_.getLong(1) > 0)
      return spark.createDataFrame(results.asJava, ResultSchema)
    }
    val matched = df.where(condition).select(provenance.columns.map(df.col): _*).collect()
    val rows = mutable.Map[String, mutable.ArrayBuffer[Long]]()
    matched.foreach { r => rows.getOrElseUpdate(r.getString(0), mutable.ArrayBuffer()) += r.getLong(1) }
    val results = byDataset(spark, rows.keys.toSeq).map { case (dir, files) =>
      val request = mapper.createObjectNode()
      val del = request.putObject("delete")
      files.foreach { case (uri, name) =>
        val arr = del.putArray(name)
        rows(uri).distinct.sorted.foreach(v => arr.add(v))
      }
      run(spark, dir, request, commitMessage)
    }
    spark.createDataFrame(results.asJava, ResultSchema)
  }

  /**
   * The partition directories of the partitioned root `path` for whose values `condition` is
   * true, when it names partition columns only (and is deterministic): evaluated by Spark over one
   * row per directory (its values as the read types them, NULL for a null value), so a row of a
   * directory matches exactly when the directory's row does, SQL's NULL rules included. None when
   * `path` is no partitioned root or the condition needs a row's columns.
   */
  private def wholePartitionsWhere(spark: SparkSession, path: String, condition: String): Option[Seq[Path]] = {
    val conf = SparkInternals.hadoopConf(spark, Map.empty[String, String])
    val given = new Path(path)
    val fs = given.getFileSystem(conf)
    val root = fs.makeQualified(given)
    // a glob or a file is no partitioned root (the read of the rows handles them)
    if (path.exists(c => "*?[{".contains(c)) ||
      !scala.util.Try(fs.getFileStatus(root).isDirectory).getOrElse(false)) return None
    HivePartitions.discover(fs, root).flatMap { dirs =>
      val inferTypes =
        spark.conf.get("spark.sql.sources.partitionColumnTypeInference.enabled", "true").toBoolean
      val schema = HivePartitions.schema(dirs, inferTypes)
      val dirColumn = "__safetensors_partition_dir"
      val rows = dirs.map { d =>
        Row.fromSeq(HivePartitions.row(d, schema).toSeq(schema).map {
          case u: org.apache.spark.unsafe.types.UTF8String => u.toString
          case other => other
        } :+ d.path.toString)
      }
      val parts = spark.createDataFrame(rows.asJava, schema.add(dirColumn, StringType, nullable = false))
      val selected = try Some(parts.where(condition)) catch {
        case _: org.apache.spark.sql.AnalysisException => None // a column that is no partition column
      }
      selected.filter { f =>
        SparkInternals.logicalPlan(f).collectFirst {
          case n if n.expressions.exists(e => !e.deterministic) => n
        }.isEmpty
      }.map(_.select(dirColumn).collect().map(r => new Path(r.getString(0))).toSeq.sortBy(_.toString))
    }
  }

  def delete(spark: SparkSession, path: String, condition: String, commitMessage: String): DataFrame =
    delete(spark, path, condition, Option(commitMessage))

  /** The files' dataset directories: URI → (directory, shard name), grouped by directory. */
  private def byDataset(spark: SparkSession, uris: Seq[String]): Seq[(Path, Seq[(String, String)])] =
    uris.map { u =>
      val p = new Path(u)
      (p.getParent, (u, p.getName))
    }.groupBy(_._1).toSeq.sortBy(_._1.toString).map { case (d, fs) => d -> fs.map(_._2).sortBy(_._2) }

  /** Plans (JNI `planDelete`) and runs a delete on the dataset at `dir`; one result row. */
  private[spark] def run(spark: SparkSession, dir: Path,
      request: com.fasterxml.jackson.databind.node.ObjectNode, commitMessage: Option[String],
      base: Option[String] = None): Row = {
    val conf = SparkInternals.hadoopConf(spark, Map.empty[String, String])
    val fs = dir.getFileSystem(conf)
    val dest = fs.makeQualified(dir)
    val commits = new DatasetCommit(fs, dest, conf, DatasetFiles.localFile(fs, dest))
    // the version the request was made on (deleteKeys found its candidates there), else the latest
    val baseText = base.getOrElse(latest(commits, dest)._2)
    DatasetFiles.ownDir(fs, dest, DatasetFiles.IndexDir)
    request.put("write_id", UUID.randomUUID().toString)
    val planJson = NativeCompaction.planDelete(baseText, mapper.writeValueAsString(request))
    val plan = mapper.readTree(planJson)
    val replaced = plan.get("replaced").size().toLong
    val version: java.lang.Long =
      if (replaced == 0) null
      else java.lang.Long.valueOf(Compaction.runPlan(spark, fs, dest, conf, commits, baseText, planJson,
        commitMessage, Option(beforeCommit)))
    Row(version, plan.get("rows_removed").asLong(), replaced, plan.get("outputs").size().toLong)
  }

  /** The latest version of the dataset at `dest`; not a dataset: an error naming it. */
  private[spark] def latest(commits: DatasetCommit, dest: Path): (Long, String) =
    commits.latest().getOrElse(throw new IllegalArgumentException(
      s"safetensors: delete: $dest has no ${DatasetFiles.ManifestName}: not a dataset"))

  /** The partition directories a DELETE condition (`filters`, all of it) empties whole, when the
   *  partition values alone decide it for every directory of a batch-layout partitioned root. */
  private[spark] def wholeDirs(src: TableSource, filters: Array[Filter]): Option[Seq[Path]] = src match {
    case p: PartitionedSource if p.description.layout == "sample" => p.wholeDirsWhere(filters.toSeq)
    case _ => None
  }

  /** Deletes every row of the directories [[wholeDirs]] selects, one `delete` version each,
   *  from their manifests alone: no shard is read. */
  private[spark] def deleteWholeDirs(src: TableSource, filters: Array[Filter]): Unit = {
    val dirs = wholeDirs(src, filters).getOrElse(throw new IllegalStateException(
      "safetensors: DELETE: the condition does not select whole partitions"))
    val spark = SparkSession.active
    dirs.foreach { d =>
      val request = mapper.createObjectNode().put("all", true)
      run(spark, d, request, None)
    }
  }

  // ---- SQL DELETE: Spark's row-level operations (DataSource V2, copy-on-write)

  /** `newRowLevelOperationBuilder` of a safetensors table whose source is `src`. */
  private[spark] def operationBuilder(info: RowLevelOperationInfo, src: TableSource,
      tableSchema: StructType): RowLevelOperationBuilder = new RowLevelOperationBuilder {
    override def build(): RowLevelOperation = {
      if (info.command() != RowLevelOperation.Command.DELETE) {
        throw new UnsupportedOperationException(s"safetensors: ${info.command()} is not supported; " +
          "DELETE is (copy-on-write, spec/dataset.md §5.11)")
      }
      if (src.description.layout != "sample") {
        throw new UnsupportedOperationException("safetensors: DELETE works on batch-mode datasets " +
          s"(read per sample); this table reads in the ${src.description.layout} layout. A KV " +
          "dataset's keys are deleted with SafetensorsDataset.deleteKeys (PySpark: " +
          "safetensors_spark.spark.delete_keys; any file system), safetensors_spark.delete_keys or " +
          "`safetensors-spark delete --keys` (local paths)")
      }
      new DeleteOperation(src, tableSchema)
    }
  }
}

/** The copy-on-write DELETE of one statement: its scan (the shards read) and its write. */
private[spark] final class DeleteOperation(src: TableSource, tableSchema: StructType)
    extends RowLevelOperation {
  @volatile private[write] var scan: RowLevelScan = null

  override def command(): RowLevelOperation.Command = RowLevelOperation.Command.DELETE
  override def description(): String = "safetensors copy-on-write DELETE"

  override def requiredMetadataAttributes(): Array[NamedReference] =
    Array(Expressions.column("_file"), Expressions.column("_row_index"))

  override def newScanBuilder(options: CaseInsensitiveStringMap): ScanBuilder =
    new ScanBuilder with SupportsPushDownRequiredColumns with SupportsPushDownFilters {
      private val inner = new io.safetensors.spark.read.SafetensorsScanBuilder(src, tableSchema)
      private var required: StructType = tableSchema
      override def pruneColumns(s: StructType): Unit = { required = s; inner.pruneColumns(s) }
      override def pushFilters(filters: Array[Filter]): Array[Filter] = inner.pushFilters(filters)
      override def pushedFilters(): Array[Filter] = inner.pushedFilters()
      override def build(): Scan = {
        val s = new RowLevelScan(src, required, inner.readPredicates, inner.partitionFilterList,
          inner.pushedFilters())
        scan = s
        s
      }
    }

  override def newWriteBuilder(info: LogicalWriteInfo): WriteBuilder = new WriteBuilder {
    override def build(): Write = new Write {
      override def toBatch: BatchWrite = new DeleteBatchWrite(DeleteOperation.this, info)
    }
  }
}

/**
 * The scan of a DELETE: a [[SafetensorsScan]] that Spark's runtime group filter narrows to the
 * shards holding matching rows (`_file IN (...)`), and that remembers the shards it planned: the
 * write rewrites exactly those that lose a row.
 */
private[spark] final class RowLevelScan(src: TableSource, required: StructType,
    predicates: Seq[ReadPredicate], partitionFilters: Seq[Filter], pushed: Array[Filter])
    extends SafetensorsScan(src, required, predicates, partitionFilters, pushed)
    with SupportsRuntimeV2Filtering {
  @volatile private var files: Option[Seq[String]] = None
  @volatile private[write] var planned: Seq[String] = Seq.empty

  override def filterAttributes(): Array[NamedReference] = Array(Expressions.column("_file"))

  override def filter(preds: Array[Predicate]): Unit = preds.foreach { p =>
    val refs = p.children().toSeq
    val onFile = refs.headOption.exists {
      case n: NamedReference => n.fieldNames().sameElements(Array("_file"))
      case _ => false
    }
    if (onFile && (p.name() == "IN" || p.name() == "=")) {
      val values = refs.tail.collect { case l: Literal[_] => String.valueOf(l.value()) }
      files = Some(files.fold(values)(_.intersect(values)))
    }
  }

  override protected def extraPredicates: Seq[ReadPredicate] =
    files.map(f => ReadPredicate("_file", "in", f)).toSeq

  override def planInputPartitions(): Array[InputPartition] = {
    val parts = super.planInputPartitions()
    val m = Json.mapper
    planned = parts.toSeq.flatMap { p =>
      m.readTree(p.asInstanceOf[SafetensorsInputPartition].specJson).get("units").elements().asScala
        .map(_.get("file").asText())
    }.distinct
    parts
  }
}

/** A task's kept rows: file URI → runs `[start, end)` of row indices. */
private[spark] final case class KeptRows(runs: Map[String, Seq[(Long, Long)]]) extends WriterCommitMessage

private[spark] final class DeleteBatchWrite(op: DeleteOperation, info: LogicalWriteInfo) extends BatchWrite {
  override def createBatchWriterFactory(physical: PhysicalWriteInfo): DataWriterFactory = {
    // the metadata row holds the operation's requiredMetadataAttributes (_file, _row_index)
    val meta = info.metadataSchema().orElse(new StructType())
    def at(name: String, default: Int) = if (meta.fieldNames.contains(name)) meta.fieldIndex(name) else default
    val fileIdx = at("_file", 0)
    val rowIdx = at("_row_index", 1)
    new KeptRowsWriterFactory(fileIdx, rowIdx)
  }

  override def commit(messages: Array[WriterCommitMessage]): Unit = {
    val scan = op.scan
    if (scan == null) throw new IllegalStateException("safetensors: DELETE: the scan was not planned")
    val kept = mutable.Map[String, mutable.ArrayBuffer[(Long, Long)]]()
    messages.foreach {
      case KeptRows(runs) => runs.foreach { case (f, r) => kept.getOrElseUpdate(f, mutable.ArrayBuffer()) ++= r }
      case _ =>
    }
    val spark = SparkSession.active
    val mapper = Json.mapper
    scan.planned.map(u => new Path(u)).groupBy(_.getParent).toSeq.sortBy(_._1.toString).foreach {
      case (dir, shards) =>
        val request = mapper.createObjectNode()
        val keep = request.putObject("keep")
        shards.foreach { p =>
          val arr = keep.putArray(p.getName)
          kept.getOrElse(p.toString, mutable.ArrayBuffer()).foreach { case (a, b) =>
            arr.addArray().add(a).add(b)
          }
        }
        Deletes.run(spark, dir, request, None)
    }
  }

  override def abort(messages: Array[WriterCommitMessage]): Unit = ()
}

private[spark] final class KeptRowsWriterFactory(fileIdx: Int, rowIdx: Int) extends DataWriterFactory {
  override def createWriter(partitionId: Int, taskId: Long): DataWriter[InternalRow] =
    new KeptRowsWriter(fileIdx, rowIdx)
}

/** Records the provenance of every row the DELETE keeps (the rows it read and did not match). */
private[spark] final class KeptRowsWriter(fileIdx: Int, rowIdx: Int) extends SparkLine.MetadataDataWriter {
  private val runs = mutable.Map[String, mutable.ArrayBuffer[(Long, Long)]]()

  override def writeWithMetadata(metadata: InternalRow, record: InternalRow): Unit = {
    val file = metadata.getUTF8String(fileIdx).toString
    val row = metadata.getLong(rowIdx)
    val buf = runs.getOrElseUpdate(file, mutable.ArrayBuffer())
    if (buf.nonEmpty && buf.last._2 == row) buf(buf.length - 1) = (buf.last._1, row + 1)
    else buf += ((row, row + 1))
  }

  override def commit(): WriterCommitMessage = KeptRows(runs.map { case (f, b) => f -> b.toList }.toMap)
  override def abort(): Unit = runs.clear()
  override def close(): Unit = ()
}
