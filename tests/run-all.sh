#!/usr/bin/env bash
# Runs every test of the project (what CI runs). Sets up the Python venv itself.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup-env.sh"
cd "$ROOT"

echo "== Rust: format, lints, tests"
cargo fmt --check
cargo clippy --locked --all-targets -- -D warnings
cargo test --locked
# the Python extension crate (not a default member: maturin builds it in setup-env.sh)
cargo clippy --locked -p safetensors-spark-python --all-targets -- -D warnings
cargo test --locked -q -p safetensors-spark-python  # its unit tests (copies into range buffers, downloads' writes)

if [ -f jvm-connector/pom.xml ]; then
  echo "== JVM connector: build, jar, ScalaTest"
  mvn -B -q -f jvm-connector/pom.xml verify
  echo "== Spark lines: the Spark 3.5 / Scala 2.12 jar, then both jars on every line's pyspark"
  mvn -B -q -f jvm-connector/pom.xml -P spark-3.5 package -DskipNative
  PYTHON=$PYTHON VENV=$VENV bash tests/spark-lines/run.sh
fi

echo "== Python package: types (mypy)"
(cd rust-core/python/python && "$PYTHON" -m mypy --config-file ../pyproject.toml --cache-dir "$ROOT/target/mypy-cache" \
  -p safetensors_spark)

echo "== Cross-language tests (pytest)"
"$PYTHON" -m pytest tests/python -q -p no:cacheprovider
