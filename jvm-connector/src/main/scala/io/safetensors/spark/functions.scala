package io.safetensors.spark

import org.apache.spark.sql.Column
import org.apache.spark.sql.functions.{array, call_function, lit}

/**
 * Column API of the tensor functions (spec/functions.md): calls of the SQL functions by name, so
 * they resolve in any session configured with [[SafetensorsExtensions]] (classic or Connect).
 * {{{
 *   import io.safetensors.spark.functions._
 *   df.select(arr_to_st(col("x"), "BF16", Seq(2, 3)).as("t"))
 *   df.select(st_to_array(col("t"), "BF16", 2))
 * }}}
 */
object functions {
  private def shapeLit(shape: Seq[Int]): Column =
    if (shape.isEmpty) array().cast("array<int>") else array(shape.map(d => lit(d)): _*)

  /** The Tensor Struct of a numeric array in its natural dtype and own shape. */
  def arr_to_st(values: Column): Column = call_function("arr_to_st", values)

  /** The Tensor Struct of a numeric array converted to `dtype`, in its own shape. */
  def arr_to_st(values: Column, dtype: String): Column =
    call_function("arr_to_st", values, lit(dtype))

  /** The Tensor Struct of a numeric array converted to `dtype`, reshaped to `shape`. */
  def arr_to_st(values: Column, dtype: String, shape: Seq[Int]): Column =
    call_function("arr_to_st", values, lit(dtype), shapeLit(shape))

  /** The peer connector's argument order: `(array, shape, dtype)`. */
  def arr_to_st(values: Column, shape: Seq[Int], dtype: String): Column =
    call_function("arr_to_st", values, shapeLit(shape), lit(dtype))

  /** Column arguments: `dtype` a string column, `shape` an array of integers (either order). */
  def arr_to_st(values: Column, dtypeOrShape: Column, shapeOrDtype: Column): Column =
    call_function("arr_to_st", values, dtypeOrShape, shapeOrDtype)

  /** The values of a Tensor Struct; element type and rank inferred or defaulted (float, flat). */
  def st_to_array(tensor: Column): Column = call_function("st_to_array", tensor)

  /** The values of a Tensor Struct as the natural Spark type of `dtype`, flat. */
  def st_to_array(tensor: Column, dtype: String): Column =
    call_function("st_to_array", tensor, lit(dtype))

  /** The values of a Tensor Struct as the natural Spark type of `dtype`, nested `rank` deep. */
  def st_to_array(tensor: Column, dtype: String, rank: Int): Column =
    call_function("st_to_array", tensor, lit(dtype), lit(rank))
}
