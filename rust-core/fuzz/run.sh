#!/usr/bin/env bash
# Runs every cargo-fuzz target of the engine (spec/fuzzing.md), one after the other, each until it
# has executed RUNS inputs (default 10,000,000) or found a crash, hang (> 10 s), leak or input using
# > 2 GiB. Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
#   bash rust-core/fuzz/run.sh [RUNS] [TARGET...]
#   FUZZ_JOBS=2 bash rust-core/fuzz/run.sh ...   # RUNS split over 2 parallel libFuzzer processes
#                                                # sharing the corpus (one per core)
# Working corpora go to rust-core/fuzz/corpus/<target>/ (not checked in), seeded from seeds/;
# findings to artifacts/<target>/; each target's libFuzzer log to logs/<target>.log.
set -uo pipefail
cd "$(dirname "$0")"
RUNS=${1:-10000000}
JOBS=${FUZZ_JOBS:-1}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(header manifest manifest_log write_plan arrow_batch)
mkdir -p logs
# arrow_batch writes and fsyncs shards into a scratch directory per input: on tmpfs (fsync free)
# it runs about 9 x faster than on disk (spec/fuzzing.md)
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then
  export TMPDIR=/dev/shm/safetensors-spark-fuzz
  mkdir -p "$TMPDIR"
fi
cargo +nightly fuzz build -O --fuzz-dir "$PWD" || exit 1
bin_dir=$PWD/target/$(rustc +nightly -vV | sed -n 's/^host: //p')/release
for t in "${TARGETS[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t" "logs/$t"
  rm -f logs/$t/fuzz-*.log logs/$t.log
  start=$(date +%s)
  # the binary cargo fuzz built, run from logs/$t/: with -jobs libFuzzer writes each process's
  # log to fuzz-<job>.log in the working directory
  (cd "logs/$t" && "$bin_dir/$t" "../../corpus/$t" "../../seeds/$t" \
    -runs=$(( (RUNS + JOBS - 1) / JOBS )) -rss_limit_mb=2048 -timeout=10 -detect_leaks=1 \
    -artifact_prefix="../../artifacts/$t/" -print_final_stats=1 \
    $( [ "$JOBS" -gt 1 ] && echo "-jobs=$JOBS -workers=$JOBS" ) > "../$t.log" 2>&1)
  status=$?
  [ "$JOBS" -gt 1 ] || cp "logs/$t.log" "logs/$t/fuzz-0.log"
  execs=$(cat logs/$t/fuzz-*.log | grep -o 'stat::number_of_executed_units: [0-9]*' | awk '{s += $2} END {print s + 0}')
  echo "$t: exit $status, $(( $(date +%s) - start )) s, $execs executions in $JOBS process(es)"
done
