#!/usr/bin/env bash
# Token data: a Spark DataFrame of tokenized documents → one shuffled epoch of packed 2048-token
# blocks, ours (ragged batch write + packing loader; and KV mode) against MosaicML Streaming,
# HF datasets and Spark Parquet + pyarrow (jvm-connector/bench/tokens.py; spec/performance.md §12).
#
#   bash jvm-connector/bench/tokens.sh [--docs N] [--reps R] [--paths ours,ours_kv,parquet,streaming,hf] [--out F.json]
#
# Defaults: 250,000 documents, 2 repetitions, every path, tokens-results.json; `--docs 20000` is
# a quick check (a few minutes). The project's venv (tests/setup-env.sh) runs ours and Parquet;
# MosaicML Streaming and HF datasets get their own venvs, made here from the pinned lists
# loaders/streaming.txt and loaders/hf.txt (the epoch benchmark's, shared; loaders/venvs.sh),
# never in the test venv.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/prepare.sh"
make_loader_venvs streaming hf
exec "$PYTHON" "$HERE/tokens.py" run "$@"
