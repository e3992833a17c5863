package io.safetensors.spark.jni;

/**
 * A row the write cannot store: a value, a shape, a duplicate key or tensor name (the message names
 * the column and row).
 *
 * <p>Thrown by the native (Rust) engine, which chooses the class from its error variant
 * (rust-core/jni/src/error.rs, spec/jni.md §1); it constructs it through JNI with the
 * {@code (String)} constructor: keep it.
 */
public class SafetensorsDataException extends SafetensorsException {
  private static final long serialVersionUID = 1L;

  public SafetensorsDataException(String message) {
    super(message);
  }
}
