package io.safetensors.spark.internal

import org.apache.arrow.memory.{AllocationListener, BufferAllocator, RootAllocator}
import org.apache.arrow.memory.rounding.SegmentRoundingPolicy

/** The Arrow memory of the JVM's side of the engine: write tasks' batches and read tasks'
 *  imported vectors. */
private[spark] object ArrowMemory {
  /**
   * One allocator per executor JVM; each task gets a child (which inherits its rounding). Buffer
   * sizes are rounded up to 1 KiB, not to the next power of two (Arrow's default): a vector of
   * 4 MiB of data plus its validity bits would otherwise take, zero and keep 8 MiB.
   */
  lazy val rootAllocator: BufferAllocator =
    new RootAllocator(AllocationListener.NOOP, Long.MaxValue, new SegmentRoundingPolicy(1024))
}
