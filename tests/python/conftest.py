"""Shared fixtures: the repository root and the release build of the Rust tools."""
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RELEASE = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release"


@pytest.fixture(scope="session")
def rust_tools():
    """Builds the CLI and the test examples once per session; returns the release directory."""
    subprocess.run(
        ["cargo", "build", "--release", "--locked", "-p", "safetensors-spark-core", "--bins", "--examples"],
        cwd=ROOT,
        check=True,
    )
    return RELEASE


@pytest.fixture(scope="session")
def cli(rust_tools):
    """Runs `safetensors-spark ARGS...` and returns the CompletedProcess."""
    exe = rust_tools / "safetensors-spark"

    def run(*args):
        return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True)

    return run


@pytest.fixture(scope="session")
def connector_jar():
    """The self-contained connector jar that `mvn verify` (tests/run-all.sh) leaves in jvm-connector/target."""
    jars = sorted((ROOT / "jvm-connector" / "target").glob("safetensors-spark-*.jar"))
    if len(jars) != 1:
        pytest.fail(f"expected exactly one connector jar in jvm-connector/target, found {jars}; run `mvn -f jvm-connector/pom.xml package` first")
    return jars[0]


@pytest.fixture(scope="session")
def spark(connector_jar):
    """One local[2] SparkSession for the whole pytest run, with the connector jar."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("safetensors-spark-tests")
        .config("spark.jars", str(connector_jar))
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        # the tensor functions and SQL on files (spec/functions.md, spec/sql.md §1); catalog
        # tables' managed data under a temp directory
        .config("spark.sql.extensions", "io.safetensors.spark.SafetensorsExtensions")
        .config("spark.sql.warehouse.dir", tempfile.mkdtemp(prefix="safetensors-warehouse-"))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
