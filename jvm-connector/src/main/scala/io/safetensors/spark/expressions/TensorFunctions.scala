package io.safetensors.spark.expressions

import java.nio.{ByteBuffer, ByteOrder}

import scala.collection.mutable

import io.safetensors.spark.jni.{NativeLib, NativeTensorFunctions}
import org.apache.spark.sql.SparkSessionExtensions
import org.apache.spark.sql.catalyst.{FunctionIdentifier, InternalRow}
import org.apache.spark.sql.catalyst.analysis.TypeCheckResult
import org.apache.spark.sql.catalyst.analysis.TypeCheckResult.DataTypeMismatch
import org.apache.spark.sql.catalyst.expressions.{Expression, ExpressionInfo, GenericInternalRow, UnaryExpression, UnsafeArrayData}
import org.apache.spark.sql.catalyst.expressions.codegen.CodegenFallback
import org.apache.spark.sql.catalyst.util.{ArrayData, GenericArrayData}
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String

/**
 * The SQL functions `arr_to_st` and `st_to_array` (spec/functions.md). Registered by
 * [[SafetensorsExtensions]] (`spark.sql.extensions`); Scala/Python wrappers build calls by name
 * ([[functions]], `safetensors_spark.functions`). The value rules (dtype names, conversions,
 * shape checks, decoding) are the Rust engine's, reached through [[NativeTensorFunctions]].
 */
object TensorFunctions {
  type Builder = Seq[Expression] => Expression

  /** Registers both functions; [[SafetensorsExtensions]] calls this. */
  def inject(extensions: SparkSessionExtensions): Unit =
    descriptions.foreach(f => extensions.injectFunction(f))

  /** (name, description, builder) of both functions. */
  val descriptions: Seq[(FunctionIdentifier, ExpressionInfo, Builder)] = Seq(
    (FunctionIdentifier("arr_to_st"), info(classOf[ArrToSt], "arr_to_st",
      "arr_to_st(array [, dtype] [, shape]) - the Tensor Struct (data binary, shape array<int>, " +
        "dtype string) of a numeric array (nested arrays: rank = depth), converted to dtype " +
        "(default: the element type's natural dtype) exactly as the safetensors writer converts; " +
        "dtype and shape may come in either order."),
      (args: Seq[Expression]) => ArrToSt(args)),
    (FunctionIdentifier("st_to_array"), info(classOf[StToArray], "st_to_array",
      "st_to_array(tensor [, dtype] [, rank]) - the values of a Tensor Struct as an array of the " +
        "natural Spark type of dtype (F16/BF16/F32 -> float, U8 -> short, ...), nested rank deep " +
        "(rank 1 or absent and not inferable: flat, row-major)."),
      (args: Seq[Expression]) => StToArray.build(args)))

  private def info(cls: Class[_], name: String, usage: String): ExpressionInfo =
    new ExpressionInfo(cls.getName, null, name, usage, "", "", "", "", "", "", "scala_udf")

  private[spark] def native[T](what: String)(f: => T): T = {
    NativeLib.ensureLoaded()
    try f catch {
      case e: IllegalArgumentException => throw new IllegalArgumentException(s"$what: ${e.getMessage}", e)
    }
  }

  private[spark] def failure(msg: String): TypeCheckResult =
    DataTypeMismatch("TYPE_CHECK_FAILURE_WITH_HINT", Map("msg" -> msg, "hint" -> ""))

  /** Spark element types by the names the natives use. */
  private[spark] val elementNames: Map[DataType, String] = Map(
    BooleanType -> "boolean", ByteType -> "byte", ShortType -> "short", IntegerType -> "integer",
    LongType -> "long", FloatType -> "float", DoubleType -> "double")
  private[spark] val elementByName: Map[String, DataType] = elementNames.map(_.swap)

