package io.safetensors.spark.jni;

/**
 * JNI surface of compaction (spec/dataset.md §5.8.2; the rules are the Rust dataset crate's
 * {@code compaction.rs}). Call {@link NativeLib#ensureLoaded()} before the first call. Bad
 * requests throw {@link IllegalArgumentException}; data, format and I/O errors
 * {@link SafetensorsException}.
 */
public final class NativeCompaction {
  private NativeCompaction() {}

  /** Driver: the plan of a compaction of the latest manifest. {@code requestJson}:
   *  {"batch_size": n or null, "target_shard_size_mb": n or null, "write_id": uuid}. Returns the
   *  plan: {"base_version", "layout", "write_id", "batch_size", "target_bytes", "replaced":
   *  [names], "outputs": [{"name", "partition", "inputs": [{"shard", "start", "end"}],
   *  "samples", "padded"}], "rows", "replaced_bytes"}. */
  public static native String planCompaction(String latestManifestJson, String requestJson);

  /** Task: writes output {@code output} of the plan into the local directory {@code workDir}
   *  from its input shards there (each checked against the base manifest: size, CRC-32C,
   *  header), and its index part ({@code <stem>.parquet}) when {@code indexed}. Returns the new
   *  shard's manifest entry (JSON). */
  public static native String compactShard(String baseManifestJson, String planJson, int output,
      String workDir, boolean indexed);

  /** Driver: what each output's task is given, [{"base", "plan"}]: the base manifest listing
   *  only that output's input shards and the plan of that output alone, so that a task parses
   *  what it merges, not the whole dataset; the task calls {@link #compactShard} on them with
   *  output 0. */
  public static native String compactionTasks(String baseManifestJson, String planJson);

  /** Driver, each commit attempt: the compaction version on top of the latest manifest:
   *  {"manifest", "version", "retain"} (retain: the replaced shards stay for vacuum). Throws
   *  SafetensorsException naming the version that removed a shard the plan replaces
   *  ({@code logJson}: [{"version", "text"}] of the log entries after the plan's base). */
  public static native String compactionManifest(String currentManifestJson, String planJson,
      String newShardsJson, String commitInfoJson, String logJson);

  /** Driver: the plan of a delete (spec/dataset.md §5.11) of the latest manifest, in the form of
   *  a compaction plan with {@code "operation": "delete"} (run with {@link #compactShard} and
   *  committed with {@link #compactionManifest} like a compaction's). {@code requestJson}:
   *  {"write_id": uuid, "delete": {shard: [row, ...]}, "keep": {shard: [[start, end], ...]}}:
   *  rows to delete, or (a copy-on-write DELETE) the runs of rows to keep of each shard read;
   *  or {"all": true}: every row; or (KV layout) {"keys": [key, ...], "headers": {shard:
   *  {"header": text as stored, "length": file bytes}}}: the keys to delete from the candidate
   *  shards given (those that may hold one; no other listed shard is examined). */
  public static native String planDelete(String latestManifestJson, String requestJson);

  /** Driver: the tensor names (JSON array) of the keys {@code keysJson} (JSON array) in the KV
   *  dataset whose latest manifest is given: what a delete by keys looks up to find its
   *  candidate shards. Throws for a batch dataset or an empty list. */
  public static native String deleteKeyTensors(String latestManifestJson, String keysJson);

  /** Whether the shard header {@code headerJson} (of a file of {@code fileLength} bytes) names
   *  one of the tensors in {@code namesJson} (a JSON array), by the format's header rule; a
   *  header that does not parse is kept (true), for the delete's plan to refuse by name. */
  public static native boolean headerHoldsAny(String headerJson, long fileLength, String namesJson);
}
