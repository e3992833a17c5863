"""PySpark set-up: a session builder with the safetensors connector jar on ``spark.jars``."""

import glob
import os
from pathlib import Path

from ._errors import SafetensorsSparkError

_JAR_PATTERN = "safetensors-spark-*.jar"


def find_jar():
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


def configure(builder, jar=None):
    """Returns ``builder`` with the connector jar added to ``spark.jars`` and the connector's
    ``spark.sql.extensions`` class (the SQL functions ``arr_to_st``/``st_to_array``) added to that
    setting (both keep what is already configured there), e.g.
    ``configure(SparkSession.builder).master("local[2]").getOrCreate()``."""
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