  /** The Tensor Struct `arr_to_st` returns. */
  val TensorStructType: StructType = StructType(Seq(
    StructField("data", BinaryType, nullable = false),
    StructField("shape", ArrayType(IntegerType, containsNull = false), nullable = false),
    StructField("dtype", StringType, nullable = false)))

  /** (leaf element type, depth) of array<...array<T>...>. */
  private[spark] def nesting(t: DataType): (DataType, Int) = t match {
    case ArrayType(e, _) => val (leaf, d) = nesting(e); (leaf, d + 1)
    case other => (other, 0)
  }

  private[spark] def fmtShape(s: Array[Long]): String = s.mkString("[", ", ", "]")
}

/**
 * `arr_to_st(array [, dtype] [, shape])`; the peer connector's order `(array, shape, dtype)` too:
 * the optional arguments are told apart by type (string: dtype; array of integers: shape).
 */
case class ArrToSt(children: Seq[Expression]) extends Expression with CodegenFallback {
  import TensorFunctions._

  override def prettyName: String = "arr_to_st"

  private def optional: Seq[Expression] = children.drop(1)
  private def role(e: Expression): Option[String] = e.dataType match {
    case _: StringType => Some("dtype")
    case ArrayType(ByteType | ShortType | IntegerType | LongType, _) => Some("shape")
    case _ => None
  }
  private lazy val dtypeArg: Option[Expression] = optional.find(role(_).contains("dtype"))
  private lazy val shapeArg: Option[Expression] = optional.find(role(_).contains("shape"))
  private lazy val (leafType, depth) = nesting(children.head.dataType)

  /** The dtype fixed at analysis (a literal, or the natural one), else None (per row). */
  private[spark] lazy val staticDtype: Option[String] = dtypeArg match {
    case None => Some(native("arr_to_st")(NativeTensorFunctions.naturalDtype(elementNames(leafType))))
    case Some(e) if e.foldable => Option(e.eval()).map(v =>
      native("arr_to_st")(NativeTensorFunctions.writableDtype(v.toString)))
    case _ => None
  }

  /** The rank fixed at analysis (the nesting depth, or a literal shape's length). */
  private[spark] lazy val staticRank: Option[Int] = shapeArg match {
    case None => Some(depth)
    case Some(e) if e.foldable => Option(e.eval()).map(_.asInstanceOf[ArrayData].numElements())
    case _ => None
  }

  override def checkInputDataTypes(): TypeCheckResult = {
    val usage = "arr_to_st(array [, dtype] [, shape]) or arr_to_st(array, shape, dtype): array of " +
      "boolean, byte, short, int, long, float or double (nested arrays for rank > 1), dtype a " +
      "string, shape an array of integers"
    if (children.isEmpty || children.size > 3) {
      return failure(s"arr_to_st takes 1 to 3 arguments, got ${children.size}; $usage")
    }
    children.head.dataType match {
      case ArrayType(_, _) if elementNames.contains(leafType) =>
      case other => return failure(s"arr_to_st: the first argument has type ${other.sql}; $usage")
    }
    val roles = optional.map(e => role(e).getOrElse(
      return failure(s"arr_to_st: an argument has type ${e.dataType.sql}; $usage")))
    if (roles.distinct.size != roles.size) {
      return failure(s"arr_to_st: ${roles.diff(roles.distinct).head} given twice; $usage")
    }
    try staticDtype catch {
      case e: IllegalArgumentException => return failure(e.getMessage)
    }
    TypeCheckResult.TypeCheckSuccess
  }

  override def dataType: DataType = TensorStructType
  override def nullable: Boolean = children.exists(_.nullable)

  @transient private lazy val canonical = mutable.HashMap[String, String]()

  override def eval(input: InternalRow): Any = {
    val array = children.head.eval(input).asInstanceOf[ArrayData]
    if (array == null) return null
    val dtype: String = dtypeArg match {
      case None => staticDtype.get
      case Some(e) =>
        val v = e.eval(input)
        if (v == null) return null
        staticDtype.getOrElse(canonical.getOrElseUpdate(v.toString,
          native("arr_to_st")(NativeTensorFunctions.writableDtype(v.toString))))
    }
    val (values, own) = flatten(array)
    val shape: Array[Long] = shapeArg match {
      case None => own
      case Some(e) =>
        val s = e.eval(input).asInstanceOf[ArrayData]
        if (s == null) return null
        Array.tabulate(s.numElements()) { i =>
          if (s.isNullAt(i)) throw new IllegalArgumentException(s"arr_to_st: null dimension at index $i of shape")
          e.dataType.asInstanceOf[ArrayType].elementType match {
            case LongType => s.getLong(i)
            case IntegerType => s.getInt(i).toLong
            case ShortType => s.getShort(i).toLong
            case _ => s.getByte(i).toLong
          }
        }
    }
    val bytes = native("arr_to_st")(NativeTensorFunctions.encode(values, elementNames(leafType), dtype, shape))
    // dimensions were checked by the engine (0 to 2^31 - 1)
    new GenericInternalRow(Array[Any](bytes, UnsafeArrayData.fromPrimitiveArray(shape.map(_.toInt)),
      UTF8String.fromString(dtype)))
  }

  /** The row's elements (little-endian bytes of the leaf type), row-major, and its shape; nulls
   *  and ragged nesting are errors naming the position. */
  private def flatten(top: ArrayData): (Array[Byte], Array[Long]) = {
    // the shape: each level's first element's length (an empty level: deeper dimensions are 0)
    val shape = new Array[Long](depth)
    var a = top
    var level = 0
    while (level < depth) {
      if (a != null) {
        shape(level) = a.numElements()
        if (level + 1 < depth) {
          a = if (a.numElements() == 0) null
            else if (a.isNullAt(0)) throw new IllegalArgumentException(
              s"arr_to_st: null value at ${position(Seq.fill(level + 1)(0))}")
            else a.getArray(0)
        }
      }
      level += 1
    }
    val count = shape.product
    val size = leafType.defaultSize
    val buf = ByteBuffer.allocate(Math.toIntExact(count * size)).order(ByteOrder.LITTLE_ENDIAN)
    def fill(a: ArrayData, level: Int, at: List[Int]): Unit = {
      val n = a.numElements()
      if (n != shape(level)) throw new IllegalArgumentException(
        s"arr_to_st: ragged nested array: inner lengths ${shape(level)} and $n (at ${position(at.reverse)})")
      var i = 0
      if (level + 1 < depth) {
        while (i < n) {
          if (a.isNullAt(i)) throw new IllegalArgumentException(s"arr_to_st: null value at ${position((i :: at).reverse)}")
          fill(a.getArray(i), level + 1, i :: at)
          i += 1
        }
      } else {
        while (i < n) {
          if (a.isNullAt(i)) throw new IllegalArgumentException(
            s"arr_to_st: null element at ${position((i :: at).reverse)}; nulls cannot be stored in a tensor")
          leafType match {
            case DoubleType => buf.putDouble(a.getDouble(i))
            case FloatType => buf.putFloat(a.getFloat(i))
            case LongType => buf.putLong(a.getLong(i))
            case IntegerType => buf.putInt(a.getInt(i))
            case ShortType => buf.putShort(a.getShort(i))
            case ByteType => buf.put(a.getByte(i))
            case _ => buf.put(if (a.getBoolean(i)) 1.toByte else 0.toByte)
          }
          i += 1
        }
      }
    }
    fill(top, 0, Nil) // also when empty: [[], [1]] is ragged
    (buf.array(), shape)
  }

  private def position(p: Seq[Int]): String = p.mkString("[", "][", "]")

  override protected def withNewChildrenInternal(newChildren: IndexedSeq[Expression]): Expression =
    copy(children = newChildren)
}

