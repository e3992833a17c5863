package io.safetensors.spark.write

import io.safetensors.spark.internal.Json
import scala.jdk.CollectionConverters._

import io.safetensors.spark.jni.{NativeLib, NativeWriter}
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.{Column, DataFrame, Row, SQLContext, SaveMode}
import org.apache.spark.sql.safetensors.SparkInternals
import org.apache.spark.sql.sources.BaseRelation
import org.apache.spark.sql.types._
import org.apache.spark.storage.StorageLevel
import io.safetensors.spark.files.{DatasetFiles, HivePartitions}
import io.safetensors.spark.internal.ConnectorOptions

/**
 * `df.write.partitionBy(c, …)` (spec/dataset.md §9): one complete dataset (shards, manifest,
 * optional index, its own commit) per Hive-style directory `c=value/…`, written by
 * [[SafetensorsWriter]] from the rows of that value without the partition columns. The input is
 * cached for the duration, so each directory's job reads the cache, not the source.
 */
private[spark] object PartitionedWriter {
  /** Where the V1 route passes partitionBy's columns (Spark's `DataSourceUtils`), a JSON array. */
  val ColumnsKey = "__partition_columns"

  /** `static` (default) or `dynamic`, as Spark's `spark.sql.sources.partitionOverwriteMode`. */
  val OverwriteModeKey = "partitionOverwriteMode"

  private val mapper = Json.mapper

  /** The partition types a directory name can carry and a read gives back (integers as such). */
  private val Allowed: Set[DataType] =
    Set(StringType, ByteType, ShortType, IntegerType, LongType, BooleanType, DateType)

  /** partitionBy's columns, when the write has any. */
  def columns(parameters: Map[String, String]): Option[Seq[String]] =
    parameters.get(ColumnsKey).map(j => mapper.readTree(j).elements().asScala.map(_.asText()).toSeq)
      .filter(_.nonEmpty)

  def write(sqlContext: SQLContext, mode: SaveMode, parameters: Map[String, String],
      data: DataFrame, requested: Seq[String]): BaseRelation = {
    val spark = sqlContext.sparkSession
    val caseSensitive = SparkInternals.caseSensitive(sqlContext)
    val overwriteMode = ConnectorOptions.get(parameters, OverwriteModeKey)
      .getOrElse(spark.conf.get("spark.sql.sources.partitionOverwriteMode", "static")).trim.toLowerCase
    if (overwriteMode != "static" && overwriteMode != "dynamic") {
      throw new IllegalArgumentException(
        s"safetensors: option '$OverwriteModeKey' must be static or dynamic, got '$overwriteMode'")
    }
    val params = ConnectorOptions.without(parameters, OverwriteModeKey) - ColumnsKey
    val fields = partitionFields(data.schema, requested, caseSensitive)
    val names = fields.map(_.name)
    val dataSchema = StructType(data.schema.fields.filterNot(f => names.contains(f.name)))
    if (dataSchema.isEmpty) {
      throw new IllegalArgumentException(
        s"safetensors: partitionBy(${names.mkString(", ")}) leaves no column to write as tensors")
    }
    ConnectorOptions.get(params, "name_col")
      .filter(n => names.exists(_.equalsIgnoreCase(n))).foreach { n =>
        throw new IllegalArgumentException(
          s"safetensors: the KV name column '$n' cannot also be a partitionBy column " +
            "(its values name the tensors in every directory)")
      }
    // every option and the data columns' plan are checked before anything on disk changes (an
    // append's, which takes each directory's settings, once the directories are known)
    NativeLib.ensureLoaded()
    def checkOptions(): Unit =
      NativeWriter.planWrite(dataSchema.json, mapper.writeValueAsString(params.asJava), caseSensitive, null, null)
    if (mode != SaveMode.Append) checkOptions()
    val path = ConnectorOptions.path(params).getOrElse(
      throw new IllegalArgumentException("safetensors: exactly one output path is required (.save(path))"))
    val root = new Path(path)
    val conf = SparkInternals.hadoopConf(sqlContext, params)
    val fs = root.getFileSystem(conf)
    val dest = fs.makeQualified(root)
    val exists = fs.exists(dest)
    val relation = new SafetensorsWriter.WrittenRelation(sqlContext, data.schema)
    mode match {
      case SaveMode.ErrorIfExists if exists => throw SafetensorsWriter.pathExists(dest)
      case SaveMode.Ignore if exists => return relation
      case _ =>
    }
    val withPath = ConnectorOptions.without(params, ConnectorOptions.Path)
    val subMode = mode match {
      case SaveMode.Overwrite | SaveMode.Append => mode
      case _ => SaveMode.ErrorIfExists
    }
    val cached = if (data.storageLevel == StorageLevel.NONE) data.persist(StorageLevel.MEMORY_AND_DISK) else data
    try {
      // each directory and the rows that go there (null and "" share Spark's null directory);
      // every name is checked before the first directory is written
      val targets: Seq[(Path, Seq[Row])] = cached.select(names.map(n => org.apache.spark.sql.functions.col(quoted(n))): _*).distinct().collect()
        .toSeq.groupBy(r => dirOf(dest, fields, r)).toSeq.sortBy(_._1.toString)
      if (mode == SaveMode.Append) {
        if (targets.isEmpty) checkOptions()
        targets.foreach { case (dir, _) =>
          SafetensorsWriter.checkPlan(sqlContext, subMode, withPath + ("path" -> dir.toString), dataSchema)
        }
      }
      targets.foreach { case (dir, rows) =>
        val subset = cached.filter(rows.map(r => matches(fields, r)).reduce(_ || _)).drop(names: _*)
        SafetensorsWriter.write(sqlContext, subMode, withPath + ("path" -> dir.toString), subset)
      }
      if (mode == SaveMode.Overwrite && overwriteMode == "static" && exists) {
        // static overwrite replaces the whole root: the partition datasets this write did not
        // write become empty (their shards go through their own commit; foreign files stay)
        val written = targets.map(_._1.toString).toSet
        HivePartitions.discover(fs, dest).getOrElse(Seq.empty)
          .filter(d => !written(fs.makeQualified(d.path).toString))
          .filter(d => fs.exists(new Path(d.path, DatasetFiles.ManifestName)))
          .foreach { d =>
            val empty = spark.createDataFrame(spark.sparkContext.emptyRDD[Row], dataSchema)
            SafetensorsWriter.write(sqlContext, SaveMode.Overwrite,
              withPath + ("path" -> d.path.toString), empty)
          }
      }
      relation
    } finally {
      if (cached ne data) cached.unpersist(blocking = false)
    }
  }

  /** The partition columns, resolved against the schema and checked. */
  private def partitionFields(schema: StructType, requested: Seq[String],
      caseSensitive: Boolean): Seq[StructField] = {
    val fields = requested.map { c =>
      schema.fields.find(f => if (caseSensitive) f.name == c else f.name.equalsIgnoreCase(c))
        .getOrElse(throw new IllegalArgumentException(
          s"safetensors: partitionBy column '$c' is not a column of the DataFrame (columns: " +
            schema.fieldNames.mkString(", ") + ")"))
    }
    if (fields.map(_.name).distinct.size != fields.size) {
      throw new IllegalArgumentException(
        s"safetensors: partitionBy names a column twice: ${requested.mkString(", ")}")
    }
    fields.foreach { f =>
      if (!Allowed(f.dataType)) {
        throw new IllegalArgumentException(
          s"safetensors: partitionBy column '${f.name}' is ${f.dataType.simpleString}; partition " +
            "columns must be string, integer (tinyint, smallint, int, bigint), boolean or date")
      }
      if (DatasetFiles.isHidden(f.name)) {
        throw new IllegalArgumentException(
          s"safetensors: partitionBy column '${f.name}' starts with '${f.name.head}': its " +
            "directories would be hidden from readers; rename the column")
      }
    }
    fields
  }

  /** The directory of a row's partition values, or an error naming the column and value. */
  private def dirOf(root: Path, fields: Seq[StructField], row: Row): Path =
    fields.indices.foldLeft(root) { (dir, i) =>
      val value = Option(row.get(i)).map(_.toString)
      HivePartitions.dirName(fields(i).name, value) match {
        case Right(name) => new Path(dir, name)
        case Left(why) => throw new IllegalArgumentException(
          s"safetensors: cannot write partition directory: $why")
      }
    }

  /** Rows whose partition values are `row`'s (null-safe; "" goes with null, as its directory). */
  private def matches(fields: Seq[StructField], row: Row): Column =
    fields.indices.map { i =>
      val c = org.apache.spark.sql.functions.col(quoted(fields(i).name))
      Option(row.get(i)) match {
        case None => c.isNull
        case Some(v) => c === org.apache.spark.sql.functions.lit(v)
      }
    }.reduce(_ && _)

  private def quoted(name: String): String = "`" + name.replace("`", "``") + "`"
}
