#!/usr/bin/env bash
# Two pods talking through Ambit, on this machine: pods are network namespaces on a bridge,
# each with the in-pod capture rules and its own `ambit proxy` (dedicated mode), sharing one
# ztunnel-format config file. Pod A fetches a page from nginx in pod B; the request travels as
# HBONE (mTLS on port 15008), nginx sees A's address, and the proxies log and count it.
#
# Usage, as root: bash examples/demo.sh   (Debian/Ubuntu with Rust; installs what it needs with apt,
# the C toolchain included)
set -euo pipefail

cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "demo.sh needs root (network namespaces); run it as root: bash examples/demo.sh" >&2
  exit 1
fi
need=()
for c in cc:build-essential ip:iproute2 iptables-restore:iptables nginx:nginx-light curl:curl \
  tcpdump:tcpdump xargs:findutils sysctl:procps; do
  command -v "${c%%:*}" >/dev/null || need+=("${c#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    ca-certificates "${need[@]}" >/dev/null
fi
echo "building ambit (release)…"
cargo build --release -q -p ambit
AMBIT=$PWD/target/release/ambit
. scripts/netns-lib.sh

pods_up
capture_pods
mesh_config
start_proxies

# nginx in pod B (its workers run as www-data: make the page readable).
mkdir -p "$T/www"; echo "hello from pod B, through Ambit" > "$T/www/index.html"
chmod 755 "$T" "$T/www"; chmod 644 "$T/www/index.html"
cat > "$T/nginx.conf" <<NGINX
daemon off; worker_processes 1; pid $T/nginx.pid; error_log $T/nginx-error.log;
events {}
http { access_log $T/nginx-access.log; server { listen 8080; root $T/www; } }
NGINX
ip netns exec $B nginx -e "$T/nginx-error.log" -c "$T/nginx.conf" & PIDS+=($!)
sleep 0.5

# Capture on the node side of both pods' veths (bridged traffic does not pass br0 itself).
ip netns exec $NODE tcpdump -i any --immediate-mode -w "$T/wire.pcap" -U tcp >"$T/tcpdump.log" 2>&1 & TCPDUMP=$!
for _ in $(seq 100); do grep -q "listening on" "$T/tcpdump.log" && break; sleep 0.1; done
sleep 0.2
echo
echo "== pod A ($IPA): curl http://$IPB:8080/"
ip netns exec $A curl -sS --max-time 5 "http://$IPB:8080/"
sleep 0.5; kill $TCPDUMP; wait $TCPDUMP 2>/dev/null || true
echo
echo "== nginx in pod B logged the request as coming from:"
cut -d' ' -f1,6-9 "$T/nginx-access.log"
echo
echo "== TCP packets on the wire between the pods, by destination:"
tcpdump -nn -r "$T/wire.pcap" 2>/dev/null | grep -oE '> [0-9.]+\.[0-9]+:' | sed 's/^> //; s/:$//' | sort | uniq -c | sort -rn | head -4
echo "   (to port 8080, where nginx listens: $(tcpdump -nn -r "$T/wire.pcap" 'dst port 8080' 2>/dev/null | wc -l) packets)"
if tcpdump -nn -A -r "$T/wire.pcap" 2>/dev/null | grep -q "hello from pod B"; then
  echo "!! plaintext seen on the wire"; exit 1
fi
echo "   the page text never appears on the wire: it travelled inside TLS to port 15008"
echo
echo "== access log of the proxy in pod B:"
grep "connection complete" "$T/proxy-b.log" | tail -1
echo
echo "== metrics of the proxy in pod A:"
ip netns exec $A curl -s http://127.0.0.1:15020/metrics | grep '^istio_tcp_connections_opened_total' | head -2
