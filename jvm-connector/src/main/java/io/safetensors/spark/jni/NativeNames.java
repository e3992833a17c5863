package io.safetensors.spark.jni;

/**
 * The names of a dataset directory (spec/dataset.md §1, §5.3, §6.1) and the commit bound, from
 * their one home in Rust ({@code safetensors_spark_dataset::names}): the connector builds and
 * parses every name through this class, never with a copy of the rule. The constants are read
 * once, when the class is initialized (which loads the native library). Thread-safe.
 */
public final class NativeNames {
  private NativeNames() {}

  static {
    NativeLib.ensureLoaded();
  }

  /** {@code dataset_manifest.json}: the manifest every reader looks for. */
  public static final String MANIFEST_FILE_NAME = constant("MANIFEST_FILE_NAME");
  /** {@code _manifest_log}: one entry per committed version. */
  public static final String MANIFEST_LOG_DIR = constant("MANIFEST_LOG_DIR");
  /** {@code _tensor_index.parquet}: the tensor index's directory of parts. */
  public static final String INDEX_DIR_NAME = constant("INDEX_DIR_NAME");
  /** {@code .safetensors}: the ending of every shard file's name. */
  public static final String SHARD_FILE_EXTENSION = constant("SHARD_FILE_EXTENSION");
  /** KV mode's separator between key and column when a write gives none. */
  public static final String DEFAULT_KV_SEPARATOR = constant("DEFAULT_KV_SEPARATOR");
  /** How many times a commit is tried on top of newer versions before it fails. */
  public static final int MAX_COMMIT_ATTEMPTS = maxCommitAttempts();

  /** One of the constants above by its Rust name; another name throws IllegalArgumentException
   *  listing them. */
  public static native String constant(String which);

  public static native int maxCommitAttempts();

  /** Log entries a retention-0 commit always keeps behind the newest (spec/dataset.md §5.10). */
  public static final long LOG_KEPT_VERSIONS = logKeptVersions();

  public static native long logKeptVersions();

  /** The {@code _manifest_log/} checkpoint of {@code version} (at least 0). */
  public static native String checkpointFileName(long version);

  /** The version of a checkpoint's name, -1 for another name; 20 digits beyond the largest
   *  version throw SafetensorsDatasetException naming it. */
  public static native long parseCheckpointFileName(String name);

  /** The {@code _manifest_log/} entry of {@code version} (at least 0). */
  public static native String manifestLogFileName(long version);

  /** The version of a {@code _manifest_log/} entry's name, -1 for a name that is no entry; a name
   *  of 20 digits beyond the largest version throws SafetensorsDatasetException naming it. */
  public static native long parseManifestLogFileName(String name);

  /** The index part of a manifest version (the index layout before per-shard parts). */
  public static native String indexPartFileName(long version);

  /** The version of an {@link #indexPartFileName} name, -1 for another name. */
  public static native long parseIndexPartFileName(String name);

  /** Whether a directory entry's name is hidden (starts with {@code _} or {@code .}): never a
   *  shard, a partition directory or data. */
  public static native boolean isHiddenName(String name);

  /** Whether a listed file's name is a shard's: {@code *.safetensors}, not hidden. */
  public static native boolean isShardFileName(String name);

  /** The partition of one of this connector's shard names, -1 for another name. */
  public static native long shardFilePartition(String name);

  /** The name of the copy a write makes of the existing shard {@code old} it rewrites: the old
   *  partition, {@code copy} (distinct for each shard one commit rewrites) as the shard number,
   *  and the rewriting write's id. */
  public static native String rewrittenShardFileName(String old, int copy, String writeId);
}
