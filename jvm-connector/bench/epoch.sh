#!/usr/bin/env bash
# Spark DataFrame → one shuffled PyTorch epoch, ours against Petastorm, MosaicML Streaming,
# HF datasets and Spark Parquet + pyarrow (jvm-connector/bench/epoch.py; spec/performance.md §10).
#
#   bash jvm-connector/bench/epoch.sh [--rows N] [--reps R] [--paths ours,parquet,...] [--out F.json]
#
# Defaults: 1,000,000 rows (4,104 bytes each), 3 repetitions, every path, epoch-results.json.
# The project's venv (tests/setup-env.sh) runs ours and Parquet. The other loaders conflict with
# it or with each other (petastorm needs pyarrow < 16 hence numpy < 2; Streaming pins numpy
# < 2.2 and huggingface_hub < 1; datasets needs huggingface_hub 2), so each gets its own venv,
# made here, under jvm-connector/bench/.venv/<name> (ignored by git): an overlay whose own
# packages (jvm-connector/bench/loaders/<name>.txt, pinned) come first and whose base is the
# project's venv (torch and pyspark are not installed twice). A venv that cannot be made is
# reported by the benchmark with pip's reason; nothing of this touches the test venv.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/prepare.sh"
make_loader_venvs petastorm streaming hf
exec "$PYTHON" "$HERE/epoch.py" run "$@"
