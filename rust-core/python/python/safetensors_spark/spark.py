"""PySpark set-up: a session builder with the safetensors connector jar on ``spark.jars``; for
Spark Connect, the command that starts a Connect server with the jar and a check that a session's
server has it (spec/python.md §8)."""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ._errors import SafetensorsSparkError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_JAR_PATTERN = "safetensors-spark-*.jar"
#: a SparkSession builder (classic or Spark Connect): configure returns the one it is given
_Builder = TypeVar("_Builder", bound=Any)
#: a session, classic or Spark Connect: check_session returns the one it is given
_Session = TypeVar("_Session", bound=Any)


def find_jar() -> str:
    """The connector jar: the one bundled in this package (``safetensors_spark/jars/``), else, in
    a source checkout, the one ``mvn package`` left in ``jvm-connector/target/``."""
    here = Path(__file__).resolve().parent
    places = [here / "jars"]
    for parent in here.parents:
        if (parent / "jvm-connector" / "pom.xml").exists():
            places.append(parent / "jvm-connector" / "target")
            break
    for place in places:
        jars = sorted(j for j in glob.glob(str(place / _JAR_PATTERN))
                      if not j.endswith(("-sources.jar", "-javadoc.jar")) and "original-" not in os.path.basename(j))
        if len(jars) == 1:
            return jars[0]
        if len(jars) > 1:
            raise SafetensorsSparkError(f"more than one connector jar in {place}: {jars}; keep one")
    raise SafetensorsSparkError(
        "no safetensors-spark connector jar found (looked in "
        + ", ".join(str(p) for p in places)
        + "); build it with `mvn -f jvm-connector/pom.xml package -DskipTests` or install a "
        "safetensors-spark wheel that bundles it, or pass jar=<path>")


EXTENSIONS_CLASS = "io.safetensors.spark.SafetensorsExtensions"


def _is_connect(builder: Any) -> bool:
    """Whether ``builder`` makes a Spark Connect session (``.remote(url)`` or ``SPARK_REMOTE``)."""
    options = getattr(builder, "_options", {})
    return "spark.remote" in options or "SPARK_REMOTE" in os.environ


def configure(builder: _Builder, jar: str | os.PathLike[str] | None = None) -> _Builder:
    """Returns ``builder`` with the connector jar added to ``spark.jars`` and the connector's
    ``spark.sql.extensions`` class (the SQL functions ``arr_to_st``/``st_to_array``, SQL on files)
    added to that setting (both keep what is already configured there), e.g.
    ``configure(SparkSession.builder).master("local[2]").getOrCreate()``.

    A Spark Connect builder (``SparkSession.builder.remote("sc://…")``) is returned unchanged: the
    connector runs in the Connect server, whose classpath and extensions are fixed when it starts
    (:func:`connect_server_command`), and a client cannot set them there. Call
    :func:`check_session` on the session to verify the server has the connector."""
    if _is_connect(builder):
        return builder
    jar = os.fspath(jar) if jar is not None else find_jar()
    if not os.path.isfile(jar):
        raise SafetensorsSparkError(f"connector jar {jar} does not exist")
    existing = getattr(builder, "_options", {}).get("spark.jars")
    jars = [j for j in (existing or "").split(",") if j]
    if jar not in jars:
        jars.append(jar)
    exts = [e for e in (getattr(builder, "_options", {}).get("spark.sql.extensions") or "").split(",") if e]
    if EXTENSIONS_CLASS not in exts:
        exts.append(EXTENSIONS_CLASS)
    return builder.config("spark.jars", ",".join(jars)).config("spark.sql.extensions", ",".join(exts))


CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def connect_server_command(jar: str | os.PathLike[str] | None = None, *, host: str = "127.0.0.1", port: int = 15002,
                           master: str = "local[*]", conf: Mapping[str, str] | None = None) -> list[str]:
    """The command (argument list) that starts a Spark Connect server with the connector jar:
    pyspark's ``spark-submit`` running ``SparkConnectServer`` (its jar ships with pyspark 4.x)
    with ``--jars <jar>`` and the connector's ``spark.sql.extensions`` class, listening on ``host``:``port``. Run it with ``subprocess``; clients then
    connect with ``SparkSession.builder.remote(f"sc://{host}:{port}")``."""
    jar = os.fspath(jar) if jar is not None else find_jar()
    if not os.path.isfile(jar):
        raise SafetensorsSparkError(f"connector jar {jar} does not exist")
    import pyspark

    home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    submit = os.path.join(home, "bin", "spark-submit")
    if not os.path.isfile(submit):
        raise SafetensorsSparkError(f"no spark-submit in {home} (SPARK_HOME or the pyspark package)")
    settings = {
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(int(port)),
        "spark.pyspark.python": sys.executable,
        "spark.sql.extensions": EXTENSIONS_CLASS,
        **(conf or {}),
    }
    args = [submit, "--class", CONNECT_SERVER_CLASS, "--name", "Spark Connect server",
            "--master", master, "--jars", jar]
    for k, v in settings.items():
        args += ["--conf", f"{k}={v}"]
    return args + ["spark-internal"]


