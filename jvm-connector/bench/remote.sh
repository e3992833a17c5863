#!/usr/bin/env bash
# Training straight from object storage on a shaped link: one shuffled epoch from an S3 server on
# loopback, ours (node cache + read-ahead) against MosaicML Streaming and Parquet + pyarrow over
# s3fs (jvm-connector/bench/remote.py; spec/performance.md §13).
#
#   bash jvm-connector/bench/remote.sh [--rows N] [--rate-mbit R] [--delay-ms D] [--paths ours,ours_cache25,ours_prefetch8,streaming,parquet] [--out F.json]
#
# Defaults: 250,000 rows (4,104 bytes each, ~1 GB), 800 Mbit/s (100 MB/s), 25 ms per request,
# every path, remote-results.json. Needs root (or the right to make a network namespace) and `tc`:
# the whole benchmark runs inside `unshare -n`, on that namespace's own loopback, which it shapes
# with `tc qdisc ... tbf` (bandwidth; tc netem, for latency, is not needed: the server waits
# --delay-ms before each request). The S3 server is jvm-connector/bench/s3server (Go, gofakes3 in
# memory, with a request delay and byte counters), built here into jvm-connector/bench/target/.
# Streaming gets its own venv (loaders/venvs.sh, shared with epoch.sh and tokens.sh).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/prepare.sh"
make_loader_venvs streaming
for tool in go unshare ip tc; do
  command -v "$tool" >/dev/null || { echo "remote.sh needs '$tool' on PATH" >&2; exit 1; }
done
server=$HERE/target/s3server
if [ ! -x "$server" ] || [ -n "$(find "$HERE/s3server" -newer "$server" -type f)" ]; then
  echo "== building the S3 server ($server)" >&2
  (cd "$HERE/s3server" && go build -o "$server" .)
fi
exec unshare -n -- bash -c 'ip link set lo up && exec "$@"' bash "$PYTHON" "$HERE/remote.py" run --server "$server" "$@"
