package io.safetensors.spark.jni;

/**
 * JNI surface of the Rust read engine (spec/jni.md documents every method: arguments, ownership,
 * threading, errors). Call {@link NativeLib#ensureLoaded()} before the first call.
 *
 * <p>Malformed requests are thrown as {@link IllegalArgumentException}; format, I/O and data
 * errors as {@link SafetensorsException}, with a message naming the file (and tensor).
 *
 * <p>Driver side ({@link #headerLength}, {@link #validatedHeader}, {@link #describe},
 * {@link #plan}, {@link #indexEntries}) is stateless and thread-safe. A handle returned by {@link #open} is owned by
 * one Java object, which serialises the calls on it and calls {@link #close} exactly once.
 */
public final class NativeReader {
  private NativeReader() {}

  /** N (the header's byte length) from a file's first 8 bytes ({@code prefix} may be shorter
   *  when the file is), checked against the file length and the 100,000,000-byte cap. */
  public static native long headerLength(String file, byte[] prefix, long fileLength);

  /** Validates a file's first 8 + N bytes against its length; returns the header JSON text. */
  public static native String validatedHeader(String file, byte[] prefixAndHeader,
      long fileLength);

  /** Driver: layout and schema of a scan; JSON {"ready":{...}} or {"need_headers":[uri...]}.
   *  {@code manifestTextsOrNull}: the text of each of the request's {@code manifests}, in order,
   *  passed beside it instead of inside it (27 MB at 100,000 shards, never escaped into JSON);
   *  null: the request's own {@code "text"} fields. */
  public static native String describe(String requestJson, String[] manifestTextsOrNull);

  /** Driver: the input partitions; JSON {"ready":[PartitionSpec...]}, {"need_headers":[...]} or
   *  {"need_index":[dir...]} (see {@link #indexEntries}). {@code manifestTextsOrNull} as for
   *  {@link #describe}. */
  public static native String plan(String requestJson, String[] manifestTextsOrNull);

  /**
   * Driver: summarises a dataset directory's {@code _tensor_index.parquet} ({@code parquet}: the
   * whole file) for the pushed predicates ({@code predicatesJson}: a JSON array of
   * {"column","op","values"}); JSON {"files":{name:rows},"rows":[...]} to pass back as the
   * manifest's "index" after a {"need_index":[dir...]} answer. An invalid index throws
   * {@link SafetensorsException}.
   */
  public static native String indexEntries(String dir, byte[] parquet, String predicatesJson);

  /** Task: a reader for one PartitionSpec (JSON). */
  public static native long open(String partitionJson);

  public static native int unitCount(long handle);

  /** The URI of unit {@code unit}'s file. */
  public static native String unitFile(long handle, int unit);

  /** The planned length of unit {@code unit}'s file. */
  public static native long unitLength(long handle, int unit);

  /** Opens a unit on a local file: Rust validates the header and memory-maps the file. */
  public static native void openLocal(long handle, int unit, String path);

  /** Opens a unit from its file's first 8 + N bytes; the data comes through {@link #supply}. */
  public static native void openRemote(long handle, int unit, byte[] prefixAndHeader);

  /** Absolute byte ranges the next batch still needs, as [start0, end0, start1, end1, ...]
   *  (empty for a local file). */
  public static native long[] neededRanges(long handle);

  /** Bytes of the current unit's file starting at absolute offset {@code start}. */
  public static native void supply(long handle, long start, byte[] bytes);

  /**
   * Whether unit {@code unit}'s file must first be streamed whole through {@link #verifyUpdate}
   * and {@link #verifyFinish} (read option verify_checksums, a manifest entry with crc32c; a
   * local file is checked by {@link #openLocal} itself).
   */
  public static native boolean verifyNeeded(long handle, int unit);

  /** The next {@code length} bytes of the unit's whole file, in order from offset 0. */
  public static native void verifyUpdate(long handle, int unit, byte[] bytes, int length);

  /** The whole file was given: its size and CRC-32C must be the manifest's. */
  public static native void verifyFinish(long handle, int unit);

  /**
   * Rows of the next batch of the current unit, or -1 when the unit is done. A batch with
   * columns is moved into the given freshly allocated C Data structs (the caller imports and
   * later releases it); a batch without columns (count only) exports nothing.
   */
  public static native long nextBatch(long handle, long arrowArrayAddr, long arrowSchemaAddr);

  /** Header and data bytes this reader has read so far. */
  public static native long bytesRead(long handle);

  /** Units skipped because their file was corrupt when opened (ignoreCorruptFiles). */
  public static native long skipped(long handle);

  /** Frees the handle. Exactly once. */
  public static native void close(long handle);

  /** Driver, key lookup: one step in the index part of {@code shard} (spec/dataset.md §6.1), a
   *  file of {@code fileLength} bytes of which {@code data} holds the ranges {@code rangesJson}
   *  ([[start, length], ...], concatenated in that order). Answers {"need": [[start, length],
   *  ...]} (read those too and ask again; the first step can pass no ranges) or {"summary":
   *  IndexSummary} (the shard's row count and the rows the predicates keep). An invalid part is
   *  a SafetensorsException naming it. */
  public static native String indexPartLookup(String dir, String shard, long fileLength,
      String rangesJson, byte[] data, String predicatesJson);

  /** The index part's file name of shard {@code shard} (spec/dataset.md §6.1). */
  public static native String indexPartName(String shard);

  /** The {@code layout} read option's value by the engine's rule (trimmed, any case): its name;
   *  another value throws SafetensorsOptionsException naming the values allowed. */
  public static native String layoutOption(String given);

  /** The {@code layout} option's values, comma-separated (for messages). */
  public static native String layoutOptionNames();
}
