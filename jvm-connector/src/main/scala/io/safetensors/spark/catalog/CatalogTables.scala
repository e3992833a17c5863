package io.safetensors.spark.catalog

import io.safetensors.spark.internal.Json
import java.util

import scala.jdk.CollectionConverters._

import io.safetensors.spark.jni.{NativeLib, NativeWriter}
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.{DataFrame, SaveMode, SparkSession}
import org.apache.spark.sql.connector.catalog.{MetadataColumn, SupportsWrite, TableCapability}
import org.apache.spark.sql.connector.expressions.{Expressions, Transform}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.connector.read.{Batch, InputPartition, PartitionReader, PartitionReaderFactory, Scan, ScanBuilder}
import org.apache.spark.sql.connector.write.{LogicalWriteInfo, SupportsTruncate, V1Write, WriteBuilder}
import org.apache.spark.sql.connector.metric.{CustomMetric, CustomTaskMetric}
import org.apache.spark.sql.safetensors.{SparkInternals, SparkLine}
import org.apache.spark.sql.sources.InsertableRelation
import org.apache.spark.sql.types.StructType
import org.apache.spark.sql.util.CaseInsensitiveStringMap
import io.safetensors.spark.SafetensorsDataSource
import io.safetensors.spark.files.DatasetFiles
import io.safetensors.spark.internal.ConnectorOptions
import io.safetensors.spark.read.{ReadOptions, SafetensorsTable, TableSource}
import io.safetensors.spark.write.{PartitionedWriter, WriteStats}

/**
 * The options of a table: those of `spark.read/df.write...option(...)` for a path, or the
 * properties a catalog stores for `CREATE TABLE ... USING safetensors [OPTIONS (...)]
 * [TBLPROPERTIES (...)] [LOCATION ...]` (spec/options.md, "Table options").
 *
 * A catalog table is recognised by the `provider` property every catalog table carries. Its
 * Spark-reserved properties (provider, location, owner, ...) are accepted and dropped; `option.k`
 * (how Spark stores an OPTIONS entry, next to a copy named `k`) is `k`; every other key must be a
 * read option or a write option, else the table is refused naming the key.
 *
 * @param read  the options a scan parses ([[ReadOptions]]), with `path` when there is one
 * @param write the options an INSERT passes to the writer (without `path`), for catalog tables
 */
private[spark] final case class TableOptions(
    read: Map[String, String],
    write: Map[String, String],
    catalog: Boolean,
    path: Option[String])

private[spark] object TableOptions {
  /** Properties Spark itself gives a catalog table (TableCatalog.PROP_*, and the path). */
  val Reserved: Seq[String] = Seq("provider", "location", "owner", "comment", "collation",
    "external", "is_managed_location", "path", "paths")

  /** The prefix under which Spark stores a table's OPTIONS (TableCatalog.OPTION_PREFIX). */
  val OptionPrefix = "option."

  private val mapper = Json.mapper

  /** The writer's user options, from Rust (the one list, spec/options.md "Write options"). */
  lazy val WriteKeys: Seq[String] = {
    NativeLib.ensureLoaded()
    mapper.readTree(NativeWriter.writeOptionNames()).elements().asScala.map(_.asText()).toSeq
  }

  /** Options the Scala side of a write adds to the writer's (partitioned writes). */
  private val ScalaWriteKeys: Seq[String] = Seq(PartitionedWriter.OverwriteModeKey)

  def isCatalog(properties: Map[String, String]): Boolean =
    properties.keys.exists(_.equalsIgnoreCase("provider"))

  def apply(properties: Map[String, String]): TableOptions = {
    val path = ConnectorOptions.path(properties)
    if (!isCatalog(properties)) return TableOptions(properties, Map.empty, catalog = false, path)
    val lower = properties.keySet.map(_.toLowerCase)
    val user = properties.toSeq.flatMap { case (k, v) =>
      val l = k.toLowerCase
      if (l.startsWith(OptionPrefix)) Some(k.substring(OptionPrefix.length) -> v)
      else if (lower.contains(OptionPrefix + l)) None
      else Some(k -> v)
    }.filterNot { case (k, _) => Reserved.contains(k.toLowerCase) }.toMap
    val readKeys = ReadOptions.Keys.map(_.toLowerCase).toSet
    val writeKeys = (WriteKeys ++ ScalaWriteKeys).map(_.toLowerCase).toSet
    val unknown = user.keys.filterNot(k => readKeys(k.toLowerCase) || writeKeys(k.toLowerCase))
    if (unknown.nonEmpty) {
      throw new IllegalArgumentException(
        s"safetensors: unknown table option(s) ${unknown.toSeq.sorted.map(k => s"'$k'").mkString(", ")}; " +
          s"a table's OPTIONS and TBLPROPERTIES may be read options (${ReadOptions.Keys.mkString(", ")}) " +
          s"or write options (${(WriteKeys ++ ScalaWriteKeys).mkString(", ")}); Spark's own table " +
          s"properties (${Reserved.filterNot(_.startsWith("path")).mkString(", ")}) are accepted too")
    }
    val read = user.filter { case (k, _) => readKeys(k.toLowerCase) } ++ path.map("path" -> _)
    val write = user.filter { case (k, _) => writeKeys(k.toLowerCase) }
    TableOptions(read, write, catalog = true, path)
  }
}

