package io.safetensors.spark.internal

/** Lookups in the options Spark passes a source or sink, whose keys arrive in any case. */
private[spark] object ConnectorOptions {
  val Path = "path"

  /** The value of `key`, matched case-insensitively. */
  def get(options: Map[String, String], key: String): Option[String] =
    options.collectFirst { case (k, v) if k.equalsIgnoreCase(key) => v }

  /** A boolean option: `true` or `false` (any case, trimmed), `default` when absent. Any other
   *  value (`1`, `yes`) is refused naming the option (`what`, e.g. `option 'dry_run'`): never
   *  read as false. */
  def boolean(value: Option[String], what: String, default: Boolean): Boolean =
    value.map(_.trim.toLowerCase(java.util.Locale.ROOT)) match {
      case None => default
      case Some("true") => true
      case Some("false") => false
      case Some(_) => throw new IllegalArgumentException(
        s"safetensors: $what must be true or false, got '${value.get}'")
    }

  /** The `path` option. */
  def path(options: Map[String, String]): Option[String] = get(options, Path)

  /** `options` without `key` (in any case). */
  def without(options: Map[String, String], key: String): Map[String, String] =
    options.filterNot { case (k, _) => k.equalsIgnoreCase(key) }
}
