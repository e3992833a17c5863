# Sourced by tests/run-all.sh and tests/demo.sh: makes a fresh machine ready.
# Creates the Python venv (.venv, or $SAFETENSORS_SPARK_VENV) with tests/python/requirements.txt,
# reinstalling only when that file changes, installs the aarch64 cross build's Rust target and
# linker when missing, and exports what Spark needs to run locally.
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
# The jar carries the JNI library for linux-x86_64 and linux-aarch64 (jvm-connector/pom.xml
# cross-compiles the second): the Rust target and Debian's cross linker, installed once.
if [ ! -d "$(rustc --print sysroot)/lib/rustlib/aarch64-unknown-linux-gnu" ]; then
  if ! command -v rustup >/dev/null; then
    echo "setup-env: the Rust target aarch64-unknown-linux-gnu is missing and there is no rustup to add it" >&2
    exit 1
  fi
  rustup target add aarch64-unknown-linux-gnu
fi
# (libc6-dev-arm64-cross is only a Recommends of the compiler: named, for apt set to skip those)
if ! command -v aarch64-linux-gnu-gcc >/dev/null || [ ! -f /usr/aarch64-linux-gnu/lib/crti.o ]; then
  if ! command -v apt-get >/dev/null; then
    echo "setup-env: the linker aarch64-linux-gnu-gcc or its libc is missing (Debian/Ubuntu: apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross)" >&2
    exit 1
  fi
  _sts_sudo=; [ "$(id -u)" -eq 0 ] || _sts_sudo=sudo
  $_sts_sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $_sts_sudo apt-get install -y -qq gcc-aarch64-linux-gnu libc6-dev-arm64-cross >/dev/null
  unset _sts_sudo
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
