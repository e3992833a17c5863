package io.safetensors.spark

import java.util

import scala.jdk.CollectionConverters._

import org.apache.spark.sql.{DataFrame, SQLContext, SaveMode, SparkSession}
import org.apache.spark.sql.connector.catalog.{Table, TableProvider}
import org.apache.spark.sql.safetensors.SparkInternals
import org.apache.spark.sql.connector.expressions.{Expressions, Transform}
import org.apache.spark.sql.execution.streaming.Sink
import org.apache.spark.sql.sources.{BaseRelation, CreatableRelationProvider, DataSourceRegister,
  StreamSinkProvider}
import org.apache.spark.sql.streaming.OutputMode
import org.apache.spark.sql.types.StructType
import org.apache.spark.sql.util.CaseInsensitiveStringMap
import io.safetensors.spark.catalog.{SafetensorsCatalogTable, TableOptions}
import io.safetensors.spark.read.{PartitionedSource, ReadOptions, ReadSource, SafetensorsTable, TableSource}
import io.safetensors.spark.jni.SafetensorsException
import io.safetensors.spark.streaming.{DatasetStream, SafetensorsStreamSink, StreamOptions}
import io.safetensors.spark.write.{PartitionedWriter, SafetensorsWriter}

/**
 * `format("safetensors")`.
 *
 * Reads: [[inferSchema]] lists the paths and asks the Rust planner for the layout and schema
 * ([[ReadSource]]); the table scans through [[SafetensorsScanBuilder]]. Writes: the table declares
 * no BATCH_WRITE, so Spark 4.0's `DataFrameWriter.save(path)` sends every SaveMode
 * (errorifexists, ignore, overwrite, append) to the V1 route, [[createRelation]], which runs the
 * whole write ([[SafetensorsWriter]]). A table from a catalog (CREATE TABLE, saveAsTable,
 * writeTo) is a [[SafetensorsCatalogTable]], which takes INSERTs (spec/sql.md). Streaming writes:
 * the table declares no STREAMING_WRITE either, so `writeStream` takes the V1 sink route,
 * [[createSink]] ([[SafetensorsStreamSink]]).
 */
class SafetensorsDataSource extends TableProvider with DataSourceRegister
    with CreatableRelationProvider with StreamSinkProvider {

  /** The source [[inferSchema]] listed, reused by [[getTable]] for the same options. */
  private var inferred: Option[(Map[String, String], TableSource)] = None

  override def shortName(): String = "safetensors"

  override def supportsExternalMetadata(): Boolean = true

  /** The partition directories under the path when it has them (reading.md §6), else the tree. */
  private def readSource(options: Map[String, String]): TableSource = {
    val spark = SparkSession.active
    val (_, _, ignoreCorrupt) = SparkInternals.filesConf(spark)
    val given = ReadOptions.parse(options, ignoreCorrupt, SparkInternals.ignoreMissingFiles(spark))
    val conf = SparkInternals.hadoopConf(spark, options)
    val inferTypes =
      spark.conf.get("spark.sql.sources.partitionColumnTypeInference.enabled", "true").toBoolean
    // a readStream with a start option has the columns of the version it starts at (reading.md §8)
    val read = try DatasetStream.schemaOptions(given, conf) catch {
      case e: SafetensorsException => throw startError(given, e)
    }
    PartitionedSource.discover(read, conf, inferTypes).getOrElse {
      try new ReadSource(read, conf)
      catch { case e: SafetensorsException if given.stream.startGiven => throw startError(given, e) }
    }
  }

  /** An error finding the version a readStream starts at, naming the option that chose it. */
  private def startError(read: ReadOptions, e: SafetensorsException): Throwable = {
    val s = read.stream
    val what = s.startingVersion.flatten.map(v => s"option '${StreamOptions.StartingVersion}' = $v")
      .orElse(s.startingTimestamp.map(t => s"option '${StreamOptions.StartingTimestamp}' = '$t'"))
      .getOrElse("readStream")
    new IllegalArgumentException(s"safetensors: $what: ${e.getMessage}", e)
  }

  override def inferSchema(options: CaseInsensitiveStringMap): StructType = synchronized {
    val table = TableOptions(options.asCaseSensitiveMap().asScala.toMap)
    if (table.catalog && table.path.isEmpty) {
      throw new IllegalArgumentException(
        "safetensors: CREATE TABLE ... USING safetensors needs a schema, or a LOCATION holding a " +
          "dataset to take the schema from")
    }
    val opts = table.read
    val src = readSource(opts)
    inferred = Some(opts -> src)
    // a catalog table's columns take writes too: nullable, as Spark's file tables (a null value
    // fails the write, spec/sql.md §2)
    if (table.catalog) SparkInternals.asNullable(src.description.schema) else src.description.schema
  }

  /** A partitioned root's partition columns (identity transforms), so a catalog table has them. */
  override def inferPartitioning(options: CaseInsensitiveStringMap): Array[Transform] = synchronized {
    val opts = TableOptions(options.asCaseSensitiveMap().asScala.toMap).read
    inferred.filter(_._1 == opts).map(_._2.partitionSchema.fieldNames.map { n =>
      Expressions.identity(n): Transform
    }).getOrElse(Array.empty)
  }

  override def getTable(schema: StructType, partitioning: Array[Transform],
      properties: util.Map[String, String]): Table = synchronized {
    // partitionBy(...) arrives as identity transforms (the write itself gets the columns through
    // the V1 route's options, SafetensorsWriter); bucketing and other transforms are not supported
    partitioning.find(_.name() != "identity").foreach { t =>
      throw new IllegalArgumentException(
        "safetensors: bucketBy and partition transforms are not supported (got " + t.describe() +
          "); partitionBy(column, ...) is")
    }
    val table = TableOptions(properties.asScala.toMap)
    val opts = table.read
    if (table.catalog) {
      // CREATE TABLE / saveAsTable / writeTo, and every later use of the table (spec/sql.md)
      val columns = partitioning.map(_.references().head.fieldNames().mkString("."))
      if (!schema.fieldNames.takeRight(columns.length).sameElements(columns)) {
        throw new IllegalArgumentException(
          s"safetensors: a partitioned table's partition columns (${columns.mkString(", ")}) must " +
            s"be its last columns, in that order (its columns: ${schema.fieldNames.mkString(", ")})")
      }
      val src = inferred.filter(_._1 == opts).map(_._2)
      return new SafetensorsCatalogTable(schema, columns.toSeq, table, properties.asScala.toMap,
        src.getOrElse(readSource(opts)))
    }
    inferred.filter(_._1 == opts) match {
      case Some((_, src)) => new SafetensorsTable(schema, userSchema = false, src)
      // A user-given schema (checked against the files when scanned), or a write.
      case None => new SafetensorsTable(schema, userSchema = true, readSource(opts))
    }
  }

  override def createRelation(sqlContext: SQLContext, mode: SaveMode,
      parameters: Map[String, String], data: DataFrame): BaseRelation =
    PartitionedWriter.columns(parameters) match {
      case Some(columns) => PartitionedWriter.write(sqlContext, mode, parameters, data, columns)
      case None => SafetensorsWriter.write(sqlContext, mode, parameters, data)
    }

  override def createSink(sqlContext: SQLContext, parameters: Map[String, String],
      partitionColumns: Seq[String], outputMode: OutputMode): Sink =
    SafetensorsStreamSink.create(sqlContext, parameters, partitionColumns, outputMode)
}
