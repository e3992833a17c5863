package io.safetensors.spark.read

import java.util

import scala.collection.mutable
import scala.jdk.CollectionConverters._

import io.safetensors.spark.jni.{NativeLib, NativeReader, SafetensorsException}
import org.apache.arrow.c.{ArrowArray, ArrowSchema, Data}
import org.apache.arrow.memory.BufferAllocator
import org.apache.arrow.vector.VectorSchemaRoot
import org.apache.hadoop.fs.{FSDataInputStream, Path}
import org.apache.spark.TaskContext
import org.apache.spark.broadcast.Broadcast
import org.apache.spark.internal.Logging
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.connector.catalog.{MetadataColumn, SupportsDelete, SupportsMetadataColumns,
  SupportsRead, SupportsRowLevelOperations, Table, TableCapability}
import org.apache.spark.sql.connector.write.{RowLevelOperationBuilder, RowLevelOperationInfo}
import org.apache.spark.sql.connector.metric.{CustomMetric, CustomSumMetric, CustomTaskMetric}
import org.apache.spark.sql.execution.vectorized.{ColumnVectorUtils, ConstantColumnVector}
import org.apache.spark.sql.connector.read.{Batch, InputPartition, PartitionReader, PartitionReaderFactory, Scan, ScanBuilder, SupportsPushDownFilters, SupportsPushDownRequiredColumns}
import org.apache.spark.sql.safetensors.SparkInternals
import org.apache.spark.sql.sources._
import org.apache.spark.sql.types.{ArrayType, DataType, MapType, StructType}
import org.apache.spark.sql.util.CaseInsensitiveStringMap
import org.apache.spark.sql.vectorized.{ColumnVector, ColumnarBatch}
import io.safetensors.spark.files.{DatasetFiles, ShardHeaders}
import io.safetensors.spark.internal.{ArrowMemory, SerializableConf, TaskMetric}
import io.safetensors.spark.streaming.{DatasetStream, StreamOptions}
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream

/**
 * The table behind `format("safetensors")`. Reads: BATCH_READ through [[SafetensorsScanBuilder]].
 * Writes: no BATCH_WRITE, so `DataFrameWriter.save` takes the V1 route
 * ([[SafetensorsDataSource.createRelation]]). `source` is `None` for a write (nothing is listed).
 */
private[spark] class SafetensorsTable(tableSchema: StructType, userSchema: Boolean,
    source: => TableSource) extends Table with SupportsRead with SupportsMetadataColumns
    with SupportsRowLevelOperations with SupportsDelete {
  private lazy val src = source

  override def name(): String = "safetensors"
  override def schema(): StructType = tableSchema
  override def capabilities(): util.Set[TableCapability] =
    util.EnumSet.of(TableCapability.BATCH_READ, TableCapability.MICRO_BATCH_READ)

  override def metadataColumns(): Array[MetadataColumn] =
    src.description.metadataColumns.fields.map { f =>
      new MetadataColumn {
        override def name(): String = f.name
        override def dataType(): DataType = f.dataType
        override def isNullable: Boolean = f.nullable
        override def comment(): String = f.getComment().orNull
      }
    }

  override def newScanBuilder(options: CaseInsensitiveStringMap): ScanBuilder = {
    if (userSchema) SafetensorsTable.checkUserSchema(tableSchema, src)
    // a readStream of a catalog table (`readStream.option(...).table(t)`) gives its stream
    // options here, not to the table's source
    val given = options.asCaseSensitiveMap().asScala.map { case (k, v) => k.toLowerCase -> v }.toMap
    new SafetensorsScanBuilder(src, tableSchema, StreamOptions.overlay(src.options.stream, given))
  }

  /** `DELETE FROM` (copy-on-write, spec/dataset.md §5.11). */
  override def newRowLevelOperationBuilder(info: RowLevelOperationInfo): RowLevelOperationBuilder =
    io.safetensors.spark.write.Deletes.operationBuilder(info, src, tableSchema)

  /** A `DELETE FROM` whose condition selects whole partitions: Spark asks here first, and then
   *  runs [[deleteWhere]] instead of reading rows (spec/dataset.md §5.11). */
  override def canDeleteWhere(filters: Array[Filter]): Boolean =
    io.safetensors.spark.write.Deletes.wholeDirs(src, filters).isDefined

  override def deleteWhere(filters: Array[Filter]): Unit =
    io.safetensors.spark.write.Deletes.deleteWholeDirs(src, filters)
}

