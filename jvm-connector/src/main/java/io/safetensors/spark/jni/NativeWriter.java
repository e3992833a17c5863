package io.safetensors.spark.jni;

/**
 * JNI surface of the Rust write engine (spec/jni.md documents every method: arguments, ownership,
 * threading, errors). Call {@link NativeLib#ensureLoaded()} before the first call.
 *
 * <p>Plan errors (options, schema, append compatibility, bad arguments) are thrown as
 * {@link IllegalArgumentException}; data, format and I/O errors as {@link SafetensorsException}.
 *
 * <p>A handle returned by {@link #open} is owned by exactly one Java object, which serialises the
 * calls on it and calls {@link #close} exactly once.
 */
public final class NativeWriter {
  private NativeWriter() {}

  /**
   * Driver, plan time: the validated plan as JSON. Nothing on disk is touched. With the text of
   * the dataset's latest manifest (an append to an existing dataset; else null) the plan takes the
   * settings the manifest records for the options left out and must fit the dataset; that text
   * is validated as {@link #checkManifest} does, the error naming {@code existingSourceOrNull}
   * (the file it was read from; null: dataset_manifest.json).
   */
  public static native String planWrite(String sparkSchemaJson, String optionsJson,
      boolean caseSensitive, String existingManifestJsonOrNull, String existingSourceOrNull);

  /**
   * Driver: the writer's user option names (a JSON array, spelled as in spec/options.md); a
   * catalog table sorts its options into read and write ones with it.
   */
  public static native String writeOptionNames();

  /** Task: opens a writer whose sealed shards go to {@code workDir} (a local directory). */
  public static native long open(String planJson, int partition, String workDir);

  /**
   * Task: writes one batch exported through the Arrow C Data Interface. Rust moves the structs'
   * contents out (leaving them released) and drops the imported data before returning, so the
   * caller may close its vectors right after. Returns a JSON array of the newly sealed shards
   * ({@code {"file", "local_path"}} each).
   */
  public static native String writeBatch(long handle, long arrowArrayAddr, long arrowSchemaAddr);

  /** Task: seals the last shard(s); JSON {"sealed":[{file, local_path}...],"report":TaskReport}. */
  public static native String finish(long handle);

  /** Task: deletes every file this writer produced. Idempotent for a live handle. */
  public static native void abort(long handle);

  /** Frees the handle (aborting first if neither finished nor aborted). Exactly once. */
  public static native void close(long handle);

  /** Driver, job commit: JSON {"manifest":{...},"rewrites":[{"file":..,"drop":[..]}]}: this
   *  write's manifest (its own shards only) and the lastWin shard rewrites to apply first. */
  public static native String commitJob(String planJson, String taskReportsJsonArray);

  /** Driver: throws SafetensorsException unless {@code manifestJson} is a valid manifest whose
   *  every shard name passes the trust rule (spec/dataset.md §5.4); the message names
   *  {@code source}, the file the text was read from ({@code dataset_manifest.json} or a
   *  {@code _manifest_log/} entry). */
  public static native void checkManifest(String manifestJson, String source);

  /** Driver, each commit attempt: this write's manifest (from commitJob) on top of the
   *  directory's latest committed one (null: none), appended or replacing it. Three texts:
   *  [0] JSON {"version": n, "superseded": ["shard names", ...], "retain": bool} (retain: the
   *  dataset's retention is not 0, §5.8.1), [1] the version's whole manifest (what
   *  dataset_manifest.json holds), [2] its {@code _manifest_log/} entry (what it changes, §5.10).
   *  The two texts are never inside JSON: at 100,000 shards the manifest is 27 MB.
   *  {@code replacementsJsonOrNull}: [{"old": shard name, "new": manifest shard entry or null}]:
   *  shards of the base an append replaces (lastWin across writes).
   *  {@code commitInfoJsonOrNull}: {"committed_at_ms", "commit_message", "app_id"} recorded in
   *  the version (spec/dataset.md §5.8), taken just before each attempt.
   *  An append that no longer fits the dataset throws IllegalArgumentException. */
  public static native String[] nextManifest(String baseManifestJsonOrNull, String writeManifestJson,
      boolean append, String replacementsJsonOrNull, String commitInfoJsonOrNull);

