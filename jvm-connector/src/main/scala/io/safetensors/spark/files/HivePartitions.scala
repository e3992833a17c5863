package io.safetensors.spark.files

import java.nio.charset.StandardCharsets

import scala.collection.mutable

import org.apache.hadoop.fs.{FileSystem, Path}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.catalog.ExternalCatalogUtils
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow
import org.apache.spark.sql.sources._
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String

/**
 * Hive-style partition directories `col=value/…` (spec/dataset.md §9): the directory names a
 * `partitionBy` write makes, how a read finds them under a root, the column types it gives them
 * and which directories a filter keeps. Names are escaped and unescaped by Spark's own rule
 * (`ExternalCatalogUtils`), so Spark's file sources and ours name the same value the same way.
 */
private[spark] object HivePartitions {
  /** The directory value of a null or empty partition value (Spark's and Hive's). */
  val NullValue: String = ExternalCatalogUtils.DEFAULT_PARTITION_NAME

  /** The longest directory name most file systems and object stores accept, in UTF-8 bytes. */
  val MaxNameBytes = 255

  /** A partition column's name and its value in one directory (None: null). */
  final case class Dir(path: Path, values: Seq[(String, Option[String])])

  /** The directory name of `column` = `value`, or why there can be none. */
  def dirName(column: String, value: Option[String]): Either[String, String] = {
    val v = value.filter(_.nonEmpty).map(ExternalCatalogUtils.escapePathName).getOrElse(NullValue)
    val name = ExternalCatalogUtils.escapePathName(column) + "=" + v
    val bytes = name.getBytes(StandardCharsets.UTF_8).length
    if (bytes > MaxNameBytes) {
      Left(s"the directory name for column '$column' and value '${value.getOrElse("")}' is " +
        s"$bytes bytes long once escaped; at most $MaxNameBytes are allowed")
    } else Right(name)
  }

  /** `col=value` → (column, value); None when the name is not a partition directory. */
  def parse(name: String): Option[(String, Option[String])] = {
    val eq = name.indexOf('=')
    if (eq <= 0 || DatasetFiles.isHidden(name)) None
    else {
      val column = ExternalCatalogUtils.unescapePathName(name.substring(0, eq))
      val raw = name.substring(eq + 1)
      Some(column -> (if (raw == NullValue) None else Some(ExternalCatalogUtils.unescapePathName(raw))))
    }
  }

  /**
   * The partition directories under `root`, leaves first-level-sorted, or None when `root` is not
   * a partitioned dataset root (it is a dataset itself, or none of its directories is named
   * `col=value`). Every leaf must sit at the same depth under the same column names; a directory
   * beside partition directories that is not one, or files beside them, are errors naming it.
   */
  def discover(fs: FileSystem, root: Path): Option[Seq[Dir]] = {
    // a symbolic link is never a partition: it is not followed into another dataset (§5.9)
    def visible(dir: Path): Seq[DatasetFiles.Child] =
      DatasetFiles.listChildren(fs, dir).filterNot(c => DatasetFiles.isHidden(c.name))
        .filter(c => !c.isDirectory || DatasetFiles.isOwnSubdir(fs, c.path))
    // a dataset is not a partitioned root: known before its (maybe 100,000) shards are listed
    if (fs.exists(new Path(root, DatasetFiles.ManifestName))) return None
    val top = visible(root)
    if (!top.exists(c => c.isDirectory && parse(c.name).isDefined)) return None
    val leaves = mutable.ArrayBuffer[Dir]()
    def walk(dir: Path, children: Seq[DatasetFiles.Child],
        values: Seq[(String, Option[String])]): Unit = {
      val parts = children.filter(c => c.isDirectory && parse(c.name).isDefined)
      if (parts.isEmpty) { leaves += Dir(dir, values); return }
      children.filterNot(parts.contains).headOption.foreach { odd =>
        throw new IllegalArgumentException(
          s"safetensors: ${odd.path} is beside the partition directories of $dir but is not " +
            "one (partition directories are named column=value; hidden names start with _ or .)")
      }
      parts.sortBy(_.name).foreach { p =>
        val (column, value) = parse(p.name).get
        walk(p.path, visible(p.path), values :+ (column -> value))
      }
    }
    walk(root, top, Seq.empty)
    val columns = leaves.head.values.map(_._1)
    leaves.find(_.values.map(_._1) != columns).foreach { odd =>
      throw new IllegalArgumentException(
        s"safetensors: conflicting partition directories under $root: ${leaves.head.path} has " +
          s"columns ${columns.mkString("/")} but ${odd.path} has ${odd.values.map(_._1).mkString("/")}")
    }
    if (columns.distinct.size != columns.size) {
      throw new IllegalArgumentException(
        s"safetensors: partition column repeated in the directories under $root: ${columns.mkString("/")}")
    }
    Some(leaves.toSeq)
  }

  /**
   * The partition columns' types: integer when every value is one, else long when every value is
   * one, else string (all strings when `inferTypes` is off,
   * `spark.sql.sources.partitionColumnTypeInference.enabled`).
   */
  def schema(dirs: Seq[Dir], inferTypes: Boolean): StructType = {
    val columns = dirs.head.values.map(_._1)
    StructType(columns.indices.map { i =>
      val values = dirs.flatMap(_.values(i)._2)
      val t: DataType =
        if (!inferTypes) StringType
        else if (values.forall(v => scala.util.Try(v.toInt).isSuccess)) IntegerType
        else if (values.forall(v => scala.util.Try(v.toLong).isSuccess)) LongType
        else StringType
      StructField(columns(i), t, nullable = true)
    })
  }

  /** A directory's values as a row of `schema`'s types. */
  def row(dir: Dir, schema: StructType): InternalRow =
    new GenericInternalRow(schema.fields.zip(dir.values).map { case (f, (_, v)) =>
      v.map(typed(_, f.dataType)).map {
        case s: String => UTF8String.fromString(s)
        case other => other
      }.orNull: Any
    })

  /** A directory value as the partition column's type gives it: Int, Long or String. */
  private def typed(value: String, dataType: DataType): Any = dataType match {
    case IntegerType => value.toInt
    case LongType => value.toLong
    case _ => value
  }

  /**
   * Whether `filter` can hold for a row of `dir` (`schema` its partition columns): false only
   * when the filter names partition columns alone and is false for the directory's values.
   */
  def mayMatch(filter: Filter, dir: Dir, schema: StructType): Boolean =
    eval(filter, dir, schema).getOrElse(true)

  /** Whether `filter` holds for the rows of `dir`, when its partition values decide it. */
  def decide(filter: Filter, dir: Dir, schema: StructType): Option[Boolean] = eval(filter, dir, schema)

  /** Three-valued: Some(result) when decidable from partition values, None otherwise. */
  private def eval(f: Filter, dir: Dir, schema: StructType): Option[Boolean] = {
    def value(c: String): Option[Option[Any]] = schema.fieldNames.indexOf(c) match {
      case -1 => None
      case i => Some(dir.values(i)._2.map(typed(_, schema.fields(i).dataType)))
    }
    def cmp(c: String, v: Any)(ok: Int => Boolean): Option[Boolean] = value(c).map {
      case None => false
      case Some(x) => compare(x, v).exists(ok)
    }
    f match {
      case EqualTo(c, v) => cmp(c, v)(_ == 0)
      case EqualNullSafe(c, v) => value(c).map {
        case None => v == null
        case Some(x) => compare(x, v).contains(0)
      }
      case GreaterThan(c, v) => cmp(c, v)(_ > 0)
      case GreaterThanOrEqual(c, v) => cmp(c, v)(_ >= 0)
      case LessThan(c, v) => cmp(c, v)(_ < 0)
      case LessThanOrEqual(c, v) => cmp(c, v)(_ <= 0)
      case In(c, vs) => value(c).map {
        case None => false
        case Some(x) => vs.exists(v => compare(x, v).contains(0))
      }
      case IsNull(c) => value(c).map(_.isEmpty)
      case IsNotNull(c) => value(c).map(_.isDefined)
      case StringStartsWith(c, p) => value(c).map(_.exists(_.toString.startsWith(p)))
      case StringEndsWith(c, p) => value(c).map(_.exists(_.toString.endsWith(p)))
      case StringContains(c, p) => value(c).map(_.exists(_.toString.contains(p)))
      case And(a, b) => (eval(a, dir, schema), eval(b, dir, schema)) match {
        case (Some(false), _) | (_, Some(false)) => Some(false)
        case (Some(true), Some(true)) => Some(true)
        case _ => None
      }
      case Or(a, b) => (eval(a, dir, schema), eval(b, dir, schema)) match {
        case (Some(true), _) | (_, Some(true)) => Some(true)
        case (Some(false), Some(false)) => Some(false)
        case _ => None
      }
      case Not(a) => eval(a, dir, schema).map(!_)
      case _ => None
    }
  }

  /** Compares a partition value with a filter literal of a comparable type. */
  private def compare(x: Any, v: Any): Option[Int] = {
    val integral = x match {
      case a: Int => Some(a.toLong)
      case a: Long => Some(a)
      case _ => None
    }
    (integral, x, v) match {
      case (Some(a), _, b @ (_: java.lang.Byte | _: java.lang.Short | _: java.lang.Integer | _: java.lang.Long)) =>
        Some(java.lang.Long.compare(a, b.asInstanceOf[Number].longValue()))
      case (Some(a), _, b @ (_: java.lang.Float | _: java.lang.Double)) =>
        Some(java.lang.Double.compare(a.toDouble, b.asInstanceOf[Number].doubleValue()))
      case (Some(a), _, b: java.math.BigDecimal) => Some(java.math.BigDecimal.valueOf(a).compareTo(b))
      // Spark orders strings by their UTF-8 bytes
      case (None, a: String, b: String) => Some(UTF8String.fromString(a).compareTo(UTF8String.fromString(b)))
      case _ => None
    }
  }
}
