#!/usr/bin/env bash
# End-to-end benchmarks through real kernels: pod A → pod B as network namespaces, direct
# (no capture, no proxy) versus Ambit (in-pod capture + one dedicated proxy per pod, HBONE).
# Prints a markdown table with medians over REPS runs and ratios to direct from the same run.
#
# Usage, as root: bash benches/e2e.sh [REPS] [SECONDS]     (defaults: 3 runs of 10 s each)
# Extra proxy settings: PROXY_ENV="ZTUNNEL_WORKER_THREADS=1" bash benches/e2e.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
SECS=${2:-10}
[ "$(id -u)" -eq 0 ] || { echo "needs root: run it as root" >&2; exit 1; }
need=()
for c in cc:build-essential iperf3:iperf3 sockperf:sockperf wrk:wrk nginx:nginx-light curl:curl python3:python3 \
  ip:iproute2 iptables-restore:iptables sysctl:procps; do command -v "${c%%:*}" >/dev/null || need+=("${c#*:}"); done
[ ${#need[@]} -eq 0 ] || { echo "installing ${need[*]}"; apt-get update -qq &&
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }
cargo build --release -q -p ambit --features jemalloc
AMBIT=$PWD/target/release/ambit
. scripts/netns-lib.sh
pods_up
mesh_config

mkdir -p "$T/www"; head -c 1024 /dev/urandom | base64 -w0 | head -c 1024 > "$T/www/1k"
cat > "$T/nginx.conf" <<NGINX
daemon off; worker_processes 1; pid $T/nginx.pid; error_log $T/nginx-error.log;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 100000; server { listen 8080 reuseport backlog=4096; root $T/www; } }
NGINX
ip netns exec $B nginx -e "$T/nginx-error.log" -c "$T/nginx.conf" & PIDS+=($!)
ip netns exec $B iperf3 -s -D --pidfile "$T/iperf.pid" >/dev/null; sleep 0.2; PIDS+=($(cat "$T/iperf.pid"))
ip netns exec $B sockperf sr --tcp -i $IPB -p 11111 >/dev/null 2>&1 & PIDS+=($!)
sleep 0.5

median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) {print "nan"} else if (NR%2) {print a[(NR+1)/2]} else {print (a[NR/2]+a[NR/2+1])/2}}'; }
cpu_ticks() { local s=0 p; for p in "${PROXY_PIDS[@]}"; do s=$((s + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo $s; }
hz=$(getconf CLK_TCK)

iperf_gbps() { ip netns exec $A iperf3 -c $IPB -t "$SECS" -J | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9)'; }
sockperf_pct() { # prints "p50 p99" in microseconds
  ip netns exec $A sockperf pp --tcp -i $IPB -p 11111 -m 1024 -t "$SECS" 2>&1 |
    awk '/percentile 50.000/ {p50=$NF} /percentile 99.000/ {p99=$NF} END {print p50, p99}'
}
wrk_rps() { ip netns exec $A wrk -t1 -c16 -d"${SECS}s" "$@" "http://$IPB:8080/1k" | awk '/Requests\/sec/ {print $2}'; }

declare -A R
run_mode() { # mode
  local mode=$1 i t0 t1 bytes
  for ((i = 0; i < REPS; i++)); do
    t0=$(cpu_ticks); R[$mode,tput]+="$(iperf_gbps) "; t1=$(cpu_ticks)
    R[$mode,cpu_gb]+="$(python3 -c "print(($t1-$t0)/$hz)") "
    read -r p50 p99 < <(sockperf_pct); R[$mode,p50]+="$p50 "; R[$mode,p99]+="$p99 "
    t0=$(cpu_ticks); R[$mode,cps]+="$(wrk_rps -H 'Connection: close') "; t1=$(cpu_ticks)
    R[$mode,cpu_conn]+="$(python3 -c "print(($t1-$t0)/$hz)") "
    t0=$(cpu_ticks); R[$mode,rps]+="$(wrk_rps) "; t1=$(cpu_ticks)
    R[$mode,cpu_req]+="$(python3 -c "print(($t1-$t0)/$hz)") "
  done
}
med() { echo "${R[$1]}" | tr ' ' '\n' | grep -v '^$' | median; }

PROXY_PIDS=()
run_mode direct
capture_pods
# shellcheck disable=SC2086
start_proxies ${PROXY_ENV:-}
run_mode ambit
rss_kb=$(for p in "${PROXY_PIDS[@]}"; do awk '/VmHWM/ {print $2}' /proc/$p/status; done | sort -n | tail -1)

ratio() { python3 -c "a=$1; b=$2; print(f'{a/b:.2f}' if b else 'n/a')"; }
f() { python3 -c "print(f'{$1:.$2f}')"; }
dt=$(med direct,tput) at=$(med ambit,tput)
d50=$(med direct,p50) a50=$(med ambit,p50) d99=$(med direct,p99) a99=$(med ambit,p99)
dc=$(med direct,cps) ac=$(med ambit,cps) dr=$(med direct,rps) ar=$(med ambit,rps)
cgb=$(med ambit,cpu_gb) ccon=$(med ambit,cpu_conn) creq=$(med ambit,cpu_req)
# CPU per GB: proxy CPU seconds during iperf / GB moved in that run.
gb=$(python3 -c "print($at*$SECS/8)")
echo
echo "| Figure | Direct | Ambit | Ambit / direct |"
echo "|---|---|---|---|"
echo "| Throughput, 1 TCP stream (iperf3 -t $SECS), Gbit/s | $(f $dt 2) | $(f $at 2) | $(ratio $at $dt) |"
echo "| Latency p50, 1 KiB ping-pong (sockperf), µs | $(f $d50 1) | $(f $a50 1) | +$(f "$a50-$d50" 1) µs |"
echo "| Latency p99, µs | $(f $d99 1) | $(f $a99 1) | +$(f "$a99-$d99" 1) µs |"
echo "| New connections/s (wrk -c16, Connection: close, nginx 1 KiB) | $(f $dc 0) | $(f $ac 0) | $(ratio $ac $dc) |"
echo "| Keep-alive requests/s (wrk -c16, nginx 1 KiB) | $(f $dr 0) | $(f $ar 0) | $(ratio $ar $dr) |"
echo "| Proxy CPU (both proxies), s per GB | — | $(python3 -c "print(f'{$cgb/$gb:.2f}')") | — |"
echo "| Proxy CPU, s per 10k new connections | — | $(python3 -c "print(f'{$ccon/($ac*$SECS)*1e4:.2f}')") | — |"
echo "| Proxy CPU, s per 10k keep-alive requests | — | $(python3 -c "print(f'{$creq/($ar*$SECS)*1e4:.2f}')") | — |"
echo "| Proxy peak RSS (largest of the two), MiB | — | $(python3 -c "print(f'{$rss_kb/1024:.1f}')") | — |"
echo
echo "raw: $(for k in "${!R[@]}"; do echo -n "$k=[${R[$k]}] "; done)"
