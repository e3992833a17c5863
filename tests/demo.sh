#!/usr/bin/env bash
# The demo: a local Spark writes a real DataFrame as safetensors shards (batch and KV modes), then
# the Python `safetensors` package reads every shard back and checks the values.
# Sets up everything itself: Python venv (.venv), the Rust build and the connector jar.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup-env.sh"
cd "$ROOT"
echo "== building the connector jar (cargo + maven)"
mvn -B -q -f jvm-connector/pom.xml package -DskipTests
JAR=$(ls jvm-connector/target/safetensors-spark-*.jar)
cargo build --release --locked -q -p safetensors-spark-cli --bin safetensors-spark
"$PYTHON" tests/demo.py "$JAR"
