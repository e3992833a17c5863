# Sourced by tests/run-all.sh and tests/demo.sh: makes a fresh machine ready.
# Creates the Python venv (.venv, or $SAFETENSORS_SPARK_VENV) with tests/python/requirements.txt,
# reinstalling only when that file changes, and exports what Spark needs to run locally.
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
export SPARK_LOCAL_IP=127.0.0.1
export PYSPARK_PYTHON=$PYTHON
export PYSPARK_DRIVER_PYTHON=$PYTHON
