package io.safetensors.spark.jni;

/**
 * A {@code dataset_manifest.json}, a manifest log entry or a tensor index part breaks the dataset
 * layout (spec/dataset.md), or a shard it lists is missing.
 *
 * <p>Thrown by the native (Rust) engine, which chooses the class from its error variant
 * (rust-core/jni/src/error.rs, spec/jni.md §1); it constructs it through JNI with the
 * {@code (String)} constructor: keep it.
 */
public class SafetensorsDatasetException extends SafetensorsException {
  private static final long serialVersionUID = 1L;

  public SafetensorsDatasetException(String message) {
    super(message);
  }
}
