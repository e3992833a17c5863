package io.safetensors.spark.jni;

/**
 * JNI surface of the tensor functions {@code arr_to_st} and {@code st_to_array} (spec/jni.md §6,
 * spec/functions.md). Call {@link NativeLib#ensureLoaded()} before the first call. Stateless and
 * thread-safe.
 *
 * <p>Values cross as little-endian bytes of a Spark element type ({@code "boolean"},
 * {@code "byte"}, {@code "short"}, {@code "integer"}, {@code "long"}, {@code "float"},
 * {@code "double"}; a boolean is one byte, 0 or 1). Every error is an
 * {@link IllegalArgumentException} whose message names the value, the shape or the dtype.
 */
public final class NativeTensorFunctions {
  private NativeTensorFunctions() {}

  /**
   * {@code values} (row-major elements of {@code elementType}) converted to {@code dtype}
   * (case-insensitive, writable dtypes only) exactly as the writer converts them, after checking
   * that {@code shape} holds exactly that many elements. Returns the tensor's bytes.
   */
  public static native byte[] encode(byte[] values, String elementType, String dtype, long[] shape);

  /**
   * A Tensor Struct's {@code data} of {@code dtype} (exact name) and {@code shape}, decoded as the
   * read path decodes it and widened exactly to {@code elementType}. Returns the elements'
   * little-endian bytes, row-major.
   */
  public static native byte[] decode(byte[] data, String dtype, long[] shape, String elementType);

  /** The canonical name of a dtype argument ({@code "bf16"} gives {@code "BF16"}). */
  public static native String writableDtype(String name);

  /** The writer's natural dtype of a Spark element type ({@code "float"} gives {@code "F32"}). */
  public static native String naturalDtype(String elementType);

  /** The Spark element type a writable dtype reads back as ({@code "U8"} gives {@code "short"}). */
  public static native String elementType(String dtype);
}
