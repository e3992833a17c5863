package io.safetensors.spark.read

import org.apache.arrow.vector.{BaseFixedWidthVector, BaseVariableWidthVector, BitVector, FieldVector}
import org.apache.arrow.vector.complex.{ListVector, MapVector, StructVector}
import org.apache.spark.sql.types._
import org.apache.spark.sql.vectorized.{ColumnVector, ColumnarArray, ColumnarMap}
import org.apache.spark.unsafe.Platform
import org.apache.spark.unsafe.types.UTF8String

/**
 * A Spark [[ColumnVector]] reading an imported Arrow vector's buffers directly.
 *
 * Spark's `ArrowColumnVector` goes through Arrow's `get(i)`, which checks the validity bit of
 * every element (`arrow.enable_null_check_for_get`) even for the non-null tensor values the read
 * path produces; summing the elements of a per-sample column spent ~25% of its time there. This
 * vector reads values with one unsafe load, and consults the validity buffer only in
 * `isNullAt` (Spark asks before reading a nullable value). It supports exactly the Arrow types the
 * Rust read task emits (spec/reading.md): Boolean, Int8/16/32/64, Float32/64, Utf8, Binary,
 * List, Struct, Map. The vector's buffers stay owned by the imported root.
 */
private[spark] final class ArrowBufferColumnVector(vector: FieldVector, sparkType: DataType)
    extends ColumnVector(sparkType) {
  import ArrowBufferColumnVector._

  private val validity: Long =
    if (vector.getNullCount == 0) 0L else vector.getValidityBufferAddress

  private val data: Long = vector match {
    case v: BaseFixedWidthVector => v.getDataBufferAddress
    case v: BaseVariableWidthVector => v.getDataBufferAddress
    case _ => 0L
  }

  private val offsets: Long = vector match {
    case v: BaseVariableWidthVector => v.getOffsetBufferAddress
    case v: ListVector => v.getOffsetBufferAddress
    case _ => 0L
  }

  private val children: Array[ArrowBufferColumnVector] = (vector, sparkType) match {
    case (m: MapVector, MapType(k, v, _)) =>
      val entries = m.getDataVector.asInstanceOf[StructVector]
      Array(wrap(entries.getChildByOrdinal(0).asInstanceOf[FieldVector], k),
        wrap(entries.getChildByOrdinal(1).asInstanceOf[FieldVector], v))
    case (l: ListVector, ArrayType(e, _)) => Array(wrap(l.getDataVector, e))
    case (s: StructVector, st: StructType) =>
      st.fields.indices.map(i =>
        wrap(s.getChildByOrdinal(i).asInstanceOf[FieldVector], st.fields(i).dataType)).toArray
    case _ => Array.empty
  }

  override def close(): Unit = ()

  override def hasNull: Boolean = validity != 0L

  override def numNulls(): Int = vector.getNullCount

  override def isNullAt(rowId: Int): Boolean = validity != 0L && !bit(validity, rowId)

  override def getBoolean(rowId: Int): Boolean = bit(data, rowId)
  override def getByte(rowId: Int): Byte = Platform.getByte(null, data + rowId)
  override def getShort(rowId: Int): Short = Platform.getShort(null, data + 2L * rowId)
  override def getInt(rowId: Int): Int = Platform.getInt(null, data + 4L * rowId)
  override def getLong(rowId: Int): Long = Platform.getLong(null, data + 8L * rowId)
  override def getFloat(rowId: Int): Float = Platform.getFloat(null, data + 4L * rowId)
  override def getDouble(rowId: Int): Double = Platform.getDouble(null, data + 8L * rowId)

  private def start(rowId: Int): Int = Platform.getInt(null, offsets + 4L * rowId)
  private def end(rowId: Int): Int = Platform.getInt(null, offsets + 4L * (rowId + 1))

  override def getUTF8String(rowId: Int): UTF8String =
    if (isNullAt(rowId)) null
    else UTF8String.fromAddress(null, data + start(rowId), end(rowId) - start(rowId))

  override def getBinary(rowId: Int): Array[Byte] =
    if (isNullAt(rowId)) null
    else {
      val s = start(rowId)
      val out = new Array[Byte](end(rowId) - s)
      Platform.copyMemory(null, data + s, out, Platform.BYTE_ARRAY_OFFSET, out.length)
      out
    }

  override def getArray(rowId: Int): ColumnarArray =
    if (isNullAt(rowId)) null
    else new ColumnarArray(children(0), start(rowId), end(rowId) - start(rowId))

  override def getMap(rowId: Int): ColumnarMap =
    if (isNullAt(rowId)) null
    else new ColumnarMap(children(0), children(1), start(rowId), end(rowId) - start(rowId))

  override def getDecimal(rowId: Int, precision: Int, scale: Int): Decimal =
    throw new UnsupportedOperationException("safetensors reads produce no decimals")

  override def getChild(ordinal: Int): ColumnVector = children(ordinal)
}

private[spark] object ArrowBufferColumnVector {
  def wrap(v: FieldVector, t: DataType): ArrowBufferColumnVector = {
    (v, t) match {
      case (_: BitVector, BooleanType) | (_: BaseFixedWidthVector, _: NumericType) |
          (_: BaseVariableWidthVector, StringType | BinaryType) | (_: MapVector, _: MapType) |
          (_: ListVector, _: ArrayType) | (_: StructVector, _: StructType) =>
      case _ => throw new IllegalStateException(
        s"safetensors: the read task produced Arrow ${v.getField} for Spark type ${t.simpleString}")
    }
    new ArrowBufferColumnVector(v, t)
  }

  private def bit(address: Long, i: Int): Boolean =
    ((Platform.getByte(null, address + (i >> 3)) >> (i & 7)) & 1) != 0
}
