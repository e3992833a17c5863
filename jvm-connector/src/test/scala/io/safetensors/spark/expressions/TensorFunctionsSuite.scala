package io.safetensors.spark.expressions

import io.safetensors.spark.functions.{arr_to_st, st_to_array}
import org.apache.spark.sql.{AnalysisException, Row}
import org.apache.spark.sql.functions.{array, col, lit}
import org.apache.spark.sql.types._
import io.safetensors.spark.SparkSuiteBase

/**
 * The tensor functions from the Scala API, on a real local[2] session configured with our
 * `spark.sql.extensions` class (the PySpark cross-checks against numpy/ml_dtypes/safetensors are
 * tests/python/test_tensor_functions.py).
 */
class TensorFunctionsSuite extends SparkSuiteBase {

  private type CSeq[A] = scala.collection.Seq[A]

  override protected def appName: String = "safetensors-spark-tensor-functions"

  override protected def sparkConf: Seq[(String, String)] = Seq("spark.sql.extensions" -> "io.safetensors.spark.SafetensorsExtensions")

  private def floats(values: Seq[Double]*) = {
    val schema = StructType(Seq(StructField("x", ArrayType(DoubleType))))
    spark.createDataFrame(spark.sparkContext.parallelize(values.map(v => Row(v)), 1), schema)
  }

  test("arr_to_st rounds F16 to nearest even from the double, in either argument order, and the writer stores it") {
    val df = floats(Seq(0.1, 65520.0, 1e-7, -2.5), Seq(1.0, 2.0, 3.0, 4.0))
    val ours = df.select(arr_to_st(col("x"), "F16", Seq(2, 2)).as("t"))
    val peers = df.select(arr_to_st(col("x"), Seq(2, 2), "F16").as("t"))
    assert(ours.collect().toSeq.map(_.getStruct(0).toSeq.map {
      case b: Array[Byte] => b.toSeq
      case o => o
    }) == peers.collect().toSeq.map(_.getStruct(0).toSeq.map {
      case b: Array[Byte] => b.toSeq
      case o => o
    }))
    val first = ours.first().getStruct(0)
    // 0.1 -> 0x2e66, 65520 -> +inf 0x7c00 (ties to even), 1e-7 -> subnormal 2 * 2^-24 = 0x0002, -2.5 -> 0xc100
    assert(first.getAs[Array[Byte]]("data").toSeq ==
      Seq(0x66, 0x2e, 0x00, 0x7c, 0x02, 0x00, 0x00, 0xc1).map(_.toByte))
    assert(first.getAs[CSeq[Int]]("shape") == Seq(2, 2) && first.getAs[String]("dtype") == "F16")
    // written as is, read back through the read path as floats
    val dir = freshPath()
    ours.coalesce(1).write.format("safetensors").option("batch_size", "2").save(dir)
    val back = spark.read.format("safetensors").load(dir).collect()
    assert(back.length == 2)
    val t0 = back(0).getAs[CSeq[CSeq[Float]]]("t")
    assert(t0(0)(0) == 0.0999755859375f && t0(0)(1).isPosInfinity && t0(1)(0) == 1.1920929e-7f && t0(1)(1) == -2.5f)
  }

  test("st_to_array infers dtype and rank from arr_to_st, or takes them as arguments") {
    val schema = StructType(Seq(StructField("m", ArrayType(ArrayType(LongType)))))
    val df = spark.createDataFrame(spark.sparkContext.parallelize(Seq(Row(Seq(Seq(1L, 2L), Seq(3L, 4L)))), 1), schema)
    val nested = df.select(st_to_array(arr_to_st(col("m"))).as("v"))
    assert(nested.schema("v").dataType == ArrayType(ArrayType(LongType, false), false))
    assert(nested.first().getAs[CSeq[CSeq[Long]]](0) == Seq(Seq(1L, 2L), Seq(3L, 4L)))
    val asU8 = df.select(st_to_array(arr_to_st(col("m"), "U8"), "U8", 2).as("v"))
    assert(asU8.schema("v").dataType == ArrayType(ArrayType(ShortType, false), false))
    val flat = df.select(arr_to_st(col("m"), "BF16").as("t")).select(st_to_array(col("t")).as("v"))
    assert(flat.schema("v").dataType == ArrayType(FloatType, false))
    assert(flat.first().getAs[CSeq[Float]](0) == Seq(1f, 2f, 3f, 4f))
    // constant folding evaluates on the driver
    val folded = spark.range(1).select(st_to_array(arr_to_st(array(lit(1.5), lit(-1.0)), "F16")).as("v"))
    assert(folded.first().getAs[CSeq[Float]](0) == Seq(1.5f, -1f))
  }

  test("errors: unknown dtype at analysis, a value out of range and a wrong shape per row") {
    val df = floats(Seq(1.0, 300.0, 3.0))
    val unknown = intercept[AnalysisException](df.select(arr_to_st(col("x"), "F128")).schema)
    assert(unknown.getMessage.contains("arr_to_st: unknown dtype 'F128'; allowed: BOOL, U8"), unknown.getMessage)
    val range = intercept[Exception](df.select(arr_to_st(col("x"), "U8")).collect())
    assert(range.getMessage.contains("arr_to_st: value 300.0 at element 1 (f64) does not fit in U8 (allowed 0..=255)"),
      range.getMessage)
    val shape = intercept[Exception](df.select(arr_to_st(col("x"), "F32", Seq(2, 2))).collect())
    assert(shape.getMessage.contains("arr_to_st: shape [2, 2] holds 4 elements but the array has 3"), shape.getMessage)
    val notStruct = intercept[AnalysisException](df.select(st_to_array(col("x"))).schema)
    assert(notStruct.getMessage.contains("expected a Tensor Struct"), notStruct.getMessage)
  }
}
