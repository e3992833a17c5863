package io.safetensors.spark

import io.safetensors.spark.jni.{NativeLib, SafetensorsException}
import org.apache.spark.SparkException
import org.apache.spark.sql.SparkSession

/**
 * One real local[2] SparkSession: NativeLib called inside Spark tasks. In local mode the tasks
 * run in the driver's JVM, so this shows the natives work from task threads, not that a separate
 * executor JVM loads the library from the jar: the `local-cluster` tests of
 * tests/python/test_spark_write.py and test_spark_read.py do that.
 */
class SparkNativeLoadSuite extends SparkSuiteBase {

  override protected def appName: String = "safetensors-spark-native-load"

  test("native calls inside tasks (local mode: task threads of the driver JVM) return the library version") {
    val versions = spark.sparkContext
      .parallelize(1 to 4, 2)
      .map { _ => NativeLib.ensureLoaded(); NativeLib.version() }
      .collect()
    assert(versions.toSeq == Seq.fill(4)(TestVersions.pomVersion))
    // The plain call (static initializer loads the library) works too.
    val plain = spark.sparkContext.parallelize(1 to 4, 2).map(_ => NativeLib.version()).collect()
    assert(plain.toSet == Set(TestVersions.pomVersion))
  }

  test("a Rust error inside a task is an ordinary Java exception there") {
    val msgs = spark.sparkContext
      .parallelize(1 to 2, 2)
      .map { _ =>
        NativeLib.ensureLoaded()
        try { NativeLib.selfTest(1); "no exception" }
        catch { case e: IllegalArgumentException => e.getMessage }
      }
      .collect()
    assert(msgs.toSet == Set("selfTest: invalid argument requested (mode 1)"))
  }

  test("a Rust panic fails the task with SafetensorsException; the session keeps working") {
    val e = intercept[SparkException] {
      spark.sparkContext
        .parallelize(1 to 2, 2)
        .map { _ => NativeLib.ensureLoaded(); NativeLib.selfTest(2) }
        .collect()
    }
    val chain = Iterator.iterate[Throwable](e)(_.getCause).takeWhile(_ != null).toList
    assert(
      chain.exists(_.isInstanceOf[SafetensorsException]) ||
        e.getMessage.contains(classOf[SafetensorsException].getName),
      e.toString)
    assert(e.getMessage.contains("internal error (Rust panic)"), e.getMessage)

    // Same JVM, same library: later jobs still run native code.
    val after = spark.sparkContext.parallelize(1 to 4, 2).map(_ => NativeLib.selfTest(0)).collect()
    assert(after.toSet == Set(NativeLib.SELF_TEST_OK))
    assert(spark.range(10).count() == 10)
  }
}
