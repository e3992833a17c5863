package io.safetensors.spark.jni;

/**
 * An option, a schema or an append that cannot be honoured (a write's plan, an append whose settings
 * conflict with the dataset's). An {@link IllegalArgumentException}, as every bad option is.
 *
 * <p>Thrown by the native (Rust) engine, which chooses the class from its error variant
 * (rust-core/jni/src/error.rs, spec/jni.md §1); it constructs it through JNI with the
 * {@code (String)} constructor: keep it.
 */
public class SafetensorsOptionsException extends IllegalArgumentException {
  private static final long serialVersionUID = 1L;

  public SafetensorsOptionsException(String message) {
    super(message);
  }
}
