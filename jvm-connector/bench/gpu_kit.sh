#!/usr/bin/env bash
# The kit gpu_feed.py needs on a GPU machine that has torch, numpy, fsspec and safetensors but no
# network and no build tools (spec/performance.md §10.9): the package's wheel (abi3, any CPython
# >= 3.10; without the connector jar, which the GPU check does not use), in target/gpu-kit/.
# It then checks the wheel here, installed with --target as it will be there: gpu_feed.py
# --rehearse from it, not from the editable install. Usage:
#   bash jvm-connector/bench/gpu_kit.sh
# and on the GPU machine, with target/gpu-kit carried (one command; --out and the log under $OUT):
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site target/gpu-kit/*.whl \
#     && PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 jvm-connector/bench/gpu_feed.py --out $OUT/gpu_feed.json
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
KIT=$ROOT/target/gpu-kit
# shellcheck source=/dev/null
source "$ROOT/tests/setup-env.sh"
rm -rf "$KIT" && mkdir -p "$KIT"
VIRTUAL_ENV=$VENV "$VENV/bin/maturin" build --release --locked -q -m "$ROOT/rust-core/python/Cargo.toml" --out "$KIT"
wheels=("$KIT"/*.whl)
[ ${#wheels[@]} -eq 1 ] || { echo "expected one wheel in $KIT, found: ${wheels[*]}" >&2; exit 1; }
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$site" "${wheels[0]}"
# from a directory outside the checkout, so that the editable install's sources cannot be imported
(cd "$site" && PYTHONPATH=$site "$PYTHON" -c 'import safetensors_spark, sys; p = safetensors_spark.__file__
assert p.startswith(sys.argv[1]), f"imported {p}, not the kit"' "$site"
  PYTHONPATH=$site "$PYTHON" "$ROOT/jvm-connector/bench/gpu_feed.py" --rehearse --shards 2 --passes 2 --reps 1 --step-ms 0 --copies 2)
echo "kit: ${wheels[0]} ($(du -h "${wheels[0]}" | cut -f1)); carry target/gpu-kit"
