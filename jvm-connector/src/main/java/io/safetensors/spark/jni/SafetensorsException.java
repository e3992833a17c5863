package io.safetensors.spark.jni;

/**
 * Thrown by the native (Rust) engine for format, I/O and internal errors, including a Rust panic
 * (message starting with {@code "internal error (Rust panic): "}). Invalid arguments are reported
 * as {@link IllegalArgumentException} instead.
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
