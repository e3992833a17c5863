package io.safetensors.spark.jni;

/**
 * Thrown by the native (Rust) engine for I/O and internal errors, including a Rust panic (message
 * starting with {@code "internal error (Rust panic): "}), and the base class of its format, dataset
 * and data errors ({@link SafetensorsFormatException}, {@link SafetensorsDatasetException},
 * {@link SafetensorsDataException}). Options errors are {@link SafetensorsOptionsException}, an
 * {@link IllegalArgumentException}; a wrong call from the JVM side a plain
 * {@link IllegalArgumentException}.
 *
 * <p>The Rust side constructs it through JNI with the {@code (String)} constructor; keep it.
 */
public class SafetensorsException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  public SafetensorsException(String message) {
    super(message);
  }

  public SafetensorsException(String message, Throwable cause) {
    super(message, cause);
  }
}
