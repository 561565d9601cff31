#!/usr/bin/env bash
# Two pods talking through Ambit, on this machine: pods are network namespaces on a bridge,
# each with the in-pod capture rules and its own `ambit proxy` (dedicated mode), sharing one
# ztunnel-format config file. Pod A fetches a page from nginx in pod B; the request travels as
# HBONE (mTLS on port 15008), nginx sees A's address, and the proxies log and count it.
#
# Usage: sudo bash examples/demo.sh     (Debian/Ubuntu; installs what it needs with apt)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "demo.sh needs root (network namespaces); run: sudo bash examples/demo.sh" >&2
  exit 1
fi
need=()
for c in ip:iproute2 iptables-restore:iptables nginx:nginx-light curl:curl tcpdump:tcpdump; do
  command -v "${c%%:*}" >/dev/null || need+=("${c#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
echo "building ambit (release)…"
cargo build --release -q -p ambit
AMBIT=$PWD/target/release/ambit
. scripts/netns-lib.sh

pods_up
capture_pods
mesh_config
start_proxies

# nginx in pod B.
mkdir -p "$T/www"; echo "hello from pod B, through Ambit" > "$T/www/index.html"
cat > "$T/nginx.conf" <<NGINX
daemon off; worker_processes 1; pid $T/nginx.pid; error_log $T/nginx-error.log;
events {}
http { access_log $T/nginx-access.log; server { listen 8080; root $T/www; } }
NGINX
ip netns exec $B nginx -e "$T/nginx-error.log" -c "$T/nginx.conf" & PIDS+=($!)
sleep 0.5

ip netns exec $NODE tcpdump -i br0 -w "$T/wire.pcap" -U >/dev/null 2>&1 & TCPDUMP=$!; sleep 1
echo
echo "== pod A ($IPA): curl http://$IPB:8080/"
ip netns exec $A curl -sS --max-time 5 "http://$IPB:8080/"
sleep 0.5; kill $TCPDUMP; wait $TCPDUMP 2>/dev/null || true
echo
echo "== nginx in pod B logged the request as coming from:"
cut -d' ' -f1,6-9 "$T/nginx-access.log"
echo
echo "== packets on the wire between the pods, by source > destination:"
tcpdump -nn -r "$T/wire.pcap" 2>/dev/null | awk '{print $3, $4, $5}' | sed 's/:$//' | sort | uniq -c | sort -rn | head -6
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