private[spark] object SafetensorsTable {
  /** An explicit `.schema(...)` must name columns the files have, with the types they have. */
  def checkUserSchema(user: StructType, src: TableSource): Unit = {
    val inferred = src.description.schema
    val problems = user.fields.flatMap { f =>
      inferred.fields.find(_.name == f.name) match {
        case None => Some(s"column '${f.name}' is not in the files (they have: " +
          inferred.fieldNames.mkString(", ") + ")")
        case Some(i) if !sameType(i.dataType, f.dataType) =>
          Some(s"column '${f.name}' is ${f.dataType.simpleString} in the given schema but " +
            s"${i.dataType.simpleString} in the files")
        case _ => None
      }
    }
    if (problems.nonEmpty) {
      throw new IllegalArgumentException(
        s"safetensors: the given schema does not match the files (layout ${src.description.layout}): " +
          problems.mkString("; "))
    }
  }

  /** Equal types, nullability aside. */
  def sameType(a: DataType, b: DataType): Boolean = (a, b) match {
    case (ArrayType(x, _), ArrayType(y, _)) => sameType(x, y)
    case (MapType(k1, v1, _), MapType(k2, v2, _)) => sameType(k1, k2) && sameType(v1, v2)
    case (StructType(f1), StructType(f2)) =>
      f1.length == f2.length && f1.zip(f2).forall { case (x, y) =>
        x.name == y.name && sameType(x.dataType, y.dataType)
      }
    case _ => a == b
  }
}

private[spark] final class SafetensorsScanBuilder(src: TableSource, tableSchema: StructType,
    stream: StreamOptions = StreamOptions())
    extends ScanBuilder with SupportsPushDownRequiredColumns with SupportsPushDownFilters {
  private var required: StructType = tableSchema
  private var pushed: Array[Filter] = Array.empty
  private var predicates: Seq[ReadPredicate] = Seq.empty
  private var partitionFilters: Seq[Filter] = Seq.empty

  override def pruneColumns(requiredSchema: StructType): Unit = required = requiredSchema

  /** Header-column filters are used to skip files and tensors; Spark still re-checks them all. */
  override def pushFilters(filters: Array[Filter]): Array[Filter] = {
    val columns = src.description.layout match {
      case "tensor" => Set("key", "dtype", "file")
      // a tensor named `file` moves the file's URI to the hidden `_file` (reading.md §2.3)
      case "file" => Set(if (src.description.metadataColumns.fieldNames.contains("_file")) "_file" else "file")
      case _ => Set("_file")
    }
    val used = mutable.ArrayBuffer[Filter]()
    val preds = mutable.ArrayBuffer[ReadPredicate]()
    def translate(f: Filter): Boolean = f match {
      case And(a, b) =>
        val x = translate(a)
        val y = translate(b)
        x || y
      case EqualTo(c, v: String) if columns(c) =>
        preds += ReadPredicate(c, "in", Seq(v)); true
      case In(c, vs) if columns(c) && vs.forall(_.isInstanceOf[String]) =>
        preds += ReadPredicate(c, "in", vs.map(_.asInstanceOf[String]).toSeq); true
      case StringStartsWith(c, p) if columns(c) =>
        preds += ReadPredicate(c, "prefix", Seq(p)); true
      case _ => false
    }
    filters.foreach(f => if (translate(f)) used += f)
    // filters on partition columns alone choose the partition directories a scan lists
    val partitionColumns = src.partitionSchema.fieldNames.toSet
    partitionFilters = filters.toSeq.filter(f => f.references.nonEmpty && f.references.forall(partitionColumns))
    pushed = (used ++ partitionFilters).distinct.toArray
    predicates = preds.toSeq
    filters
  }

  override def pushedFilters(): Array[Filter] = pushed

  /** The header-column predicates [[pushFilters]] translated (a DELETE's scan reuses them). */
  def readPredicates: Seq[ReadPredicate] = predicates

  /** The pushed filters on partition columns alone. */
  def partitionFilterList: Seq[Filter] = partitionFilters

  override def build(): Scan = new SafetensorsScan(src, required, predicates, partitionFilters, pushed, stream)
}

