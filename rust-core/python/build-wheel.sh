#!/usr/bin/env bash
# Builds the safetensors_spark wheel with the connector jar inside it (spec/python.md §1):
# copies jvm-connector/target/safetensors-spark-*.jar (built by Maven when absent) into
# python/safetensors_spark/jars/, then `maturin build --release`. Usage:
#   bash rust-core/python/build-wheel.sh [OUT_DIR]        (needs maturin on PATH; default OUT_DIR target/wheels)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=${1:-$ROOT/target/wheels}
shopt -s nullglob
jars=("$ROOT"/jvm-connector/target/safetensors-spark-*.jar)
if [ ${#jars[@]} -eq 0 ]; then
  mvn -B -q -f "$ROOT/jvm-connector/pom.xml" package -DskipTests
  jars=("$ROOT"/jvm-connector/target/safetensors-spark-*.jar)
fi
if [ ${#jars[@]} -ne 1 ]; then
  echo "expected one connector jar in jvm-connector/target, found: ${jars[*]:-none}" >&2
  exit 1
fi
# the copy lives only while the wheel is built: an editable install must keep finding the jar of
# jvm-connector/target, not a stale copy
trap 'rm -rf "$HERE/python/safetensors_spark/jars"' EXIT
rm -rf "$HERE/python/safetensors_spark/jars"
mkdir -p "$HERE/python/safetensors_spark/jars"
cp "${jars[0]}" "$HERE/python/safetensors_spark/jars/"
maturin build --release --locked -m "$HERE/Cargo.toml" --out "$OUT"