def check_session(spark: _Session) -> _Session:
    """Raises :class:`SafetensorsSparkError` unless ``spark`` (a classic or a Spark Connect
    session) resolves ``format("safetensors")``: for Connect, unless the server was started with
    the connector jar. Returns ``spark``."""
    probe = "/nonexistent-safetensors-spark-probe"
    try:
        spark.read.format("safetensors").load(probe).schema
    except Exception as e:  # the server's error, as the client raises it
        text = str(e)
        if "DATA_SOURCE_NOT_FOUND" in text:
            if _session_is_connect(spark):
                fix = ("start the Connect server with the jar: safetensors_spark.spark."
                       "connect_server_command() gives the command, or `start-connect-server.sh "
                       "--jars <safetensors-spark jar>`")
                where = "the Spark Connect server"
            else:
                fix = "build the session with safetensors_spark.spark.configure(SparkSession.builder)"
                where = "this session"
            raise SafetensorsSparkError(
                f"{where} has no safetensors connector (format('safetensors') is unknown there); "
                + fix) from None
        if "safetensors: path does not exist" not in text:
            raise  # not the connector's answer to the probe (e.g. the server is unreachable)
    return spark


def _session_is_connect(spark: Any) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


def history(spark: SparkSession, path: str | os.PathLike[str]) -> DataFrame:
    """The dataset's versions as a Spark DataFrame, oldest first (spec/dataset.md §5.8): the
    connector's ``SafetensorsDataset.history`` (classic sessions; with Spark Connect use
    :func:`safetensors_spark.history`, which needs no session)."""
    if _session_is_connect(spark):
        raise SafetensorsSparkError("history(spark, path) needs a classic SparkSession; with Spark Connect "
                                    "use safetensors_spark.history(path) (a list of dicts)")
    from pyspark.sql import DataFrame
    jvm: Any = spark._jvm
    jdf = jvm.io.safetensors.spark.SafetensorsDataset.history(spark._jsparkSession, str(path))
    return DataFrame(jdf, spark)


def compact(spark: SparkSession, path: str | os.PathLike[str], **options: Any) -> DataFrame:
    """Compacts the dataset at ``path`` (any path Spark writes to: local, HDFS, ``s3a://``) through
    the connector's ``io.safetensors.spark.Compaction`` (spec/dataset.md §5.8.2): small shards
    merged into full ones as one ``compaction`` version. ``options``: ``batch_size``,
    ``target_shard_size_mb``, ``commit_message``, ``dry_run``. Returns a DataFrame of one row
    (``version``, ``shards_replaced``, ``shards_written``, ``rows``, ``plan``). Classic sessions."""
    if _session_is_connect(spark):
        raise SafetensorsSparkError("compact(spark, path) needs a classic SparkSession; with a local "
                                    "path use safetensors_spark.compact(path)")
    from pyspark.sql import DataFrame
    jvm: Any = spark._jvm
    jmap = jvm.java.util.HashMap()
    for k, v in options.items():
        # a bool is passed as true/false; any other value as its text, which the connector checks
        # (dry_run=1 is refused there naming the option, never run as a real compaction)
        jmap.put(str(k), str(v).lower() if isinstance(v, bool) else str(v))
    jdf = jvm.io.safetensors.spark.Compaction.compact(spark._jsparkSession, str(path), jmap)
    return DataFrame(jdf, spark)


