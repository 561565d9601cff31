#!/usr/bin/env bash
# End-to-end benchmarks through real kernels, pod A → pod B, Ambit against a baseline without the
# mesh on the same node, interleaved run by run, in two topologies:
#   default    shared node proxy over ZDS, nftables capture by the real agent, pods created
#              through the CNI chain (baseline: pods of the same chain in a namespace not enrolled)
#   dedicated  one proxy inside each pod, iptables capture of the spec's rule set
# The topologies and measurements are the ignored test crates/ambit/tests/bench_e2e.rs (it uses
# the e2e harness: CNI runtime, agent, proxies). Release build (fat LTO, one codegen unit) with
# jemalloc. Prints one markdown table per topology: medians over ROUNDS, ratios per round.
#
# Usage, as root:  bash benches/e2e.sh [ROUNDS] [SECONDS] [MODES]
#                  (defaults: 5 rounds, 10 s per figure and run, MODES=default,dedicated)
# On a shared machine, cargo can be wrapped: CARGO=lcargo bash benches/e2e.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
SECS=${2:-10}
MODES=${3:-default,dedicated}
[ "$(id -u)" -eq 0 ] || { echo "run as root (network namespaces, nftables, iptables)" >&2; exit 1; }
# What the bench runs, by command and the Debian package that has it; missing ones are installed.
need=()
for c in cc:build-essential iperf3:iperf3 sockperf:sockperf wrk:wrk nginx:nginx-light git:git \
  ip:iproute2 iptables-restore:iptables nft:nftables getconf:libc-bin; do
  command -v "${c%%:*}" >/dev/null || need+=("${c#*:}")
done
[ -x /usr/lib/cni/bridge ] || [ -x /opt/cni/bin/bridge ] || need+=(containernetworking-plugins)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- 2>/dev/null || commit="$commit (+ uncommitted changes)"
echo "commit $commit; $(nproc) cores, Linux $(uname -r), $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "command: bash benches/e2e.sh $ROUNDS $SECS $MODES"
# Build first (ambit-cni too, which the harness would otherwise build on first use), then run the
# bench binary itself: a shared machine's build lock (lcargo) is held only while building.
CARGO=${CARGO:-cargo}
$CARGO build --release -q -p ambit-cni
exe=$($CARGO test --release -p ambit --features jemalloc --test bench_e2e --no-run 2>&1 |
  sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -1)
[ -x "$exe" ] || { echo "could not build the bench (cargo test --release -p ambit --test bench_e2e)" >&2; exit 1; }
BENCH_ROUNDS=$ROUNDS BENCH_SECONDS=$SECS BENCH_MODES=$MODES "$exe" --ignored --nocapture --test-threads=1
