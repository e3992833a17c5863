package io.safetensors.spark

import java.util

import scala.jdk.CollectionConverters._

import org.apache.spark.sql.{DataFrame, SQLContext, SaveMode, SparkSession}
import org.apache.spark.sql.connector.catalog.{Table, TableProvider}
import org.apache.spark.sql.safetensors.SparkInternals
import org.apache.spark.sql.connector.expressions.Transform
import org.apache.spark.sql.sources.{BaseRelation, CreatableRelationProvider, DataSourceRegister}
import org.apache.spark.sql.types.StructType
import org.apache.spark.sql.util.CaseInsensitiveStringMap

/**
 * `format("safetensors")`.
 *
 * Reads: [[inferSchema]] lists the paths and asks the Rust planner for the layout and schema
 * ([[ReadSource]]); the table scans through [[SafetensorsScanBuilder]]. Writes: the table declares
 * no BATCH_WRITE, so Spark 4.0's `DataFrameWriter.save(path)` sends every SaveMode
 * (errorifexists, ignore, overwrite, append) to the V1 route, [[createRelation]], which runs the
 * whole write ([[SafetensorsWriter]]).
 */
class SafetensorsDataSource extends TableProvider with DataSourceRegister
    with CreatableRelationProvider {

  /** The source [[inferSchema]] listed, reused by [[getTable]] for the same options. */
  private var inferred: Option[(Map[String, String], ReadSource)] = None

  override def shortName(): String = "safetensors"

  override def supportsExternalMetadata(): Boolean = true

  private def readSource(options: Map[String, String]): ReadSource = {
    val spark = SparkSession.active
    val (_, _, ignoreCorrupt) = SparkInternals.filesConf(spark)
    val read = ReadOptions.parse(options, ignoreCorrupt, SparkInternals.ignoreMissingFiles(spark))
    new ReadSource(read, SparkInternals.hadoopConf(spark, options))
  }

  override def inferSchema(options: CaseInsensitiveStringMap): StructType = synchronized {
    val opts = options.asCaseSensitiveMap().asScala.toMap
    val src = readSource(opts)
    inferred = Some(opts -> src)
    src.description.schema
  }

  override def getTable(schema: StructType, partitioning: Array[Transform],
      properties: util.Map[String, String]): Table = synchronized {
    if (partitioning.nonEmpty) {
      throw new IllegalArgumentException(
        "safetensors: partitionBy/bucketBy is not supported (got " +
          partitioning.map(_.describe()).mkString(", ") + ")")
    }
    val opts = properties.asScala.toMap
    inferred.filter(_._1 == opts) match {
      case Some((_, src)) => new SafetensorsTable(schema, userSchema = false, src)
      // A user-given schema (checked against the files when scanned), or a write.
      case None => new SafetensorsTable(schema, userSchema = true, readSource(opts))
    }
  }

  override def createRelation(sqlContext: SQLContext, mode: SaveMode,
      parameters: Map[String, String], data: DataFrame): BaseRelation =
    SafetensorsWriter.write(sqlContext, mode, parameters, data)
}