/**
 * `st_to_array(tensor [, dtype] [, rank])`: `element` and `rank` (-1: flat) are fixed when the
 * call is built ([[StToArray.build]]) so that the result type never changes afterwards.
 */
case class StToArray(child: Expression, element: DataType, rank: Int)
    extends UnaryExpression with CodegenFallback {
  import TensorFunctions._

  override def prettyName: String = "st_to_array"

  private def fields: Option[(Int, Int, Int, DataType)] = child.dataType match {
    case s: StructType if s.fields.length == 3 =>
      val names = s.fieldNames
      (names.indexOf("data"), names.indexOf("shape"), names.indexOf("dtype")) match {
        case (d, sh, dt) if d >= 0 && sh >= 0 && dt >= 0 &&
            s(d).dataType == BinaryType && s(dt).dataType == StringType =>
          s(sh).dataType match {
            case ArrayType(t @ (IntegerType | LongType), _) => Some((d, sh, dt, t))
            case _ => None
          }
        case _ => None
      }
    case _ => None
  }

  override def checkInputDataTypes(): TypeCheckResult =
    if (fields.isDefined) TypeCheckResult.TypeCheckSuccess
    else failure(s"st_to_array: the argument has type ${child.dataType.sql}; expected a Tensor Struct: " +
      "the fields data binary, shape array<int or bigint>, dtype string (any order)")

  override def dataType: DataType =
    (1 until math.max(rank, 1)).foldLeft(ArrayType(element, containsNull = false): DataType)(
      (t, _) => ArrayType(t, containsNull = false))

  override def nullable: Boolean = child.nullable

  @transient private lazy val layout = fields.get
  private lazy val elementName = elementNames(element)

  override protected def nullSafeEval(input: Any): Any = {
    val row = input.asInstanceOf[InternalRow]
    val (d, sh, dt, shapeType) = layout
    Seq(d -> "data", sh -> "shape", dt -> "dtype").foreach { case (i, name) =>
      if (row.isNullAt(i)) throw new IllegalArgumentException(s"st_to_array: null field '$name' of the tensor struct")
    }
    val data = row.getBinary(d)
    val dtype = row.getUTF8String(dt).toString
    val s = row.getArray(sh)
    val shape = Array.tabulate(s.numElements()) { i =>
      if (s.isNullAt(i)) throw new IllegalArgumentException(s"st_to_array: null dimension at index $i of shape")
      if (shapeType == LongType) s.getLong(i) else s.getInt(i).toLong
    }
    if (rank >= 1 && shape.length != rank) throw new IllegalArgumentException(
      s"st_to_array: a tensor of shape ${fmtShape(shape)} (rank ${shape.length}) does not fit the result type " +
        s"${dataType.sql} (rank $rank); give its rank, e.g. st_to_array(col, '$dtype', ${shape.length})")
    val bytes = native("st_to_array")(NativeTensorFunctions.decode(data, dtype, shape, elementName))
    val buf = ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN)
    val flat: ArrayData = element match {
      case DoubleType => val v = new Array[Double](bytes.length / 8); buf.asDoubleBuffer().get(v); UnsafeArrayData.fromPrimitiveArray(v)
      case FloatType => val v = new Array[Float](bytes.length / 4); buf.asFloatBuffer().get(v); UnsafeArrayData.fromPrimitiveArray(v)
      case LongType => val v = new Array[Long](bytes.length / 8); buf.asLongBuffer().get(v); UnsafeArrayData.fromPrimitiveArray(v)
      case IntegerType => val v = new Array[Int](bytes.length / 4); buf.asIntBuffer().get(v); UnsafeArrayData.fromPrimitiveArray(v)
      case ShortType => val v = new Array[Short](bytes.length / 2); buf.asShortBuffer().get(v); UnsafeArrayData.fromPrimitiveArray(v)
      case ByteType => UnsafeArrayData.fromPrimitiveArray(bytes)
      case _ => UnsafeArrayData.fromPrimitiveArray(bytes.map(_ != 0))
    }
    if (rank <= 1) flat else nest(flat, shape)
  }

  /** `flat` (row-major) as nested arrays of `shape`. */
  private def nest(flat: ArrayData, shape: Array[Long]): ArrayData = {
    val dims = shape.map(_.toInt)
    // elements under one index of each level
    val strides = dims.indices.map(l => dims.drop(l + 1).foldLeft(1)(_ * _))
    def level(l: Int, offset: Int): ArrayData =
      if (l == dims.length - 1) sliceOf(flat, offset, dims(l))
      else new GenericArrayData(Array.tabulate[Any](dims(l))(i => level(l + 1, offset + i * strides(l))))
    level(0, 0)
  }

  private def sliceOf(flat: ArrayData, offset: Int, n: Int): ArrayData = element match {
    case DoubleType => UnsafeArrayData.fromPrimitiveArray(flat.toDoubleArray.slice(offset, offset + n))
    case FloatType => UnsafeArrayData.fromPrimitiveArray(flat.toFloatArray.slice(offset, offset + n))
    case LongType => UnsafeArrayData.fromPrimitiveArray(flat.toLongArray.slice(offset, offset + n))
    case IntegerType => UnsafeArrayData.fromPrimitiveArray(flat.toIntArray.slice(offset, offset + n))
    case ShortType => UnsafeArrayData.fromPrimitiveArray(flat.toShortArray.slice(offset, offset + n))
    case ByteType => UnsafeArrayData.fromPrimitiveArray(flat.toByteArray.slice(offset, offset + n))
    case _ => UnsafeArrayData.fromPrimitiveArray(flat.toBooleanArray.slice(offset, offset + n))
  }

  override protected def withNewChildInternal(newChild: Expression): Expression = copy(child = newChild)
}

