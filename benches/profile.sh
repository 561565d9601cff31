#!/usr/bin/env bash
# Where the node proxies spend their CPU on the end-to-end figures: runs benches/e2e.sh with
# `perf record` attached to the proxies during each Ambit figure (throughput, new connections,
# keep-alive requests), then prints each profile's top symbols by self time. A profiling run: the
# rates and CPU figures it prints include perf's own cost; take those from a plain e2e.sh run.
#
# Usage, as root:  bash benches/profile.sh [ROUNDS] [SECONDS] [MODES] [OUT_DIR]
#                  (defaults: 1 round, 10 s per figure, MODES=default, OUT_DIR=target/perf)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-1}
SECS=${2:-10}
MODES=${3:-default}
OUT=${4:-target/perf}
command -v perf >/dev/null || {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends linux-perf >/dev/null
}
rm -rf "$OUT"
mkdir -p "$OUT"
BENCH_PERF_DIR="$(realpath "$OUT")" bash benches/e2e.sh "$ROUNDS" "$SECS" "$MODES"
for f in "$OUT"/*.data; do
  echo
  echo "## $(basename "$f" .data): top symbols by self time (perf report --no-children --sort dso,symbol)"
  perf report -i "$f" --stdio --no-children --sort dso,symbol --percent-limit 1.5 2>/dev/null |
    grep -v '^#' | grep -v '^$' | head -25
done
