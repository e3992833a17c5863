#!/usr/bin/env bash
# The benchmark: a local Spark writes one generated, cached DataFrame with every variant (noop,
# parquet, safetensors batch/KV), reads back, loads the outputs into numpy (and torch if
# importable), optionally runs the Rust criterion benches, prints tables and writes a JSON file.
#
#   bash jvm-connector/bench/run.sh [--rows N] [--width W] [--reps R] [--out results.json]
#                                   [--with-criterion] [...]   (bench.py --help lists every option)
#
# Defaults: 1,000,000 rows × 256, 3 repetitions, bench-results.json. `--rows 100000` takes a few
# minutes. What is measured and the targets: spec/performance.md.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../tests/setup-env.sh"
if ! ls "$ROOT"/jvm-connector/target/safetensors-spark-*.jar >/dev/null 2>&1; then
  echo "== building the connector jar (cargo + maven)" >&2
  (cd "$ROOT" && mvn -B -q -f jvm-connector/pom.xml package -DskipTests)
fi
exec "$PYTHON" "$ROOT/jvm-connector/bench/bench.py" "$@"