object StToArray {
  import TensorFunctions._

  /** The element type when neither an argument nor an `arr_to_st` child fixes it: F32's. */
  val DefaultDtype = "F32"

  /**
   * Builds `st_to_array(tensor [, dtype] [, rank])` (optional arguments told apart by type:
   * string dtype, integer rank; both literals). Without them: the dtype and rank of an
   * `arr_to_st` child when fixed at analysis, else F32's element type (float), flat.
   */
  def build(args: Seq[Expression]): Expression = {
    val usage = "st_to_array(tensor [, dtype] [, rank]) with a literal dtype string and a literal rank >= 1"
    def fail(msg: String) =
      throw new IllegalArgumentException(s"st_to_array: $msg; $usage")
    if (args.isEmpty || args.size > 3) fail(s"takes 1 to 3 arguments, got ${args.size}")
    val tensor = args.head
    var dtype: Option[String] = None
    var rank: Option[Int] = None
    args.drop(1).foreach { a =>
      if (!a.foldable) fail(s"the argument ${a.sql} is not a literal")
      val v = a.eval()
      (a.dataType, v) match {
        case (_, null) => fail(s"the argument ${a.sql} is null")
        case (_: StringType, s) if dtype.isEmpty =>
          dtype = Some(native("st_to_array")(NativeTensorFunctions.writableDtype(s.toString)))
        case (ByteType | ShortType | IntegerType | LongType, n) if rank.isEmpty =>
          val r = n.asInstanceOf[Number].longValue()
          if (r < 1 || r > 32) fail(s"rank $r is out of range (1 to 32)")
          rank = Some(r.toInt)
        case (t, _) => fail(s"unexpected argument ${a.sql} of type ${t.sql}")
      }
    }
    val fromChild: Option[ArrToSt] = tensor match {
      case a: ArrToSt if a.resolved && a.checkInputDataTypes().isSuccess => Some(a)
      case _ => None
    }
    val finalDtype = dtype.orElse(fromChild.flatMap(_.staticDtype)).getOrElse(DefaultDtype)
    val finalRank = rank.orElse(fromChild.flatMap(_.staticRank)).getOrElse(-1)
    val element = elementByName(native("st_to_array")(NativeTensorFunctions.elementType(finalDtype)))
    StToArray(tensor, element, finalRank)
  }
}
