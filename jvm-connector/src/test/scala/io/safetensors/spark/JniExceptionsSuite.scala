package io.safetensors.spark

import java.nio.{ByteBuffer, ByteOrder}

import io.safetensors.spark.jni._
import org.apache.spark.sql.Row
import org.apache.spark.sql.types._

/**
 * Errors cross JNI as the Java class the Rust error variant chooses (rust-core/jni/src/error.rs,
 * spec/jni.md §1): each case is a real native call or a real write, and asserts the exact class.
 */
class JniExceptionsSuite extends SparkSuiteBase {
  override protected def appName: String = "jni-exceptions"

  private def prefix(n: Long): Array[Byte] =
    ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN).putLong(n).array()

  test("a header length beyond the file is a SafetensorsFormatException naming the file") {
    NativeLib.ensureLoaded()
    val e = intercept[SafetensorsException](NativeReader.headerLength("bad.safetensors", prefix(1000), 64))
    assert(e.getClass == classOf[SafetensorsFormatException], e)
    assert(e.getMessage.startsWith("bad.safetensors: "), e.getMessage)
  }

  test("an option the plan refuses is a SafetensorsOptionsException, an IllegalArgumentException") {
    NativeLib.ensureLoaded()
    val schema = StructType(Seq(StructField("x", ArrayType(FloatType)))).json
    val e = intercept[IllegalArgumentException](
      NativeWriter.planWrite(schema, """{"batch_size": "0"}""", false, null, null))
    assert(e.getClass == classOf[SafetensorsOptionsException], e)
    assert(e.getMessage.contains("batch_size"), e.getMessage)
  }

  test("a manifest that breaks the dataset layout is a SafetensorsDatasetException") {
    NativeLib.ensureLoaded()
    val e = intercept[SafetensorsException](NativeWriter.checkManifest("""{"format_version": "9"}""",
      "/d/dataset_manifest.json"))
    assert(e.getClass == classOf[SafetensorsDatasetException], e)
    assert(e.getMessage.startsWith("the dataset's current manifest /d/dataset_manifest.json: "), e.getMessage)
  }

  test("a JVM-side misuse (handle 0) stays a plain IllegalArgumentException") {
    NativeLib.ensureLoaded()
    val e = intercept[IllegalArgumentException](NativeWriter.finish(0L))
    assert(e.getClass == classOf[IllegalArgumentException], e)
  }

  test("a row the write cannot store fails the task with a SafetensorsDataException") {
    val schema = StructType(Seq(StructField("k", StringType), StructField("v", ArrayType(FloatType))))
    val rows = Seq(Row("a", Seq(1f)), Row("a", Seq(2f)))
    val df = spark.createDataFrame(spark.sparkContext.parallelize(rows, 1), schema)
    val e = intercept[Exception](df.write.format("safetensors").option("name_col", "k").save(freshPath()))
    val chain = Iterator.iterate[Throwable](e)(_.getCause).takeWhile(_ != null).toSeq
    assert(chain.exists(_.getClass == classOf[SafetensorsDataException]), messages(e))
    assert(messages(e).contains("duplicate key 'a'"), messages(e))
  }
}
