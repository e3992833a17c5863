package io.safetensors.spark.internal

import com.fasterxml.jackson.core.{JsonFactory, JsonToken, StreamReadConstraints}
import com.fasterxml.jackson.databind.ObjectMapper

/**
 * The connector's one JSON mapper. The engine's answers carry whole manifests as JSON strings
 * (the next manifest of a commit, a rebuilt version, a vacuum's checkpoint): at 100,000 shards
 * one is over 20 million characters, Jackson's default bound on a string (2.15+), which failed
 * appends, vacuums and compactions of such datasets. Manifests are bounded by the engine
 * (1 GiB, `own::MAX_MANIFEST_BYTES`), so strings here are not bounded again. Thread-safe.
 */
private[spark] object Json {
  val mapper: ObjectMapper = {
    val factory = new JsonFactory()
    factory.setStreamReadConstraints(StreamReadConstraints.builder().maxStringLength(Int.MaxValue).build())
    new ObjectMapper(factory)
  }

  /** A top-level number field of the JSON object `text`, read without building its tree (a
   *  manifest of 100,000 shards is tens of MB: its arrays and objects are skipped, not parsed);
   *  None when `text` is not an object or has no such number. */
  def topLevelLong(text: String, field: String): Option[Long] = {
    val p = mapper.getFactory.createParser(text)
    try {
      if (p.nextToken() != JsonToken.START_OBJECT) return None
      while (p.nextToken() == JsonToken.FIELD_NAME) {
        val name = p.currentName()
        val t = p.nextToken()
        if (name == field) return if (t == JsonToken.VALUE_NUMBER_INT) Some(p.getLongValue) else None
        p.skipChildren()
      }
      None
    } finally p.close()
  }

  /** The string field `field` of each element of the top-level array `array` of the JSON object
   *  `text` (a manifest's shard names), read without building its tree. */
  def topLevelArrayStrings(text: String, array: String, field: String): Seq[String] = {
    val out = Seq.newBuilder[String]
    val p = mapper.getFactory.createParser(text)
    try {
      if (p.nextToken() != JsonToken.START_OBJECT) return Seq.empty
      while (p.nextToken() == JsonToken.FIELD_NAME) {
        val name = p.currentName()
        val t = p.nextToken()
        if (name == array && t == JsonToken.START_ARRAY) {
          while (p.nextToken() == JsonToken.START_OBJECT) {
            while (p.nextToken() == JsonToken.FIELD_NAME) {
              val f = p.currentName()
              val v = p.nextToken()
              if (f == field && v == JsonToken.VALUE_STRING) out += p.getText
              else p.skipChildren()
            }
          }
        } else p.skipChildren()
      }
      out.result()
    } finally p.close()
  }
}
