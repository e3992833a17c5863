package io.safetensors.spark.jni;

/**
 * JNI surface of the manifest log (spec/dataset.md §5.10; the rules are Rust's
 * {@code safetensors_spark_dataset::log}). The JVM lists and reads {@code _manifest_log/}
 * through Hadoop; this class says what a commit writes, what rebuilding a version reads next and
 * what a committer does after its entry exists. Stateless and thread-safe; call
 * {@link NativeLib#ensureLoaded()} first.
 */
public final class NativeLog {
  private NativeLog() {}

  /** The text of the log entry of {@code next} (a whole manifest) committed on
   *  {@code baseOrNull}: what the version adds and removes, and its own fields. */
  public static native String logEntry(String baseOrNull, String next);

  /** A commit attempt of an append (a streaming micro-batch's when {@code queryIdOrNull} is
   *  given, with {@code batchId}) of {@code writeManifestJson} (this write's manifest, from
   *  commitJob) on version {@code baseVersion}, from that version's own log entry
   *  {@code baseEntry} alone: two texts, {"version", "superseded": [], "retain"} and the entry to
   *  create, or {"replay": true} and "" when the base records the batch already. Null when that
   *  entry does not give the version's own fields (an older kind), or the write has no rows:
   *  commit on the whole manifest
   *  ({@link NativeWriter#nextManifest}). A write that does not fit the dataset throws as
   *  nextManifest does; {@code commitInfoJsonOrNull} as there. */
  public static native String[] appendOnHead(String baseEntry, long baseVersion,
      String writeManifestJson, String queryIdOrNull, long batchId, String commitInfoJsonOrNull);

  /** The whole manifest of {@code version}, committed with the entry {@code entry} on the
   *  version whose whole manifest is {@code baseManifest}. An entry that does not follow it
   *  throws SafetensorsDatasetException naming the entry. */
  public static native String applyEntry(String baseManifest, long version, String entry);

  /** Whether the committer of the version whose log entry is {@code entry} lists the log for
   *  its chores ({@link #afterCommit}): only when they may have work (a checkpoint version, a
   *  first commit, a base not read from a delta entry, {@code pruneEntries}).
   *  {@code baseEntryOrNull}: the text of the base version's own entry, when read. */
  public static native boolean choresNeedListing(String entry, String baseEntryOrNull,
      boolean pruneEntries);

  /** Rebuilding {@code version} from the log whose file names are {@code namesJson} (a JSON
   *  array), given the texts read so far ({@code readJson}: {name: text}): {@code {"read":
   *  [names]}} to read next, or {@code {"manifest": text}}, the version's whole manifest. A
   *  version that cannot be rebuilt throws SafetensorsDatasetException saying why. */
  public static native String rebuild(String namesJson, long version, String readJson);

  /** What the committer of {@code version} (its whole manifest {@code next}) does once its entry
   *  exists, given the log's listing ({@code [{"name", "modified_ms"}]}):
   *  {@code {"write_checkpoint": bool, "delete": [names]}}; {@code pruneEntries} for a dataset
   *  with retention 0 (nothing is kept for time travel). */
  public static native String afterCommit(String listingJson, long version, String next,
      boolean pruneEntries, long nowMs);

  /** Following the dataset (spec/dataset.md §5.12): what a reader that has read version
   *  {@code after} reads to reach version {@code upto}, from the log whose file names are
   *  {@code namesJson}, given the texts read so far ({@code readJson}: {name: text}):
   *  {@code {"read": [names]}} to read next, or {@code {"versions": [{"version", "operation",
   *  "committed_at_ms", "followed": "rows"|"nothing"|"skipped", "add": [shard records]}]}}. A
   *  version that removes rows throws SafetensorsDatasetException naming it and
   *  {@code skipOption}, unless {@code skipChanges}; a version that changes the columns, or one
   *  no longer in the log, throws too. */
  public static native String follow(String namesJson, long after, long upto, String readJson,
      boolean skipChanges, String skipOption);

  /** The manifest a follower reads a batch of followed shards with (spec/dataset.md §5.12):
   *  {@code baseManifest} (a version's whole manifest) listing only {@code shardsJson} (a JSON
   *  array of shard records as {@link #follow} gives them), sorted, totals recomputed. No shard,
   *  or one listed twice, throws SafetensorsDatasetException. */
  public static native String followManifest(String baseManifest, String shardsJson);
}
