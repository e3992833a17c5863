# Sourced by tests/run-all.sh and tests/demo.sh: makes a fresh machine ready.
# Creates the Python venv (.venv, or $SAFETENSORS_SPARK_VENV) with tests/python/requirements.txt,
# reinstalling only when that file changes, and exports what Spark needs to run locally.
# It runs with -euo pipefail and gives the shell that sources it its own options back at the end
# (an interactive shell is not left with errexit on).
case $- in *e*) _sts_errexit=-e ;; *) _sts_errexit=+e ;; esac
case $- in *u*) _sts_nounset=-u ;; *) _sts_nounset=+u ;; esac
if shopt -qo pipefail; then _sts_pipefail=-o; else _sts_pipefail=+o; fi
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${SAFETENSORS_SPARK_VENV:-$ROOT/.venv}
REQ=$ROOT/tests/python/requirements.txt
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
stamp="$VENV/.requirements.sha256"
want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQ"
  echo "$want" > "$stamp"
fi
PYTHON=$VENV/bin/python
# The Python package safetensors_spark (rust-core/python: a PyO3 extension + pure Python),
# installed editable into the venv with maturin; rebuilt when the Rust sources, the crate files or
# this checkout's location change (Python edits need no rebuild: the install points at the source).
ext_stamp="$VENV/.safetensors_spark.sha256"
ext_want=$( (cd "$ROOT" && echo "$ROOT" && find Cargo.toml Cargo.lock rust-core/format rust-core/dataset \
  rust-core/python/Cargo.toml rust-core/python/pyproject.toml rust-core/python/src -type f -print0 \
  | sort -z | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1)
if [ "$(cat "$ext_stamp" 2>/dev/null)" != "$ext_want" ] \
  || ! ls "$ROOT"/rust-core/python/python/safetensors_spark/_native*.so >/dev/null 2>&1; then
  VIRTUAL_ENV=$VENV "$VENV/bin/maturin" develop --release --locked -q -m "$ROOT/rust-core/python/Cargo.toml"
  echo "$ext_want" > "$ext_stamp"
fi
export SPARK_LOCAL_IP=127.0.0.1
export PYSPARK_PYTHON=$PYTHON
export PYSPARK_DRIVER_PYTHON=$PYTHON
set "$_sts_errexit" "$_sts_nounset" "$_sts_pipefail" pipefail
unset _sts_errexit _sts_nounset _sts_pipefail
