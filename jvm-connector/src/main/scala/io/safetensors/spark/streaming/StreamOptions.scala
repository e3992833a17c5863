package io.safetensors.spark.streaming

import scala.util.Try

import io.safetensors.spark.internal.{ConnectorOptions, Json}
import org.apache.spark.network.util.JavaUtils
import org.apache.spark.sql.connector.read.streaming.Offset

/**
 * The options of `spark.readStream.format("safetensors")` (spec/reading.md §8), checked when the
 * stream is defined: a bad value is an error naming the option and what it takes.
 *
 * @param startingVersion `Some(None)`: `latest` (only versions committed after the query
 *                        starts); `Some(Some(n))`: the changes from version n on (inclusive).
 * @param startingTimestamp the changes from the first version committed at or after this time.
 * @param maxFilesPerTrigger the most shards one micro-batch reads ([[StreamOptions.DefaultMaxFiles]]).
 * @param maxBytesPerTrigger the most shard bytes one micro-batch reads (a shard larger than it is
 *                           read alone); `None`: no byte limit.
 * @param skipChangeCommits pass over versions that remove rows (an overwrite, a DELETE) instead
 *                          of failing on them (spec/dataset.md §5.12).
 */
private[spark] final case class StreamOptions(
    startingVersion: Option[Option[Long]] = None,
    startingTimestamp: Option[String] = None,
    maxFilesPerTrigger: Int = StreamOptions.DefaultMaxFiles,
    maxBytesPerTrigger: Option[Long] = None,
    skipChangeCommits: Boolean = false) {
  /** Whether the stream starts where an option says (not at the latest snapshot). */
  def startGiven: Boolean = startingVersion.isDefined || startingTimestamp.isDefined
}

private[spark] object StreamOptions {
  val StartingVersion = "startingVersion"
  val StartingTimestamp = "startingTimestamp"
  val MaxFiles = "maxFilesPerTrigger"
  val MaxBytes = "maxBytesPerTrigger"
  /** Delta Lake's name for the same choice (spec/dataset.md §5.12). */
  val SkipChangeCommits = "skipChangeCommits"

  val Keys: Seq[String] = Seq(StartingVersion, StartingTimestamp, MaxFiles, MaxBytes, SkipChangeCommits)

  /** Shards per micro-batch when `maxFilesPerTrigger` is not given (Delta Lake's default). */
  val DefaultMaxFiles: Int = 1000

  /** `base` with the readStream options `o` gives (keys lower-cased) in place of its own: a
   *  catalog table's options, then those of the `readStream.option(...).table(...)` reading it. */
  def overlay(base: StreamOptions, o: Map[String, String]): StreamOptions = {
    def has(key: String): Boolean = o.contains(key.toLowerCase)
    if (!Keys.exists(has)) base
    else {
      val p = parse(o)
      val start = has(StartingVersion) || has(StartingTimestamp)
      StreamOptions(
        if (start) p.startingVersion else base.startingVersion,
        if (start) p.startingTimestamp else base.startingTimestamp,
        if (has(MaxFiles)) p.maxFilesPerTrigger else base.maxFilesPerTrigger,
        if (has(MaxBytes)) p.maxBytesPerTrigger else base.maxBytesPerTrigger,
        if (has(SkipChangeCommits)) p.skipChangeCommits else base.skipChangeCommits)
    }
  }

  /** The readStream options among `o` (keys lower-cased, as ReadOptions.parse has them). */
  def parse(o: Map[String, String]): StreamOptions = {
    def get(key: String): Option[String] = o.get(key.toLowerCase)
    val version = get(StartingVersion).map { v =>
      v.trim.toLowerCase match {
        case "latest" => None
        case s => Some(Try(s.toLong).toOption.filter(_ >= 1).getOrElse(throw new IllegalArgumentException(
          s"safetensors: option '$StartingVersion' must be 'latest' or a version (an integer ≥ 1, " +
            s"see SafetensorsDataset.history), got '$v'")))
      }
    }
    val timestamp = get(StartingTimestamp)
    if (version.isDefined && timestamp.isDefined) {
      throw new IllegalArgumentException(
        s"safetensors: give one of the options '$StartingVersion' and '$StartingTimestamp', not both")
    }
    if ((version.isDefined || timestamp.isDefined) &&
        (get("versionAsOf").isDefined || get("timestampAsOf").isDefined)) {
      throw new IllegalArgumentException(
        "safetensors: options 'versionAsOf' and 'timestampAsOf' choose the version of a batch " +
          s"read; a readStream starts with '$StartingVersion' or '$StartingTimestamp': give one of " +
          "those only")
    }
    val maxFiles = get(MaxFiles).map { v =>
      Try(v.trim.toInt).toOption.filter(_ >= 1).getOrElse(throw new IllegalArgumentException(
        s"safetensors: option '$MaxFiles' must be an integer in [1, ${Int.MaxValue}] (shards per " +
          s"micro-batch), got '$v'"))
    }.getOrElse(DefaultMaxFiles)
    val maxBytes = get(MaxBytes).map { v =>
      Try(JavaUtils.byteStringAsBytes(v.trim)).toOption.filter(_ >= 1).getOrElse(
        throw new IllegalArgumentException(s"safetensors: option '$MaxBytes' must be a positive " +
          s"size in bytes, optionally with a unit (e.g. 1048576, 512m, 10g), got '$v'"))
    }
    StreamOptions(version, timestamp, maxFiles, maxBytes,
      ConnectorOptions.boolean(get(SkipChangeCommits), s"option '$SkipChangeCommits'", default = false))
  }
}

/**
 * A readStream offset, checkpointed by Spark as JSON: every shard before the position has been
 * read. The shards of a stream are, in order: with `snapshot`, those of version `version`'s whole
 * manifest (the snapshot the stream started from), sorted by name; then, for each later version,
 * the shards it added, sorted by name (spec/dataset.md §5.12). `index` is the next shard's place
 * in its version's list; a version read whole is written as the next version at index 0, so one
 * position has one JSON text.
 */
private[spark] final case class StreamOffset(version: Long, index: Long, snapshot: Boolean)
    extends Offset {
  override def json(): String =
    s"""{"sourceVersion":${StreamOffset.SourceVersion},"version":$version,"index":$index,"snapshot":$snapshot}"""

  /** Whether this position comes before `o` (a snapshot's shards before the next version's). */
  def before(o: StreamOffset): Boolean =
    version < o.version || (version == o.version && index < o.index)
}

private[spark] object StreamOffset {
  /** The offset format; a checkpoint of a newer format is refused, never misread. */
  val SourceVersion = 1

  def parse(json: String): StreamOffset = {
    val n = Try(Json.mapper.readTree(json)).toOption.filter(_.isObject).getOrElse(
      throw new IllegalArgumentException(s"safetensors: a readStream offset is a JSON object, got: $json"))
    val format = n.path("sourceVersion").asInt(-1)
    if (format != SourceVersion || !n.path("version").canConvertToLong || !n.path("index").canConvertToLong ||
        !n.path("snapshot").isBoolean) {
      throw new IllegalArgumentException(
        s"safetensors: the checkpoint's readStream offset $json is not one this connector writes " +
          s"(sourceVersion $SourceVersion with version, index and snapshot); was it written by " +
          "another source or a newer connector?")
    }
    StreamOffset(n.get("version").asLong(), n.get("index").asLong(), n.get("snapshot").asBoolean())
  }
}
