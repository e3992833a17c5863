package io.safetensors.spark.write

import io.safetensors.spark.internal.ArrowMemory
import org.apache.arrow.c.{ArrowArray, ArrowSchema, Data}
import org.apache.arrow.vector.{VarBinaryVector, VarCharVector}
import org.apache.spark.sql.catalyst.expressions.{GenericInternalRow, UnsafeArrayData, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String
import org.scalatest.funsuite.AnyFunSuite

/** The JVM side of a write batch: how much direct memory one batch takes (no Spark session). */
class ArrowBatchBuilderSuite extends AnyFunSuite {

  private def floatsPlan = WirePlan(kv = false, -1,
    IndexedSeq(WireColumn("x", 0, WireInput.NumericArray("float", 1))))
  private val schema = StructType(Seq(StructField("x", ArrayType(FloatType, containsNull = false))))

  test("presizeCount: a full batch of such lists, capped, never below the list itself") {
    import ArrowBatchBuilder._
    assert(presizeCount(256, 4) == 256 * MaxRows)
    assert(presizeCount(1000, 8) == (PresizeBytes / 8).toInt)
    assert(presizeCount(10 << 20, 8) == (10 << 20))
    assert(presizeCount(1, 1) == MaxRows)
  }

  test("a batch of 4096 rows × 256 floats takes its 4 MiB of elements once, not 8 MiB") {
    val allocator = ArrowMemory.rootAllocator.newChildAllocator("batch-size-test", 0, Long.MaxValue)
    val builder = new ArrowBatchBuilder(floatsPlan, schema, allocator)
    try {
      val row = new GenericInternalRow(Array[Any](UnsafeArrayData.fromPrimitiveArray(Array.fill(256)(1.5f))))
      (1 to ArrowBatchBuilder.MaxRows).foreach(_ => builder.add(row))
      assert(builder.isFull)
      val elements = ArrowBatchBuilder.MaxRows.toLong * 256 * 4
      // Elements + their validity bits + list offsets and validity, each rounded to 1 KiB; with
      // power-of-two rounding or growth by doubling the element buffer alone would be 8 MiB.
      val slack = elements / 32 + (64L << 10)
      assert(allocator.getAllocatedMemory <= elements + slack, allocator.getAllocatedMemory)
      assert(allocator.getPeakMemoryAllocation <= elements + slack, allocator.getPeakMemoryAllocation)
      // The next batch reuses the buffers: nothing new is allocated.
      assert(builder.flush((_, _) => 0) == 0)
      val held = allocator.getAllocatedMemory
      (1 to ArrowBatchBuilder.MaxRows).foreach(_ => builder.add(row))
      assert(allocator.getAllocatedMemory == held)
      assert(allocator.getPeakMemoryAllocation <= elements + slack)
      builder.flush((_, _) => 0)
    } finally {
      builder.close()
      allocator.close()
    }
  }

  test("keys and binary values copied straight from UnsafeRows land in the batch byte for byte") {
    val plan = WirePlan(kv = true, 0, IndexedSeq(WireColumn("b", 1, WireInput.Binary)))
    val kvSchema = StructType(Seq(StructField("key", StringType), StructField("b", BinaryType)))
    val keys = IndexedSeq("k0", "", "ключ-é", "k3", null, "a much longer key than the others")
    val values = IndexedSeq(Array[Byte](1, 2, 3), Array.emptyByteArray, null, Array.tabulate[Byte](3072)(i => (i * 7).toByte),
      Array[Byte](9), Array[Byte](-1, 0, -1))
    val project = UnsafeProjection.create(kvSchema)
    // Each row copied into the middle of a larger array: the row does not start at the array's
    // first byte, as rows of a cached batch or a shuffle buffer do not.
    val rows = keys.indices.map { i =>
      val u = project(new GenericInternalRow(Array[Any](Option(keys(i)).map(UTF8String.fromString).orNull, values(i))))
      val bytes = new Array[Byte](u.getSizeInBytes + 24)
      u.writeToMemory(bytes, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET + 16)
      val r = new UnsafeRow(2)
      r.pointTo(bytes, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET + 16, u.getSizeInBytes)
      r
    }
    // The same rows as GenericInternalRows take the generic path (getBinary / getBytes).
    val generic = keys.indices.map(i => new GenericInternalRow(Array[Any](Option(keys(i)).map(UTF8String.fromString).orNull, values(i))))
    for (input <- Seq(rows, generic)) {
      val allocator = ArrowMemory.rootAllocator.newChildAllocator("unsafe-row-test", 0, Long.MaxValue)
      val builder = new ArrowBatchBuilder(plan, kvSchema, allocator)
      try {
        input.foreach(builder.add)
        builder.flush { (arrayAddr, schemaAddr) =>
          val root = Data.importVectorSchemaRoot(allocator, ArrowArray.wrap(arrayAddr), ArrowSchema.wrap(schemaAddr), null)
          try {
            val k = root.getVector(0).asInstanceOf[VarCharVector]
            val b = root.getVector(1).asInstanceOf[VarBinaryVector]
            assert(root.getRowCount == keys.size)
            keys.indices.foreach { i =>
              if (keys(i) == null) assert(k.isNull(i), i) else assert(new String(k.get(i), "UTF-8") == keys(i), i)
              if (values(i) == null) assert(b.isNull(i), i) else assert(b.get(i).sameElements(values(i)), i)
            }
          } finally root.close()
        }
      } finally {
        builder.close()
        allocator.close()
      }
    }
  }
}