def delete(spark: SparkSession, path: str | os.PathLike[str], condition: str,
           commit_message: str | None = None) -> DataFrame:
    """Deletes the rows of the dataset at ``path`` (any path Spark reads: local, HDFS, ``s3a://``; a
    dataset or a ``partitionBy`` root) for which ``condition`` (a SQL expression over its columns,
    partition columns and the hidden provenance columns ``_file``, ``_row_index``,
    ``_added_version``) is true: copy-on-write, one ``delete`` version per dataset directory
    changed (spec/dataset.md §5.11); the connector's ``SafetensorsDataset.delete``, the same as SQL
    ``DELETE FROM``. Returns one row per directory (``version``, ``rows_removed``,
    ``shards_replaced``, ``shards_written``). Classic sessions."""
    if _session_is_connect(spark):
        raise SafetensorsSparkError("delete(spark, path, condition) needs a classic SparkSession; with Spark "
                                    "Connect run spark.sql(\"DELETE FROM safetensors.`path` WHERE ...\")")
    if not isinstance(condition, str) or not condition.strip():
        raise ValueError(f"delete: condition={condition!r}: expected a non-empty SQL expression")
    if commit_message is not None and not isinstance(commit_message, str):
        raise ValueError(f"delete: commit_message={commit_message!r}: expected a string or None")
    from pyspark.sql import DataFrame
    jvm: Any = spark._jvm
    jdf = jvm.io.safetensors.spark.SafetensorsDataset.delete(spark._jsparkSession, str(path), condition,
                                                             commit_message)
    return DataFrame(jdf, spark)


def delete_keys(spark: SparkSession, path: str | os.PathLike[str], keys: list[str] | tuple[str, ...],
                commit_message: str | None = None) -> DataFrame:
    """Deletes ``keys`` from the KV dataset at ``path`` (any path Spark reads: local, HDFS, ``s3a://``;
    a dataset or a ``partitionBy`` root): copy-on-write, the shards holding a key are rewritten
    without its tensors, one ``delete`` version per dataset directory changed, the tensor index
    kept right (spec/dataset.md §5.11); keys the dataset does not hold are ignored. The connector's
    ``SafetensorsDataset.deleteKeys``. Returns one row per directory holding a key (``version``,
    ``rows_removed``, ``shards_replaced``, ``shards_written``), as :func:`delete`. Classic sessions;
    for a local path without a session use :func:`safetensors_spark.delete_keys`."""
    if _session_is_connect(spark):
        raise SafetensorsSparkError("delete_keys(spark, path, keys) needs a classic SparkSession; with Spark "
                                    "Connect use safetensors_spark.delete_keys(path, keys) on a local path")
    if isinstance(keys, (str, bytes)) or not isinstance(keys, (list, tuple)):
        raise ValueError(f"delete_keys: keys={keys!r}: expected a list of key strings")
    if not keys:
        raise ValueError("delete_keys: the list of keys is empty; give at least one key")
    for i, k in enumerate(keys):
        if not isinstance(k, str):
            raise ValueError(f"delete_keys: key {i} is {k!r} ({type(k).__name__}); keys are strings")
    if commit_message is not None and not isinstance(commit_message, str):
        raise ValueError(f"delete_keys: commit_message={commit_message!r}: expected a string or None")
    from pyspark.sql import DataFrame
    jvm: Any = spark._jvm
    jkeys = jvm.java.util.ArrayList()
    for k in keys:
        jkeys.add(k)
    jdf = jvm.io.safetensors.spark.SafetensorsDataset.deleteKeys(spark._jsparkSession, str(path), jkeys,
                                                                 commit_message)
    return DataFrame(jdf, spark)


def vacuum(spark: SparkSession, path: str | os.PathLike[str], retention: str | None = None, dry_run: bool = False,
           allow_shorter_retention: bool = False) -> DataFrame:
    """Vacuums the dataset at ``path`` through the session's file systems (local, HDFS,
    ``s3a://``; spec/dataset.md §5.8.1): the connector's ``io.safetensors.spark.Vacuum.vacuum``.
    Returns its DataFrame, one row per file deleted (dry run: to be deleted): ``file``, ``kind``
    (shard, index_part, log_entry), ``bytes``, ``version`` (the vacuum version; null on a dry run).
    Classic sessions; for a local path without a session use :func:`safetensors_spark.vacuum`."""
    if _session_is_connect(spark):
        raise SafetensorsSparkError("vacuum(spark, path) needs a classic SparkSession; with Spark Connect "
                                    "use safetensors_spark.vacuum(path) on a local path")
    from pyspark.sql import DataFrame
    jvm: Any = spark._jvm
    jdf = jvm.io.safetensors.spark.Vacuum.vacuum(
        spark._jsparkSession, str(path), retention, bool(dry_run), bool(allow_shorter_retention))
    return DataFrame(jdf, spark)
