package io.safetensors.spark.jni;

/**
 * A file breaks the safetensors format (spec/format.md), or does not hold what the scan planned
 * from its header.
 *
 * <p>Thrown by the native (Rust) engine, which chooses the class from its error variant
 * (rust-core/jni/src/error.rs, spec/jni.md §1); it constructs it through JNI with the
 * {@code (String)} constructor: keep it.
 */
public class SafetensorsFormatException extends SafetensorsException {
  private static final long serialVersionUID = 1L;

  public SafetensorsFormatException(String message) {
    super(message);
  }
}