/**
 * A table that comes from a catalog (`CREATE TABLE`, `saveAsTable`, `writeTo`): reads as any
 * safetensors table (an empty scan while its location holds no data yet) and takes INSERT INTO /
 * INSERT OVERWRITE / CTAS / RTAS through Spark's V1 write fallback (V1_BATCH_WRITE, TRUNCATE):
 * the rows go to [[SafetensorsDataSource.createRelation]] with SaveMode Append or Overwrite, the
 * table's write options under the INSERT's own, and the table's location as the path.
 *
 * A table for `save(path)` / `load(path)` is a plain [[SafetensorsTable]]: it declares no
 * BATCH_WRITE, so `save(path)` keeps Spark's V1 route for every SaveMode
 * (`DataFrameWriter.saveInternal` checks BATCH_WRITE only).
 */
private[spark] final class SafetensorsCatalogTable(tableSchema: StructType,
    partitionColumns: Seq[String], options: TableOptions, tableProperties: Map[String, String],
    source: => TableSource)
    extends SafetensorsTable(tableSchema, userSchema = true, source) with SupportsWrite {

  /** The catalog's properties (DESCRIBE EXTENDED shows them: provider, location, options). */
  override def properties(): util.Map[String, String] = tableProperties.asJava

  override def partitioning(): Array[Transform] =
    partitionColumns.map(c => Expressions.identity(c): Transform).toArray

  override def capabilities(): util.Set[TableCapability] = {
    val caps = util.EnumSet.noneOf(classOf[TableCapability])
    caps.addAll(super.capabilities())
    caps.add(TableCapability.V1_BATCH_WRITE)
    caps.add(TableCapability.TRUNCATE)
    caps
  }

  /** Whether the location holds files to read (a new table's does not exist or is empty). */
  private def hasData: Boolean = options.path.exists { p =>
    val path = new Path(p)
    val fs = path.getFileSystem(SparkInternals.hadoopConf(SparkSession.active, options.read))
    fs.exists(path) && fs.listStatus(path).exists(s => !DatasetFiles.isHidden(s.getPath.getName))
  }

  override def metadataColumns(): Array[MetadataColumn] =
    if (hasData && kvDataset.isEmpty) super.metadataColumns() else Array.empty

  override def newScanBuilder(options: CaseInsensitiveStringMap): ScanBuilder =
    if (!hasData) new EmptyScan(tableSchema)
    else kvDataset match {
      // a KV table reads back as the rows written, not in the per-tensor layout (KvRows.scala)
      case Some(kv) =>
        val key = this.options.write.collectFirst { case (k, v) if k.equalsIgnoreCase("name_col") => v }
          .getOrElse(KvRows.keyColumn(tableSchema, kv, partitionColumns, this.options.path.get))
        new KvRowsScan(tableSchema, key, kv.separator, partitionColumns, this.options.path.get, this.options.read)
      case None => super.newScanBuilder(options)
    }

  /** The location's dataset when it is a KV dataset (its manifest says so). */
  private lazy val kvDataset: Option[KvRows.KvDataset] =
    this.options.path.flatMap(p => KvRows.kvDataset(SparkSession.active, p, this.options.read))

  override def newWriteBuilder(info: LogicalWriteInfo): WriteBuilder =
    new WriteBuilder with SupportsTruncate {
      private var overwrite = false
      override def truncate(): WriteBuilder = { overwrite = true; this }
      override def build(): V1Write = new SparkLine.MeteredV1Write {
        // what the INSERT wrote: Spark (4.0+) shows it as the write node's SQL metrics
        private var stats = WriteStats.Empty
        override def supportedCustomMetrics(): Array[CustomMetric] = WriteStats.metrics
        override def driverMetrics(): Array[CustomTaskMetric] = stats.taskMetrics
        override def toInsertableRelation: InsertableRelation = new InsertableRelation {
          override def insert(data: DataFrame, overwriteData: Boolean): Unit =
            stats += WriteStats.collect {
              write(data, info.options().asCaseSensitiveMap().asScala.toMap, overwrite || overwriteData)
            }
        }
      }
    }

  private def write(data: DataFrame, insertOptions: Map[String, String], overwrite: Boolean): Unit = {
    val path = options.path.getOrElse(throw new IllegalArgumentException(
      "safetensors: the table has no location to write to"))
    // the INSERT's options (INSERT ... WITH (...), writeTo(...).option(...)) over the table's
    val merged = options.write.filterNot { case (k, _) => insertOptions.keys.exists(_.equalsIgnoreCase(k)) } ++
      ConnectorOptions.without(insertOptions, ConnectorOptions.Path)
    val partitioned =
      if (partitionColumns.isEmpty) Map.empty[String, String]
      else Map(PartitionedWriter.ColumnsKey -> Json.mapper.writeValueAsString(partitionColumns.asJava))
    val mode = if (overwrite) SaveMode.Overwrite else SaveMode.Append
    new SafetensorsDataSource().createRelation(data.sparkSession.sqlContext, mode,
      merged ++ partitioned + ("path" -> path), data)
  }
}

/** The scan of a catalog table whose location holds no data yet: no rows. */
private[spark] final class EmptyScan(schema: StructType) extends ScanBuilder with Scan with Batch {
  override def build(): Scan = this
  override def readSchema(): StructType = schema
  override def description(): String = "safetensors (no data yet)"
  override def toBatch: Batch = this
  override def planInputPartitions(): Array[InputPartition] = Array.empty
  override def createReaderFactory(): PartitionReaderFactory = new PartitionReaderFactory {
    override def createReader(partition: InputPartition): PartitionReader[InternalRow] =
      throw new IllegalStateException("safetensors: an empty scan has no partitions to read")
  }
}
