#!/usr/bin/env bash
# The demo: writes a real file with the Rust core, looks inside it with the CLI and reads it back
# with the Python `safetensors` package. Sets up the Python venv itself.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup-env.sh"
cd "$ROOT"
cargo build --release --locked -q -p safetensors-spark-core --bins --examples
"$PYTHON" tests/demo.py
