package io.safetensors.spark

import java.util

import org.apache.spark.sql.{DataFrame, SQLContext, SaveMode}
import org.apache.spark.sql.connector.catalog.{Table, TableCapability, TableProvider}
import org.apache.spark.sql.connector.expressions.Transform
import org.apache.spark.sql.sources.{BaseRelation, CreatableRelationProvider, DataSourceRegister}
import org.apache.spark.sql.types.StructType
import org.apache.spark.sql.util.CaseInsensitiveStringMap

/**
 * `format("safetensors")`. Writes: the table declares no BATCH_WRITE, so Spark 4.0's
 * `DataFrameWriter.save(path)` sends every SaveMode (errorifexists, ignore, overwrite, append) to
 * the V1 route, [[createRelation]], which runs the whole write ([[SafetensorsWriter]]).
 * Reads are not implemented yet.
 */
class SafetensorsDataSource extends TableProvider with DataSourceRegister
    with CreatableRelationProvider {

  override def shortName(): String = "safetensors"

  override def supportsExternalMetadata(): Boolean = true

  override def inferSchema(options: CaseInsensitiveStringMap): StructType =
    throw new UnsupportedOperationException(SafetensorsDataSource.ReadNotImplemented)

  override def getTable(schema: StructType, partitioning: Array[Transform],
      properties: util.Map[String, String]): Table = {
    if (partitioning.nonEmpty) {
      throw new IllegalArgumentException(
        "safetensors: partitionBy/bucketBy is not supported (got " +
          partitioning.map(_.describe()).mkString(", ") + ")")
    }
    new SafetensorsTable(schema)
  }

  override def createRelation(sqlContext: SQLContext, mode: SaveMode,
      parameters: Map[String, String], data: DataFrame): BaseRelation =
    SafetensorsWriter.write(sqlContext, mode, parameters, data)
}

object SafetensorsDataSource {
  val ReadNotImplemented: String =
    "safetensors: reading is not implemented yet (only df.write.format(\"safetensors\") works)"
}

/** Placeholder table: no BATCH_WRITE (V1 write fallback), no BATCH_READ yet. */
private[spark] final class SafetensorsTable(tableSchema: StructType) extends Table {
  override def name(): String = "safetensors"
  override def schema(): StructType = tableSchema
  override def capabilities(): util.Set[TableCapability] =
    util.EnumSet.noneOf(classOf[TableCapability])
}