private[spark] class SafetensorsScan(src: TableSource, required: StructType,
    predicates: Seq[ReadPredicate], partitionFilters: Seq[Filter], pushed: Array[Filter],
    stream: StreamOptions = StreamOptions())
    extends Scan with Batch {
  /** Predicates added after the scan was built (a DELETE's runtime group filter on `_file`). */
  protected def extraPredicates: Seq[ReadPredicate] = Seq.empty

  override def readSchema(): StructType = required

  override def toBatch: Batch = {
    // readStream's start options would otherwise be silently ignored by a batch read
    if (stream.startGiven) {
      throw new IllegalArgumentException(
        s"safetensors: options '${StreamOptions.StartingVersion}' and " +
          s"'${StreamOptions.StartingTimestamp}' start a readStream; a batch read of a version " +
          "takes 'versionAsOf' or 'timestampAsOf'")
    }
    this
  }

  /** `spark.readStream` (spec/reading.md §8). */
  override def toMicroBatchStream(checkpointLocation: String): MicroBatchStream =
    DatasetStream(src, required, predicates, checkpointLocation, stream)

  override def description(): String =
    s"SafetensorsScan[layout=${src.description.layout}, ${src.summary}, " +
      s"pushed=${pushed.mkString("[", ", ", "]")}, columns=${required.fieldNames.mkString(",")}]"

  override def planInputPartitions(): Array[InputPartition] = {
    val spark = SparkSession.active
    val (maxBytes, openCost, _) = SparkInternals.filesConf(spark)
    val minPartitions = SparkInternals.filesMinPartitionNum(spark)
    src.plan(required, predicates ++ extraPredicates, partitionFilters, maxBytes, openCost, minPartitions)
      .toArray
  }

  /**
   * Tasks get the Hadoop configuration the driver listed with (session conf + read options),
   * broadcast as Spark's file sources do: inline in the factory, every task deserialized its
   * ~1,000 entries (~110 KB; ~10 ms of CPU and ~25 ms of wall time per task in local[2]).
   */
  override def createReaderFactory(): PartitionReaderFactory =
    new SafetensorsReaderFactory(
      SparkSession.active.sparkContext.broadcast(new SerializableConf(src.conf)), required,
      src.partitionSchema,
      src.options.ignoreCorruptFiles)

  override def supportedCustomMetrics(): Array[CustomMetric] =
    Array(new BytesReadMetric, new UnitsSkippedMetric)
}

/** A Rust read spec; `partitionValues`: the partition directory's values (partition columns). */
private[spark] final case class SafetensorsInputPartition(specJson: String, bytes: Long,
    partitionValues: InternalRow = InternalRow.empty) extends InputPartition

private[spark] final class BytesReadMetric extends CustomSumMetric {
  override def name(): String = BytesReadMetric.Name
  override def description(): String = "safetensors bytes read (headers + tensor data)"
}

private[spark] object BytesReadMetric { val Name = "safetensorsBytesRead" }

private[spark] final class UnitsSkippedMetric extends CustomSumMetric {
  override def name(): String = UnitsSkippedMetric.Name
  override def description(): String = "safetensors corrupt files skipped (ignoreCorruptFiles)"
}

private[spark] object UnitsSkippedMetric { val Name = "safetensorsCorruptFilesSkipped" }

