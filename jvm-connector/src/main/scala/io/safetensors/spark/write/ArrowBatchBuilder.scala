package io.safetensors.spark.write

import scala.jdk.CollectionConverters._

import org.apache.arrow.c.{ArrowArray, ArrowSchema, Data}
import org.apache.arrow.memory.{ArrowBuf, BufferAllocator}
import org.apache.arrow.vector._
import org.apache.arrow.vector.complex.{ListVector, StructVector}
import org.apache.arrow.vector.types.FloatingPointPrecision
import org.apache.arrow.vector.types.pojo.{ArrowType, Field, FieldType, Schema}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.SpecializedGetters
import org.apache.spark.sql.catalyst.expressions.{UnsafeArrayData, UnsafeRow}
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.Platform

/**
 * Builds Arrow record batches in the WIRE LAYOUT (rust-core/engine/src/write/mod.rs) from Spark rows and
 * hands them to Rust through the C Data Interface. One builder per task; vectors come from the
 * task's allocator. The VectorSchemaRoot is reset and reused for the next batch (its buffers keep
 * the capacity they grew to, so later batches neither allocate, zero fresh pages nor copy on
 * growth) unless the batch was flushed by size or a buffer is still referenced elsewhere; then it
 * is closed and the next batch starts with a fresh one.
 */
private[spark] final class ArrowBatchBuilder(plan: WirePlan, schema: StructType,
    allocator: BufferAllocator) extends AutoCloseable {
  import ArrowBatchBuilder._

  private val inputs: IndexedSeq[(Int, DataType, Option[WireInput])] = {
    val key = if (plan.kv) IndexedSeq((plan.nameFieldIndex, StringType: DataType, None)) else IndexedSeq.empty
    key ++ plan.columns.map(c => (c.fieldIndex, schema(c.fieldIndex).dataType, Some(c.input)))
  }

  val arrowSchema: Schema = new Schema(inputs.zipWithIndex.map { case ((_, dt, in), i) =>
    fieldFor(if (i == 0 && plan.kv) "key" else plan.columns(i - (if (plan.kv) 1 else 0)).name, dt, in)
  }.asJava)

  private val ordinals: Array[Int] = inputs.map(_._1).toArray
  private var root: VectorSchemaRoot = _
  private var writers: Array[VW] = _
  private var rows = 0
  /** The root holds a flushed batch whose buffers may be reset and refilled. */
  private var reusable = false

  def rowCount: Int = rows

  def add(row: InternalRow): Unit = {
    if (root == null) {
      root = VectorSchemaRoot.create(arrowSchema, allocator)
      root.allocateNew()
      writers = inputs.indices.map(i => writerFor(root.getVector(i), inputs(i)._2, inputs(i)._3)).toArray
      // Room for a full batch of rows like this first one, allocated once, instead of growing by
      // doubling (each step copies and zeroes, and the last may overshoot by almost 2x).
      writers.indices.foreach { i =>
        writers(i) match {
          case l: ListW => l.presize(row, ordinals(i))
          case _ =>
        }
      }
    } else if (rows == 0 && reusable) {
      reusable = false
      root.getFieldVectors.forEach(v => resetForReuse(v))
    }
    var i = 0
    while (i < writers.length) {
      writers(i).write(row, ordinals(i), rows)
      i += 1
    }
    rows += 1
  }

  /** Flush policy: rows >= [[MaxRows]] or the task allocator holds >= [[MaxBytes]]. */
  def isFull: Boolean = rows >= MaxRows || allocator.getAllocatedMemory >= MaxBytes

  /** Exports the buffered rows and calls `write(arrayAddr, schemaAddr)`; always frees them. */
  def flush[T](write: (Long, Long) => T): T = {
    require(root != null && rows > 0, "nothing to flush")
    val array = ArrowArray.allocateNew(allocator)
    val cSchema = ArrowSchema.allocateNew(allocator)
    var ok = false
    try {
      root.setRowCount(rows)
      Data.exportVectorSchemaRoot(allocator, root, null, array, cSchema)
      val result = write(array.memoryAddress(), cSchema.memoryAddress())
      ok = true
      result
    } finally {
      // Rust moved the contents out (release is then a no-op); on an early error we release.
      try array.release() finally try array.close() finally try cSchema.release()
      finally try cSchema.close() finally {
        if (ok && canReuse) { rows = 0; reusable = true } else closeRoot()
      }
    }
  }

  /**
   * After a successful flush: the batch stayed under [[MaxBytes]] (a root grown to the limit would
   * make the next batch flush after one row) and no buffer is referenced outside its vector (Rust
   * drops the imported batch before `writeBatch` returns).
   */
  private def canReuse: Boolean =
    allocator.getAllocatedMemory < MaxBytes && onlyVectorRefs(root.getFieldVectors.asScala.toSeq)

  private def closeRoot(): Unit = {
    if (root != null) {
      val r = root
      root = null
      writers = null
      rows = 0
      reusable = false
      r.close()
    }
  }

  override def close(): Unit = closeRoot()
}

