package io.safetensors.spark.jni;

/**
 * JNI surface of a dataset's versions (spec/dataset.md §5.8; the rules are Rust's). The JVM lists
 * {@code _manifest_log/} through Hadoop and passes the entries as JSON
 * {@code [{"version": n, "modified_ms": ms, "text": manifest text or absent}]}. Stateless and
 * thread-safe; call {@link NativeLib#ensureLoaded()} first.
 */
public final class NativeVersions {
  private NativeVersions() {}

  /** The version to read: {@code versionAsOf} (entries' texts not needed) or
   *  {@code timestampAsOf} (every entry's text given), exactly one non-null. A bad value throws
   *  SafetensorsOptionsException; a version not in the log or a time before the first commit
   *  throws SafetensorsDatasetException naming it. */
  public static native long selectVersion(String entriesJson, String versionAsOfOrNull,
      String timestampAsOfOrNull);

  /** Where a follower given {@code startingTimestamp} begins (Spark's readStream,
   *  spec/reading.md §8): the oldest version committed at or after it, or one past the latest
   *  when every version is older; every entry's text given. A value that is not a time throws
   *  SafetensorsOptionsException naming the option. */
  public static native long startingVersion(String entriesJson, String startingTimestamp);

  /** Checks the shards a version lists against {@code foundJson} ({shard name: file size}, a
   *  missing shard absent): throws SafetensorsDatasetException naming the version and shard. */
  public static native void checkVersionShards(String manifestJson, long version,
      String foundJson);

  /** The history rows of the entries (every text given), a JSON array, oldest first. */
  public static native String history(String entriesJson);

  /** Whether the local dataset directory {@code localDir} has its own directory {@code name}
   *  ({@code _manifest_log}, {@code _tensor_index.parquet}): false when absent; a symbolic link
   *  or a non-directory there throws SafetensorsDatasetException naming it (spec/dataset.md
   *  §5.9: a dataset's own directories are never followed through a link). */
  public static native boolean checkOwnDir(String localDir, String name);

  /** Whether the local {@code localPath} is a directory that is not a symbolic link (a partition
   *  directory of a partitionBy root is one only then, spec/dataset.md §5.9). */
  public static native boolean isOwnSubdir(String localPath);

  /** Whether the local {@code localPath} is a regular file that is not a symbolic link: the only
   *  kind of file a vacuum deletes (spec/dataset.md §5.9). */
  public static native boolean isOwnFile(String localPath);

  /** The text of a local manifest, log entry or task report by the Rust rule (spec/dataset.md
   *  §5.9): a FIFO, socket or device is refused at once (SafetensorsDatasetException naming it),
   *  never waited on or read without end; at most 1 GiB. Null when the file does not exist. */
  public static native String readManifestFile(String localPath);
}