private[spark] final class SafetensorsReaderFactory(conf: Broadcast[SerializableConf],
    schema: StructType, partitionSchema: StructType, ignoreCorrupt: Boolean)
    extends PartitionReaderFactory {
  override def supportColumnarReads(partition: InputPartition): Boolean = true

  override def createReader(partition: InputPartition): PartitionReader[InternalRow] =
    throw new UnsupportedOperationException("safetensors: only columnar reads")

  override def createColumnarReader(partition: InputPartition): PartitionReader[ColumnarBatch] = {
    val p = partition.asInstanceOf[SafetensorsInputPartition]
    new SafetensorsPartitionReader(p.specJson, conf.value, schema, partitionSchema,
      p.partitionValues, ignoreCorrupt)
  }
}

/**
 * Runs one partition: the Rust task reads unit after unit (local files memory-mapped, others
 * through positioned reads of just the ranges each batch needs) and hands each batch over the
 * Arrow C Data interface; the vectors are wrapped ([[ArrowBufferColumnVector]]), not copied.
 */
private[spark] final class SafetensorsPartitionReader(specJson: String, conf: SerializableConf,
    schema: StructType, partitionSchema: StructType, partitionValues: InternalRow,
    ignoreCorrupt: Boolean) extends PartitionReader[ColumnarBatch] with Logging {
  /** The columns Rust reads: `schema` without the partition columns (which are constants here). */
  private val dataSchema = StructType(schema.fields.filterNot(f => partitionSchema.fieldNames.contains(f.name)))
  NativeLib.ensureLoaded()
  private val allocator: BufferAllocator = ArrowMemory.rootAllocator.newChildAllocator(
    s"safetensors-read-${Option(TaskContext.get()).map(_.taskAttemptId()).getOrElse(-1L)}",
    0, Long.MaxValue)
  private var handle: Long = NativeReader.open(specJson)
  private val units = NativeReader.unitCount(handle)
  private var unit = 0
  private var opened = false
  private var stream: FSDataInputStream = null
  private var root: VectorSchemaRoot = null
  private var batch: ColumnarBatch = null
  private var bytesBefore = 0L
  private var skipped = 0L // units whose reading failed after opening (counted here)
  private var skippedBefore = 0L // units Rust skipped at open

  private def closeUnit(): Unit = {
    if (stream != null) { stream.close(); stream = null }
    opened = false
    unit += 1
  }

  private def openUnit(): Unit = {
    val uri = NativeReader.unitFile(handle, unit)
    val length = NativeReader.unitLength(handle, unit)
    val path = new Path(uri)
    val fs = path.getFileSystem(conf.value)
    DatasetFiles.localFile(fs, path) match {
      case Some(file) => NativeReader.openLocal(handle, unit, file.getAbsolutePath)
      case None =>
        if (NativeReader.verifyNeeded(handle, unit)) verifyWhole(fs, path)
        stream = ShardHeaders.openForRanges(fs, path, length)
        NativeReader.openRemote(handle, unit, ShardHeaders.readPrefixAndHeader(stream, uri, length))
    }
    opened = true
  }

  /**
   * Read option `verify_checksums`: streams the unit's whole object once, in order, through the
   * engine's CRC-32C, which fails (naming the file, both sizes or CRCs and the option) unless it
   * is what the dataset's manifest records; only then are the unit's ranges read.
   */
  private def verifyWhole(fs: org.apache.hadoop.fs.FileSystem, path: Path): Unit = {
    val in = fs.open(path)
    try {
      val buf = new Array[Byte](SafetensorsPartitionReader.VerifyChunk)
      var n = in.read(buf)
      while (n >= 0) {
        if (n > 0) NativeReader.verifyUpdate(handle, unit, buf, n)
        n = in.read(buf)
      }
    } finally in.close()
    NativeReader.verifyFinish(handle, unit)
  }

  /**
   * Reads the ranges the next batch needs, in order, in pieces of at most
   * [[SafetensorsPartitionReader.SupplyChunk]] bytes: a file's digest streams through them
   * without the file in memory, and no range is limited to a Java array's 2 GiB.
   */
  private def supplyRanges(): Unit = {
    // A batch of ragged columns needs two rounds (its offsets, then the values they span).
    var ranges = NativeReader.neededRanges(handle)
    while (ranges.nonEmpty) {
      var i = 0
      while (i < ranges.length) {
        var start = ranges(i)
        val end = ranges(i + 1)
        while (start < end) {
          val buf = new Array[Byte](math.min(end - start, SafetensorsPartitionReader.SupplyChunk).toInt)
          stream.readFully(start, buf)
          NativeReader.supply(handle, start, buf)
          start += buf.length
        }
        i += 2
      }
      ranges = NativeReader.neededRanges(handle)
    }
  }

  private def releaseBatch(): Unit = {
    if (batch != null) { batch = null }
    if (root != null) { root.close(); root = null }
  }

  override def next(): Boolean = {
    releaseBatch()
    while (unit < units) {
      try {
        if (!opened) openUnit()
        if (stream != null) supplyRanges()
        val array = ArrowArray.allocateNew(allocator)
        val arrowSchema = ArrowSchema.allocateNew(allocator)
        try {
          val rows = NativeReader.nextBatch(handle, array.memoryAddress(), arrowSchema.memoryAddress())
          if (rows < 0) closeUnit()
          else {
            val data: Array[ColumnVector] = if (dataSchema.isEmpty) Array.empty else {
              root = Data.importVectorSchemaRoot(allocator, array, arrowSchema, null)
              val fields = root.getFieldVectors
              dataSchema.fields.indices.map { i =>
                ArrowBufferColumnVector.wrap(fields.get(i), dataSchema.fields(i).dataType): ColumnVector
              }.toArray
            }
            batch = new ColumnarBatch(withPartitionColumns(data, rows.toInt), rows.toInt)
            return true
          }
        } finally {
          array.close()
          arrowSchema.close()
        }
      } catch {
        case e: SafetensorsException if ignoreCorrupt =>
          logWarning(s"safetensors: skipping the rest of a corrupt file (ignoreCorruptFiles): " +
            e.getMessage)
          skipped += 1
          closeUnit()
      }
    }
    false
  }

  override def get(): ColumnarBatch = batch

  /** `data` (the columns of `dataSchema`) with the partition columns put where `schema` has them. */
  private def withPartitionColumns(data: Array[ColumnVector], rows: Int): Array[ColumnVector] =
    if (partitionSchema.isEmpty) data
    else {
      val next = data.iterator
      schema.fields.map { f =>
        partitionSchema.fieldNames.indexOf(f.name) match {
          case i if i >= 0 =>
            val v = new ConstantColumnVector(rows, f.dataType)
            ColumnVectorUtils.populate(v, partitionValues, i)
            v: ColumnVector
          case _ => next.next()
        }
      }
    }

  override def currentMetricsValues(): Array[CustomTaskMetric] = {
    if (handle != 0L) {
      bytesBefore = NativeReader.bytesRead(handle)
      skippedBefore = NativeReader.skipped(handle)
    }
    Array(TaskMetric(BytesReadMetric.Name, bytesBefore),
      TaskMetric(UnitsSkippedMetric.Name, skipped + skippedBefore))
  }

  override def close(): Unit = {
    try releaseBatch()
    finally try { if (stream != null) { stream.close(); stream = null } }
    finally {
      if (handle != 0L) {
        bytesBefore = NativeReader.bytesRead(handle)
        skippedBefore = NativeReader.skipped(handle)
        val h = handle
        handle = 0L
        NativeReader.close(h)
      }
      allocator.close()
    }
  }
}

private[spark] object SafetensorsPartitionReader {
  /** Largest piece of a range read at once through a non-local file system. */
  val SupplyChunk: Long = 16L << 20

  /** Piece of a whole object streamed through the CRC-32C check (`verify_checksums`). */
  val VerifyChunk: Int = 4 << 20
}
