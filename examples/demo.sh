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

T=$(mktemp -d /tmp/ambit-demo.XXXX)
tag=$$
NODE=demo$tag-node A=demo$tag-a B=demo$tag-b
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for n in $A $B $NODE; do ip netns del "$n" 2>/dev/null || true; done
  rm -rf "$T"
}
trap cleanup EXIT

# Network: a "node" with a bridge, two pods with veths and addresses (dual-stack).
ip netns add $NODE; ip netns add $A; ip netns add $B
ip -n $NODE link add br0 type bridge; ip -n $NODE link set br0 up; ip -n $NODE link set lo up
ip -n $NODE addr add 10.244.7.1/24 dev br0
i=2
for p in $A $B; do
  ip link add v$tag$i type veth peer name eth0 netns $p
  ip link set v$tag$i netns $NODE
  ip -n $NODE link set v$tag$i master br0 up
  ip -n $p link set lo up; ip -n $p link set eth0 up
  ip -n $p addr add 10.244.7.$i/24 dev eth0
  ip -n $p route add default via 10.244.7.1
  i=$((i+1))
done
IPA=10.244.7.2 IPB=10.244.7.3

# In-pod capture rules (the ones the node agent installs; see ../shared/spec/node-agent.md §2.8).
for p in $A $B; do
  ip netns exec $p iptables-restore --noflush <<'RULES'
* mangle
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
COMMIT
* nat
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A OUTPUT -j ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A ISTIO_PRERT -s 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -d 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
COMMIT
RULES
  ip -n $p route add local 0.0.0.0/0 dev lo table 100
  ip -n $p rule add fwmark 0x111/0xfff lookup 100 pref 32764
done

# Mesh config in ztunnel's local-config format, and a shared development CA.
cat > "$T/mesh.yaml" <<YAML
workloads:
- uid: demo//v1/Pod/default/client
  name: client
  namespace: default
  serviceAccount: client
  trustDomain: cluster.local
  workloadIps: ["$IPA"]
  protocol: HBONE
- uid: demo//v1/Pod/default/web
  name: web
  namespace: default
  serviceAccount: web
  trustDomain: cluster.local
  workloadIps: ["$IPB"]
  protocol: HBONE
policies: []
services: []
YAML
"$AMBIT" dev-ca init "$T/ca" >/dev/null

start_proxy() { # netns workload-info log
  ip netns exec "$1" env PROXY_MODE=dedicated PROXY_WORKLOAD_INFO="$2" LOCAL_XDS_PATH="$T/mesh.yaml" \
    FAKE_CA=true FAKE_CA_ROOT="$T/ca" PACKET_MARK=1337 "$AMBIT" proxy >"$3" 2>&1 &
  PIDS+=($!)
}
start_proxy $A default/client/client "$T/proxy-a.log"
start_proxy $B default/web/web "$T/proxy-b.log"

# nginx in pod B.
mkdir -p "$T/www"; echo "hello from pod B, through Ambit" > "$T/www/index.html"
cat > "$T/nginx.conf" <<NGINX
daemon off; worker_processes 1; pid $T/nginx.pid; error_log $T/nginx-error.log;
events {}
http { access_log $T/nginx-access.log; server { listen 8080; root $T/www; } }
NGINX
ip netns exec $B nginx -c "$T/nginx.conf" & PIDS+=($!)
for p in $A $B; do
  for _ in $(seq 100); do
    ip netns exec $p curl -sf http://127.0.0.1:15021/healthz/ready >/dev/null && break; sleep 0.1
  done
done

ip netns exec $NODE tcpdump -i br0 -w "$T/wire.pcap" -U >/dev/null 2>&1 & TCPDUMP=$!; sleep 1
echo
echo "== pod A: curl http://$IPB:8080/"
ip netns exec $A curl -sS --max-time 5 "http://$IPB:8080/"
sleep 0.5; kill $TCPDUMP; wait $TCPDUMP 2>/dev/null || true
echo
echo "== nginx in pod B saw the request from (A is $IPA):"
cut -d' ' -f1,6-9 "$T/nginx-access.log"
echo
echo "== on the wire between the pods (ports):"
tcpdump -nn -r "$T/wire.pcap" 2>/dev/null | awk '{print $3, $4, $5}' | sed 's/:$//' | sort | uniq -c | sort -rn | head -6
if tcpdump -nn -A -r "$T/wire.pcap" 2>/dev/null | grep -q "hello from pod B"; then
  echo "!! plaintext seen on the wire"; exit 1
else
  echo "   (the page text never appears on the wire: it travelled inside TLS on port 15008)"
fi
echo
echo "== access log of the proxy in pod B:"
grep "connection complete" "$T/proxy-b.log" | tail -1
echo
echo "== metrics of the proxy in pod A:"
ip netns exec $A curl -s http://127.0.0.1:15020/metrics | grep '^istio_tcp_connections_opened_total' | head -2
