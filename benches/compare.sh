#!/usr/bin/env bash
# Two builds of the end-to-end bench (crates/ambit/tests/bench_e2e.rs) run interleaved round by
# round, base first in odd rounds and new first in even ones, so both builds see the same
# machine load; then benches/compare.py prints medians, new against direct, and new against base
# per round. Each run measures direct (no mesh) itself.
#
# Build each bench binary in its own checkout, as benches/e2e.sh does:
#   cargo build --release -p ambit-cni
#   cargo test --release -p ambit --features jemalloc --test bench_e2e --no-run   (prints the path)
# Usage, as root:  bash benches/compare.sh BASE_BENCH NEW_BENCH [ROUNDS] [SECONDS] [MODES] [OUT_DIR]
#                  (defaults: 5 rounds, 5 s per figure, MODES=default,dedicated, OUT_DIR=target/compare)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
BASE=$1
NEW=$2
ROUNDS=${3:-5}
SECS=${4:-5}
MODES=${5:-default,dedicated}
OUT=${6:-target/compare}
[ "$(id -u)" -eq 0 ] || { echo "run as root (network namespaces, nftables, iptables)" >&2; exit 1; }
for b in "$BASE" "$NEW"; do [ -x "$b" ] || { echo "not an executable: $b" >&2; exit 1; }; done
mkdir -p "$OUT"
rm -f "$OUT"/base-*.txt "$OUT"/new-*.txt
echo "$(nproc) cores, Linux $(uname -r), $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "command: bash benches/compare.sh $BASE $NEW $ROUNDS $SECS $MODES $OUT"
run() {
    BENCH_ROUNDS=1 BENCH_SECONDS=$SECS BENCH_MODES=$MODES "$2" --ignored --nocapture --test-threads=1 \
        >"$OUT/$1-$3.txt" 2>"$OUT/$1-$3.log" || { echo "$1 run $3 failed: $OUT/$1-$3.log" >&2; exit 1; }
    echo "round $3: $1 done, load $(cut -d' ' -f1-3 /proc/loadavg)"
}
for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) -eq 1 ]; then run base "$BASE" "$r"; run new "$NEW" "$r"
    else run new "$NEW" "$r"; run base "$BASE" "$r"; fi
done
python3 benches/compare.py "$OUT"