private[spark] object ArrowBatchBuilder {
  /** Rows per batch handed to Rust (spec/jni.md). */
  val MaxRows: Int = 4096
  /** Flush once the task allocator holds this many bytes (spec/jni.md). */
  val MaxBytes: Long = 64L << 20
  /** At most this many element bytes are allocated up front for a list column ([[presizeCount]]). */
  val PresizeBytes: Long = 16L << 20

  /**
   * Elements to allocate for a list column whose first list in a fresh batch has `n` elements of
   * `size` bytes: [[MaxRows]] such lists, at most [[PresizeBytes]], at least `n`.
   */
  def presizeCount(n: Int, size: Int): Int =
    math.max(n.toLong, math.min(n.toLong * MaxRows, PresizeBytes / math.max(size, 1))).toInt

  /**
   * True when the vectors' buffers are referenced by the vectors alone: every reference manager
   * counts exactly as many references as the vectors hold buffers on it (a fixed-width vector's
   * data and validity buffers are two slices of one allocation, so their manager counts 2).
   */
  def onlyVectorRefs(vectors: Seq[FieldVector]): Boolean = {
    val held = new java.util.IdentityHashMap[AnyRef, Integer]()
    vectors.foreach(_.getBuffers(false).foreach { b =>
      val m = b.getReferenceManager
      held.put(m, Integer.valueOf(held.getOrDefault(m, Integer.valueOf(0)).intValue + 1))
    })
    held.asScala.forall { case (m, n) =>
      m.asInstanceOf[org.apache.arrow.memory.ReferenceManager].getRefCount == n.intValue
    }
  }

  /**
   * Empties a vector for the next batch, keeping its buffers. Like `reset()`, except that a list
   * of fixed-width elements keeps its element data unzeroed: only validity and offsets are zeroed
   * (every element slot below the next batch's value count is written again by [[ListW]] or
   * [[PrimW]], and Arrow leaves the data of null slots undefined). Zeroing that data buffer (the
   * bulk of the batch) cost as much as copying the rows into it.
   */
  def resetForReuse(v: FieldVector): Unit = v match {
    case lv: ListVector if lv.getDataVector.isInstanceOf[BaseFixedWidthVector] =>
      val dv = lv.getDataVector.asInstanceOf[BaseFixedWidthVector]
      zero(lv.getOffsetBuffer)
      zero(lv.getValidityBuffer)
      lv.setLastSet(-1)
      zero(dv.getValidityBuffer)
      lv.setValueCount(0) // also sets the element vector's value count to 0
    case other => other.reset()
  }

  private def zero(b: ArrowBuf): Unit = b.setZero(0, b.capacity)

  private def field(name: String, t: ArrowType, children: Field*): Field =
    new Field(name, FieldType.nullable(t), if (children.isEmpty) null else children.asJava)

  private def primType(dt: DataType): ArrowType = dt match {
    case BooleanType | ByteType => new ArrowType.Int(8, true)
    case ShortType => new ArrowType.Int(16, true)
    case IntegerType => new ArrowType.Int(32, true)
    case LongType => new ArrowType.Int(64, true)
    case FloatType => new ArrowType.FloatingPoint(FloatingPointPrecision.SINGLE)
    case DoubleType => new ArrowType.FloatingPoint(FloatingPointPrecision.DOUBLE)
    case BinaryType => ArrowType.Binary.INSTANCE
    case StringType => ArrowType.Utf8.INSTANCE
    case other => throw new IllegalArgumentException(s"safetensors: no wire type for $other")
  }

  /** Tensor Struct field positions in the Spark struct, matched by name. */
  private def tensorFields(st: StructType): (Int, Int, Int, DataType) = {
    def idx(n: String): Int = {
      val i = st.fields.indexWhere(_.name.equalsIgnoreCase(n))
      if (i < 0) throw new IllegalArgumentException(s"safetensors: Tensor Struct has no field '$n': $st")
      i
    }
    val s = idx("shape")
    (idx("data"), s, idx("dtype"), st.fields(s).dataType)
  }

  def fieldFor(name: String, dt: DataType, input: Option[WireInput]): Field = (dt, input) match {
    case (_: StructType, Some(WireInput.TensorStruct)) =>
      field(name, ArrowType.Struct.INSTANCE,
        field("data", ArrowType.Binary.INSTANCE),
        field("shape", ArrowType.List.INSTANCE, field("item", new ArrowType.Int(64, true))),
        field("dtype", ArrowType.Utf8.INSTANCE))
    case (udt: UserDefinedType[_], _) => fieldFor(name, udt.sqlType, None)
    case (st: StructType, _) =>
      field(name, ArrowType.Struct.INSTANCE, st.fields.map(f => fieldFor(f.name, f.dataType, None)).toIndexedSeq: _*)
    case (ArrayType(et, _), _) => field(name, ArrowType.List.INSTANCE, fieldFor("item", et, None))
    case _ => field(name, primType(dt))
  }

  def writerFor(v: ValueVector, dt: DataType, input: Option[WireInput]): VW = (dt, input) match {
    case (st: StructType, Some(WireInput.TensorStruct)) =>
      val sv = v.asInstanceOf[StructVector]
      val (d, s, t, shapeType) = tensorFields(st)
      val shapeElem = shapeType match {
        case ArrayType(IntegerType, _) => IntToLong
        case ArrayType(LongType, _) => LongCode
        case other => throw new IllegalArgumentException(s"safetensors: Tensor Struct shape must be array<int|long>, got $other")
      }
      val shapeList = sv.getChildByOrdinal(1).asInstanceOf[ListVector]
      new StructW(sv, st.fields.length, Array(
        (d, new BinaryW(sv.getChildByOrdinal(0).asInstanceOf[VarBinaryVector])),
        (s, new ListW(shapeList, new PrimW(shapeList.getDataVector.asInstanceOf[BaseFixedWidthVector], shapeElem), -1, 0)),
        (t, new Utf8W(sv.getChildByOrdinal(2).asInstanceOf[VarCharVector]))))
    case (udt: UserDefinedType[_], _) => writerFor(v, udt.sqlType, None)
    case (st: StructType, _) =>
      val sv = v.asInstanceOf[StructVector]
      new StructW(sv, st.fields.length, st.fields.indices.map { i =>
        (i, writerFor(sv.getChildByOrdinal(i), st.fields(i).dataType, None))
      }.toArray)
    case (ArrayType(et, _), _) =>
      val lv = v.asInstanceOf[ListVector]
      val child = writerFor(lv.getDataVector, et, None)
      val (code, size) = et match {
        case BooleanType => (BoolCode, 1)
        case ByteType => (ByteCode, 1)
        case ShortType => (ShortCode, 2)
        case IntegerType => (IntCode, 4)
        case LongType => (LongCode, 8)
        case FloatType => (FloatCode, 4)
        case DoubleType => (DoubleCode, 8)
        case _ => (-1, 0)
      }
      new ListW(lv, child, code, size)
    case (BinaryType, _) => new BinaryW(v.asInstanceOf[VarBinaryVector])
    case (StringType, _) => new Utf8W(v.asInstanceOf[VarCharVector])
    case _ =>
      val code = dt match {
        case BooleanType => BoolCode
        case ByteType => ByteCode
        case ShortType => ShortCode
        case IntegerType => IntCode
        case LongType => LongCode
        case FloatType => FloatCode
        case DoubleType => DoubleCode
        case other => throw new IllegalArgumentException(s"safetensors: cannot write $other")
      }
      new PrimW(v.asInstanceOf[BaseFixedWidthVector], code)
  }

  final val BoolCode = 0
  final val ByteCode = 1
  final val ShortCode = 2
  final val IntCode = 3
  final val LongCode = 4
  final val FloatCode = 5
  final val DoubleCode = 6
  final val IntToLong = 7

  /** Writes value `ord` of `src` at index `idx` of its vector. */
  abstract class VW {
    def write(src: SpecializedGetters, ord: Int, idx: Int): Unit
  }

  final class PrimW(v: BaseFixedWidthVector, code: Int) extends VW {
    override def write(src: SpecializedGetters, ord: Int, idx: Int): Unit = {
      if (src.isNullAt(ord)) { v.setNull(idx); return }
      (code: @annotation.switch) match {
        case BoolCode => v.asInstanceOf[TinyIntVector].setSafe(idx, if (src.getBoolean(ord)) 1 else 0)
        case ByteCode => v.asInstanceOf[TinyIntVector].setSafe(idx, src.getByte(ord))
        case ShortCode => v.asInstanceOf[SmallIntVector].setSafe(idx, src.getShort(ord))
        case IntCode => v.asInstanceOf[IntVector].setSafe(idx, src.getInt(ord))
        case LongCode => v.asInstanceOf[BigIntVector].setSafe(idx, src.getLong(ord))
        case FloatCode => v.asInstanceOf[Float4Vector].setSafe(idx, src.getFloat(ord))
        case DoubleCode => v.asInstanceOf[Float8Vector].setSafe(idx, src.getDouble(ord))
        case IntToLong => v.asInstanceOf[BigIntVector].setSafe(idx, src.getInt(ord).toLong)
      }
    }
  }

  /**
   * A binary column. From an on-heap UnsafeRow the value is copied straight from the row's bytes
   * into the vector (as `UnsafeRow.getBinary` locates it), not through a fresh `byte[]` per row.
   */
  final class BinaryW(v: VarBinaryVector) extends VW {
    override def write(src: SpecializedGetters, ord: Int, idx: Int): Unit =
      if (src.isNullAt(ord)) v.setNull(idx)
      else src match {
        case u: UnsafeRow if u.getBaseObject.isInstanceOf[Array[Byte]] =>
          val offsetAndSize = u.getLong(ord)
          val start = u.getBaseOffset + (offsetAndSize >> 32).toInt - Platform.BYTE_ARRAY_OFFSET
          v.setSafe(idx, u.getBaseObject.asInstanceOf[Array[Byte]], start.toInt, offsetAndSize.toInt)
        case _ => v.setSafe(idx, src.getBinary(ord))
      }
  }

  /** A string column: an on-heap UTF8String's bytes are copied without an intermediate `byte[]`. */
  final class Utf8W(v: VarCharVector) extends VW {
    override def write(src: SpecializedGetters, ord: Int, idx: Int): Unit =
      if (src.isNullAt(ord)) v.setNull(idx)
      else {
        val s = src.getUTF8String(ord)
        s.getBaseObject match {
          case a: Array[Byte] => v.setSafe(idx, a, (s.getBaseOffset - Platform.BYTE_ARRAY_OFFSET).toInt, s.numBytes)
          case _ => v.setSafe(idx, s.getBytes)
        }
      }
  }

  final class StructW(v: StructVector, numFields: Int, children: Array[(Int, VW)]) extends VW {
    override def write(src: SpecializedGetters, ord: Int, idx: Int): Unit = {
      if (src.isNullAt(ord)) { v.setNull(idx); return }
      val s = src.getStruct(ord, numFields)
      v.setIndexDefined(idx)
      var i = 0
      while (i < children.length) {
        children(i)._2.write(s, children(i)._1, idx)
        i += 1
      }
    }
  }

  /**
   * A list column. `code`/`size` >= 0: the elements are primitives of that Spark type, copied
   * from an UnsafeArrayData in one bulk copy (booleans are one byte each there and travel as
   * Int8); validity is set in bulk and per element only when the array has a null.
   */
  final class ListW(v: ListVector, child: VW, code: Int, size: Int) extends VW {
    override def write(src: SpecializedGetters, ord: Int, idx: Int): Unit = {
      if (src.isNullAt(ord)) { v.setNull(idx); return }
      val arr = src.getArray(ord)
      val n = arr.numElements()
      val start = v.startNewValue(idx)
      arr match {
        case u: UnsafeArrayData if code >= 0 && n > 0 => bulk(u, start, n)
        case _ =>
          var i = 0
          while (i < n) {
            child.write(arr, i, start + i)
            i += 1
          }
      }
      v.endValue(idx, n)
    }

    /** Sizes the element vector for [[MaxRows]] lists as long as `src`'s (see [[presizeCount]]). */
    def presize(src: SpecializedGetters, ord: Int): Unit = {
      if (size > 0 && !src.isNullAt(ord)) {
        val n = src.getArray(ord).numElements()
        v.getDataVector match {
          case dv: BaseFixedWidthVector if n > 0 && dv.getValueCapacity < presizeCount(n, size) =>
            dv.allocateNew(presizeCount(n, size))
          case _ =>
        }
      }
    }

    private def bulk(u: UnsafeArrayData, start: Int, n: Int): Unit = {
      val dv = v.getDataVector.asInstanceOf[BaseFixedWidthVector]
      while (dv.getValueCapacity < start + n) dv.reAlloc()
      val header = UnsafeArrayData.calculateHeaderPortionInBytes(n)
      Platform.copyMemory(u.getBaseObject, u.getBaseOffset + header, null,
        dv.getDataBufferAddress + start.toLong * size, n.toLong * size)
      val validity = dv.getValidityBuffer
      setValidRange(validity, start, n)
      if (hasNull(u, n)) {
        var i = 0
        while (i < n) {
          if (u.isNullAt(i)) BitVectorHelper.unsetBit(validity, start + i)
          i += 1
        }
      }
    }
  }

  private def hasNull(u: UnsafeArrayData, n: Int): Boolean = {
    val words = (n + 63) / 64
    var w = 0
    while (w < words) {
      if (Platform.getLong(u.getBaseObject, u.getBaseOffset + 8 + w * 8L) != 0L) return true
      w += 1
    }
    false
  }

  /** Sets validity bits [start, start + n): edge bits one by one, whole bytes as 0xFF. */
  def setValidRange(buf: ArrowBuf, start: Int, n: Int): Unit = {
    val end = start + n
    var i = start
    while (i < end && (i & 7) != 0) { BitVectorHelper.setBit(buf, i.toLong); i += 1 }
    val bytes = (end - i) / 8
    if (bytes > 0) { buf.setOne((i / 8).toLong, bytes.toLong); i += bytes * 8 }
    while (i < end) { BitVectorHelper.setBit(buf, i.toLong); i += 1 }
  }
}