  /** Vacuum (spec/dataset.md §5.8.1): the plan of what the JVM listed. {@code requestJson}:
   *  {"log": [{"version", "source", "text", "mtime_ms"}], "latest", "latest_source", "shards":
   *  {name: bytes}, "index_parts": {name: bytes}, "retention": string or null,
   *  "allow_shorter_retention", "now_ms"}. Returns {"plan": {"base_version",
   *  "retention_seconds", "retained_versions", "shards": [{"name", "bytes"}], "index_parts":
   *  [...], "prune_versions"}, "files", "bytes"}. A bad retention or a retention shorter than the
   *  dataset's without the override throws IllegalArgumentException. */
  public static native String planVacuum(String requestJson);

  /** Vacuum: the vacuum version on top of {@code baseManifestJson}: {"manifest", "version"}. */
  public static native String vacuumManifest(String baseManifestJson, long files, long bytes,
      String appIdOrNull);

  /** Driver, streaming sink: whether the directory's latest committed manifest (null: none)
   *  records micro-batch {@code batchId} of query {@code queryId} as committed (its
   *  {@code stream_commits} entry is that id or later: the batch is a replay). spec/dataset.md §5.7. */
  public static native boolean streamBatchCommitted(String baseManifestJsonOrNull, String queryId,
      long batchId);

  /** Driver, streaming sink, each commit attempt: {@link #nextManifest} as an append that also
   *  records {@code batchId} as {@code queryId}'s last committed micro-batch, in the same manifest
   *  version. Throws SafetensorsException if the base already records that batch. */
  public static native String[] nextStreamManifest(String baseManifestJsonOrNull,
      String writeManifestJson, String replacementsJsonOrNull, String queryId, long batchId,
      String commitInfoJsonOrNull);

  /** Driver, KV: the keys of the shards in {@code runsJson} ([{"file", "part" (its index part, a
   *  local file), "existing", "partition", "shard"}]) merged from their sorted index parts
   *  (spec/dataset.md §6.1), holding no key in memory beyond one record batch per part. With
   *  duplicatesStrategy=fail a key twice (or a tensor name collision) throws
   *  SafetensorsException naming it and both shards; with lastWin returns [{"file", "keys",
   *  "count"}]: the shards that lose keys, each loser's keys in the JSON file "keys" written into
   *  {@code workDir}. */
  public static native String mergeKeys(String planJson, String runsJson, String workDir);

  /** Driver, KV lastWin: writes {@code outputPath} = input without the keys listed in
   *  {@code keysPath} (a mergeKeys answer), and its index part at {@code partPathOrNull}.
   *  Returns {"delete", "bytes", "samples", "num_tensors"}; delete: no key is left (nothing
   *  written). */
  public static native String rewriteShardKeys(String planJson, String inputPath, String outputPath,
      String outputFileName, String partPathOrNull, String keysPath);

  /** Driver: writes the index part of the dataset's shard {@code fileName} from its header text
   *  and file length at {@code partPath} (a local file). Returns its row count. */
  public static native long indexPartFromHeader(String planJson, String fileName, String headerJson,
      long fileLength, String partPath);

  /** The key column of a KV table that names none (spec/dataset.md §5.2, the Rust rule): the one
   *  of {@code stringColumnsJson} (a JSON array of the table's string columns, in order) that is
   *  not in {@code tensorColumnsJson} (the dataset's columns); none or several throw
   *  SafetensorsOptionsException saying which. */
  public static native String kvKeyColumn(String stringColumnsJson, String tensorColumnsJson);
}
