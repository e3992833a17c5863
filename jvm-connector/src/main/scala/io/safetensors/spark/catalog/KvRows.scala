package io.safetensors.spark.catalog

import io.safetensors.spark.internal.Json
import scala.jdk.CollectionConverters._

import io.safetensors.spark.expressions.StToArray
import io.safetensors.spark.files.DatasetFiles
import io.safetensors.spark.jni.{NativeLib, NativeWriter, SafetensorsOptionsException}
import org.apache.hadoop.fs.Path
import org.apache.spark.rdd.RDD
import org.apache.spark.sql.{Row, SQLContext, SparkSession}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{BoundReference, Cast, Literal}
import org.apache.spark.sql.catalyst.util.{ArrayData, GenericArrayData}
import org.apache.spark.sql.connector.read.{Scan, ScanBuilder, V1Scan}
import org.apache.spark.sql.safetensors.SparkInternals
import org.apache.spark.sql.sources.{BaseRelation, TableScan}
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String

/**
 * Reading a KV catalog table (`saveAsTable` / `CREATE TABLE ... OPTIONS (name_col ...)`) as the
 * rows that were written: one row per key, the key in the `name_col` column (the table's option,
 * else found as an append finds it) and each other column from the tensor
 * `<key><kv_separator><column>` (spec/sql.md, "KV tables").
 *
 * A KV dataset read by path has the per-tensor layout (one row per tensor); the catalog keeps the
 * written DataFrame's schema, so its reads regroup that layout: the tensors of the table's
 * columns are read (key, dtype, shape and bytes; nothing else), each decoded by the connector's
 * `st_to_array` (the Rust decoder) and cast to the column's type as the writer converted it
 * (exactly, for the types the writer takes), and grouped by key (and partition values). A key's
 * tensors all sit in one shard, but the grouping is a shuffle: this is a convenience for SQL,
 * not the fast path (the per-tensor layout and the Python package read KV data without one).
 */
private[spark] final class KvRowsScan(schema: StructType, nameCol: String, separator: String,
    partitionColumns: Seq[String], path: String, readOptions: Map[String, String])
    extends ScanBuilder with Scan with V1Scan {
  override def build(): Scan = this
  override def readSchema(): StructType = schema
  override def description(): String = s"safetensors KV rows ($path, name_col $nameCol)"

  override def toV1TableScan[T <: BaseRelation with TableScan](context: SQLContext): T =
    new KvRowsRelation(context, schema, nameCol, separator, partitionColumns, path, readOptions).asInstanceOf[T]
}

private[spark] final class KvRowsRelation(context: SQLContext, override val schema: StructType, nameCol: String,
    separator: String, partitionColumns: Seq[String], path: String, readOptions: Map[String, String])
    extends BaseRelation with TableScan {
  override def sqlContext: SQLContext = context
  override def needConversion: Boolean = false // buildScan's rows are InternalRows

  private def sameName(a: String, b: String): Boolean =
    if (SparkInternals.caseSensitive(context)) a == b else a.equalsIgnoreCase(b)

  override def buildScan(): RDD[Row] = {
    val spark = context.sparkSession
    val fields = schema.fields.toSeq
    val keyIndex = fields.indexWhere(f => sameName(f.name, nameCol))
    if (keyIndex < 0) throw new IllegalArgumentException(
      s"safetensors: the KV table's name_col '$nameCol' is not one of its columns (${schema.fieldNames.mkString(", ")})")
    val parts = partitionColumns.map(p => fields.indexWhere(f => sameName(f.name, p)))
    val valueColumns = fields.indices.filter(i => i != keyIndex && !parts.contains(i))
    val caseSensitive = SparkInternals.caseSensitive(context)
    def folded(s: String) = if (caseSensitive) s else s.toLowerCase
    // longest column name first: with one column a suffix of another, the longer one decides
    val suffixes = valueColumns.map(i => (folded(separator + fields(i).name), i)).sortBy(-_._1.length)
    val tensors = spark.read.format("safetensors").options(readOptions.filter(_._1.toLowerCase != "path"))
      .option("layout", "tensor").load(path)
      .select(("key" +: "dtype" +: "shape" +: "data" +: partitionColumns).map(org.apache.spark.sql.functions.col): _*)
    val types = fields.map(_.dataType)
    val width = fields.length
    val rows = SparkInternals.internalRows(tensors).flatMap { r =>
      val name = r.getUTF8String(0).toString
      val matched = if (caseSensitive) name else name.toLowerCase
      suffixes.find { case (s, _) => matched.endsWith(s) }.map { case (suffix, column) =>
        val key = name.substring(0, name.length - suffix.length)
        val partValues = parts.indices.map(k => r.get(4 + k, types(parts(k))) match {
          case s: UTF8String => s.clone() // the row's buffer is reused
          case v => v
        })
        val value = KvRows.value(r.getUTF8String(1).toString, r.getArray(2), r.getBinary(3), types(column),
          name, fields(column).name)
        ((key, partValues), (column, value))
      }
    }
    rows.groupByKey().map { case ((key, partValues), values) =>
      val out = new Array[Any](width)
      out(keyIndex) = UTF8String.fromString(key)
      parts.zip(partValues).foreach { case (i, v) => out(i) = v }
      values.foreach { case (i, v) => out(i) = v }
      InternalRow.fromSeq(out.toSeq): InternalRow
    }.asInstanceOf[RDD[Row]]
  }
}

