package io.safetensors.spark.internal

import com.fasterxml.jackson.core.{JsonFactory, StreamReadConstraints}
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
}
