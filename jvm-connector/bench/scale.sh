#!/usr/bin/env bash
# How a dataset's costs grow with its versions and shards (issue 38; spec/performance.md §14):
# commit time and log bytes at 100 / 1k / 10k versions, open time (local, and on remote.sh's shaped
# S3 server) and Spark's plan time and driver heap at 1k / 10k / 100k shards, a versionAsOf read,
# a vacuum and a compaction, and Delta Lake's commit time, log size and plan time beside them.
#
#   bash jvm-connector/bench/scale.sh [--quick] [--parts commit,open,remote,spark,delta]
#        [--versions 100,1000,10000] [--shards 1000,10000,100000] [--delta-commits 100,1000,10000]
#        [--out F.json] [--label TEXT] [--workdir DIR] [--keep]      (scale.py --help: every option)
#
#   bash jvm-connector/bench/scale.sh plot --versions V.json --delta D.json... --shards S.json [--out F.svg]
#        (the curves of performance.md §14 from earlier runs' JSON: scale_plot.py, matplotlib in its
#        own venv)
#
# --quick (20/100 versions, 100/1,000 shards, 20/50 Delta commits) takes a few minutes. The full
# run is long on 2 cores: run it with nice, never in CI. The remote part needs root (or the right
# to make a network namespace), `tc` and Go (the S3 server of remote.sh); the delta part fetches
# delta-spark from Maven Central through spark.jars.packages.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ "${1:-}" = plot ]; then
  # the project's venv and the bench venv maker only: a plot needs no connector jar
  shift
  # shellcheck source=/dev/null
  source "$HERE/../../tests/setup-env.sh"
  # shellcheck source=/dev/null
  source "$HERE/loaders/venvs.sh"
  make_loader_venvs plot
  [ ! -e "$HERE/.venv/plot.unavailable" ] || exit 1
  exec "$HERE/.venv/plot/bin/python" "$HERE/scale_plot.py" "$@"
fi
# shellcheck source=/dev/null
source "$HERE/prepare.sh"
echo "== building the synthetic committer (rust-core/dataset/examples/log_scale.rs)" >&2
(cd "$ROOT" && cargo build -q --release --locked -p safetensors-spark-dataset --no-default-features --example log_scale)
case " $* " in
  *" --parts "*) want_remote=$(echo "$*" | grep -c "remote" || true) ;;
  *) want_remote=1 ;;
esac
if [ "$want_remote" != 0 ]; then
  for tool in go unshare ip tc; do
    command -v "$tool" >/dev/null || { echo "scale.sh's remote part needs '$tool' on PATH" >&2; exit 1; }
  done
  server=$HERE/target/s3server
  if [ ! -x "$server" ] || [ -n "$(find "$HERE/s3server" -newer "$server" -type f)" ]; then
    echo "== building the S3 server ($server)" >&2
    (cd "$HERE/s3server" && go build -o "$server" .)
  fi
fi
exec nice -n 5 "$PYTHON" "$HERE/scale.py" "$@"
