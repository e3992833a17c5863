#!/usr/bin/env bash
# Runs every cargo-fuzz target of the engine (spec/fuzzing.md), one after the other, each until it
# has executed RUNS inputs (default 10,000,000) or found a crash, hang (> 10 s), leak or input using
# > 2 GiB. Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
#   bash rust-core/fuzz/run.sh [RUNS] [TARGET...]
# Working corpora go to rust-core/fuzz/corpus/<target>/ (not checked in), seeded from seeds/;
# findings to artifacts/<target>/; each target's libFuzzer log to logs/<target>.log.
set -uo pipefail
cd "$(dirname "$0")"
RUNS=${1:-10000000}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(header manifest write_plan arrow_batch)
mkdir -p logs
# arrow_batch writes and fsyncs shards into a scratch directory per input: on tmpfs (fsync free)
# it runs about 9 x faster than on disk (spec/fuzzing.md)
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then
  export TMPDIR=/dev/shm/safetensors-spark-fuzz
  mkdir -p "$TMPDIR"
fi
cargo +nightly fuzz build -O || exit 1
for t in "${TARGETS[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t"
  start=$(date +%s)
  cargo +nightly fuzz run -O "$t" "corpus/$t" "seeds/$t" -- \
    -runs="$RUNS" -rss_limit_mb=2048 -timeout=10 -detect_leaks=1 \
    -artifact_prefix="artifacts/$t/" -print_final_stats=1 > "logs/$t.log" 2>&1
  status=$?
  echo "$t: exit $status, $(( $(date +%s) - start )) s, $(grep -o 'stat::number_of_executed_units: [0-9]*' "logs/$t.log" | tail -1)"
done