private[spark] object KvRows {
  private val mapper = Json.mapper

  /** What a KV dataset's manifest says: its separator and its tensor columns. */
  final case class KvDataset(separator: String, columns: Set[String])

  /**
   * The dataset at `path` if it is a KV dataset (manifest `layout` "kv"): its manifest, or for a
   * partitioned root the first partition dataset's, found by descending the first partition
   * directory (`c=v`) of each level. `None` for a batch dataset or where no manifest is found.
   */
  def kvDataset(spark: SparkSession, path: String, options: Map[String, String]): Option[KvDataset] = {
    val root = new Path(path)
    val fs = root.getFileSystem(SparkInternals.hadoopConf(spark, options))
    var dir = root
    for (_ <- 0 until 64) {
      val manifest = new Path(dir, DatasetFiles.ManifestName)
      if (fs.exists(manifest)) {
        val m = mapper.readTree(DatasetFiles.readText(fs, manifest))
        val layout = Option(m.get("layout")).map(_.asText).getOrElse("")
        val sep = Option(m.get("kv_separator")).filter(_.isTextual).map(_.asText).getOrElse("")
        if (layout != "kv" || sep.isEmpty) return None
        val columns = Option(m.get("schema")).map(_.fieldNames().asScala.toSet).getOrElse(Set.empty)
        return Some(KvDataset(sep, columns))
      }
      if (!fs.getFileStatus(dir).isDirectory) return None
      dir = fs.listStatus(dir).filter(st => st.isDirectory && st.getPath.getName.contains("="))
        .sortBy(_.getPath.getName).headOption.map(_.getPath).getOrElse(return None)
    }
    None
  }

  /**
   * The key column of a KV table without a `name_col` option (`saveAsTable`'s options are not
   * stored with the table): as an append finds it (spec/dataset.md §5.2), the table's one string
   * column that is neither a tensor column of the dataset nor a partition column.
   */
  def keyColumn(schema: StructType, kv: KvDataset, partitionColumns: Seq[String], location: String): String = {
    val strings = schema.fields.filter(f => f.dataType == StringType && !partitionColumns.contains(f.name))
      .map(_.name)
    NativeLib.ensureLoaded()
    try NativeWriter.kvKeyColumn(mapper.writeValueAsString(strings),
      mapper.writeValueAsString(kv.columns.toSeq.sorted.toArray))
    catch {
      case e: SafetensorsOptionsException => throw new IllegalArgumentException(
        s"safetensors: the table at $location holds a KV dataset and names no key column: ${e.getMessage}: " +
          "give the table the write option name_col " +
          "(ALTER TABLE ... SET TBLPROPERTIES ('name_col' = '...'))", e)
    }
  }

  /** The Spark element type a dtype reads back as (spec/reading.md §3; `st_to_array`'s). */
  private def elementOf(dtype: String): DataType = dtype match {
    case "BOOL" => BooleanType
    case "I8" => ByteType
    case "U8" | "I16" => ShortType
    case "U16" | "I32" => IntegerType
    case "U32" | "I64" | "U64" => LongType
    case "F16" | "BF16" | "F32" => FloatType
    case "F64" => DoubleType
    case other => throw new IllegalArgumentException(s"dtype $other has no Spark type")
  }

  private val tensorStruct = StructType(Seq(StructField("data", BinaryType, nullable = false),
    StructField("shape", ArrayType(LongType, containsNull = false), nullable = false),
    StructField("dtype", StringType, nullable = false)))

  /** Array nesting of a column type and its element type. */
  private def rankOf(t: DataType): (Int, DataType) = t match {
    case ArrayType(e, _) => val (r, el) = rankOf(e); (r + 1, el)
    case other => (0, other)
  }

  /**
   * Tensor `name` (`dtype`, `shape`, raw `data`) as a value of `target`, the table's type of
   * `column`: its bytes for `binary`, the Tensor Struct for a struct, a dense vector for an ML
   * vector, else the values decoded by `st_to_array` and cast (a scalar column: the one value).
   */
  def value(dtype: String, shape: ArrayData, data: Array[Byte], target: DataType, name: String,
      column: String): Any = {
    def fail(why: String) = throw new IllegalArgumentException(
      s"safetensors: KV table column '$column' (${target.simpleString}): tensor '$name' ($dtype, shape " +
        s"${shape.toLongArray().mkString("[", ", ", "]")}): $why")
    val dims = shape.toLongArray()
    target match {
      case BinaryType => data
      case s: StructType =>
        val shapeField = s.fields.find(_.name == "shape").map(_.dataType)
        val shapeValue = shapeField match {
          case Some(ArrayType(IntegerType, _)) => new GenericArrayData(dims.map(_.toInt.asInstanceOf[Any]))
          case _ => new GenericArrayData(dims.map(_.asInstanceOf[Any]))
        }
        InternalRow.fromSeq(s.fields.toSeq.map {
          case f if f.name == "data" => data
          case f if f.name == "shape" => shapeValue
          case f if f.name == "dtype" => UTF8String.fromString(dtype)
          case f => fail(s"a Tensor Struct has no field '${f.name}'")
        })
      case udt: UserDefinedType[_] if udt.getClass.getName.endsWith("VectorUDT") =>
        val values = decode(dtype, dims, data, DoubleType, -1).asInstanceOf[ArrayData]
        InternalRow(1.toByte, null, null, values) // a DenseVector in VectorUDT's struct form (type 1)
      case _ =>
        val (rank, element) = rankOf(target)
        val source = try elementOf(dtype) catch { case e: IllegalArgumentException => fail(e.getMessage) }
        if (rank == 0) {
          if (dims.product != 1) fail("a scalar column needs one value")
          val flat = decode(dtype, dims, data, source, -1).asInstanceOf[ArrayData]
          Cast(Literal(flat.get(0, source), source), target).eval()
        } else {
          if (dims.length != rank) fail(s"the column has rank $rank")
          val decoded = decode(dtype, dims, data, source, rank)
          val sourceType = (1 until rank).foldLeft(ArrayType(source, containsNull = false): DataType)(
            (t, _) => ArrayType(t, containsNull = false))
          if (element == source) decoded else Cast(Literal(decoded, sourceType), target).eval()
        }
    }
  }

  /** `st_to_array(struct(data, shape, dtype), element, rank)` of one tensor (rank -1: flat). */
  private def decode(dtype: String, dims: Array[Long], data: Array[Byte], element: DataType, rank: Int): Any = {
    val input = InternalRow(InternalRow(data, new GenericArrayData(dims.map(_.asInstanceOf[Any])),
      UTF8String.fromString(dtype)))
    StToArray(BoundReference(0, tensorStruct, nullable = false), element, rank).eval(input)
  }
}
