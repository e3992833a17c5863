#!/usr/bin/env bash
# Smoke run of the connector jars on every Spark line of lines.txt: write (batch and KV mode) and
# read back on each line's pyspark (smoke.py). Run by tests/run-all.sh after both jars are built
# (`mvn verify` and `mvn -P spark-3.5 package`); alone: `bash tests/spark-lines/run.sh`.
# Jars can be pointed elsewhere with SAFETENSORS_SPARK_JAR_4 / SAFETENSORS_SPARK_JAR_3_5.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -z "${PYTHON:-}" ] || [ -z "${VENV:-}" ]; then
  source "$HERE/../setup-env.sh"
fi
ROOT=$(cd "$HERE/../.." && pwd)
unset SPARK_HOME   # each pyspark must use the Spark it ships

one_jar() {   # the single jar matching a glob, or an error
  local matches=($1)
  if [ ${#matches[@]} -ne 1 ] || [ ! -f "${matches[0]}" ]; then
    echo "spark-lines: expected exactly one jar matching $1, found: ${matches[*]}" >&2
    return 1
  fi
  echo "${matches[0]}"
}
JAR_4=${SAFETENSORS_SPARK_JAR_4:-$(one_jar "$ROOT/jvm-connector/target/safetensors-spark-[0-9]*.jar")}
JAR_3_5=${SAFETENSORS_SPARK_JAR_3_5:-$(one_jar "$ROOT/jvm-connector/target/spark-3.5/safetensors-spark-spark3.5_2.12-*.jar")}
# both jars carry the native library of every platform NativeLib supports (jvm-connector/pom.xml)
"$PYTHON" - "$JAR_4" "$JAR_3_5" <<'EOF'
import sys, zipfile
for jar in sys.argv[1:]:
    names = set(zipfile.ZipFile(jar).namelist())
    for platform in ("linux-x86_64", "linux-aarch64"):
        if f"native/{platform}/libsafetensors_spark.so" not in names:
            sys.exit(f"spark-lines: {jar} has no native/{platform}/libsafetensors_spark.so")
EOF

LINES_DIR=$VENV/spark-lines
mkdir -p "$LINES_DIR"
main_pyspark=$("$PYTHON" -c 'import pyspark; print(pyspark.__version__)')
mapfile -t entries < <(grep -v '^\s*#' "$HERE/lines.txt" | grep -v '^\s*$')

# Installs: one pyspark per line in its own folder, reused; folders of unlisted versions go.
wanted=()
for entry in "${entries[@]}"; do
  read -r version _ <<<"$entry"
  [ "$version" = "$main_pyspark" ] && continue
  wanted+=("pyspark-$version")
  dir=$LINES_DIR/pyspark-$version
  if [ ! -f "$dir/.installed" ]; then
    echo "spark-lines: installing pyspark $version into $dir"
    rm -rf "$dir" "$dir.partial"
    "$PYTHON" -m pip install -q --disable-pip-version-check --no-deps --target "$dir.partial" "pyspark==$version"
    touch "$dir.partial/.installed"
    mv "$dir.partial" "$dir"
  fi
done
for dir in "$LINES_DIR"/*; do
  [ -e "$dir" ] || continue
  name=$(basename "$dir")
  if [[ ! " ${wanted[*]} " == *" $name "* ]]; then rm -rf "$dir"; fi
done

passed=0 failed=0
OUT=$ROOT/tests/.out/spark-lines
for entry in "${entries[@]}"; do
  read -r version jar_line <<<"$entry"
  case "$jar_line" in
    4) jar=$JAR_4 ;;
    3.5) jar=$JAR_3_5 ;;
    *) echo "spark-lines: lines.txt: unknown jar '$jar_line' for pyspark $version" >&2; exit 1 ;;
  esac
  pythonpath=""
  [ "$version" != "$main_pyspark" ] && pythonpath=$LINES_DIR/pyspark-$version
  rm -rf "$OUT/$version"
  start=$SECONDS
  if PYTHONPATH=$pythonpath "$PYTHON" "$HERE/smoke.py" "$jar" "${version%.*}" "$OUT/$version"; then
    passed=$((passed + 1))
    echo "spark-lines: pyspark $version with $(basename "$jar"): passed ($((SECONDS - start)) s)"
  else
    failed=$((failed + 1))
    echo "spark-lines: pyspark $version with $(basename "$jar"): FAILED ($((SECONDS - start)) s)" >&2
  fi
done
echo "spark-lines: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
