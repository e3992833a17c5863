package io.safetensors.spark

import org.apache.spark.sql.catalyst.expressions.GenericInternalRow
import org.apache.spark.sql.catalyst.expressions.UnsafeArrayData
import org.apache.spark.sql.types._
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
    val allocator = WriteTask.rootAllocator.newChildAllocator("batch-size-test", 0, Long.MaxValue)
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
}
