package org.apache.spark.sql.safetensors

import org.apache.spark.SparkContext

/** Test access to the `private[spark]` listener bus: wait until every posted event was delivered. */
object TestListenerBus {
  def drain(sc: SparkContext): Unit = sc.listenerBus.waitUntilEmpty()
}
