package io.safetensors.spark.internal

/** Lookups in the options Spark passes a source or sink, whose keys arrive in any case. */
private[spark] object ConnectorOptions {
  val Path = "path"

  /** The value of `key`, matched case-insensitively. */
  def get(options: Map[String, String], key: String): Option[String] =
    options.collectFirst { case (k, v) if k.equalsIgnoreCase(key) => v }

  /** The `path` option. */
  def path(options: Map[String, String]): Option[String] = get(options, Path)

  /** `options` without `key` (in any case). */
  def without(options: Map[String, String], key: String): Map[String, String] =
    options.filterNot { case (k, _) => k.equalsIgnoreCase(key) }
}
