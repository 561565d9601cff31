# Used by examples/demo.sh (benches/e2e.sh uses the Rust e2e harness instead): two pods (network
# namespaces) on a "node" bridge, the in-pod capture rules, a ztunnel-format config and one
# dedicated proxy per pod.
# Source it, then call: pods_up; [capture_pods; mesh_config; start_proxies]. Needs root.
# shellcheck shell=bash

T=$(mktemp -d /tmp/ambit.XXXX)
tag=$$
NODE=amb$tag-node A=amb$tag-a B=amb$tag-b
IPA=10.244.7.2 IPB=10.244.7.3
PIDS=()
PROXY_PIDS=()

cleanup() {
  for p in "${PIDS[@]}" "${PROXY_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.2
  for n in $A $B $NODE; do ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null || true; done
  for n in $A $B $NODE; do ip netns del "$n" 2>/dev/null || true; done
  rm -rf "$T"
}
trap cleanup EXIT

pods_up() {
  ip netns add $NODE; ip netns add $A; ip netns add $B
  ip -n $NODE link add br0 type bridge; ip -n $NODE link set br0 up; ip -n $NODE link set lo up
  ip -n $NODE addr add 10.244.7.1/24 dev br0
  local i=2 p
  for p in $A $B; do
    ip link add v$tag$i type veth peer name eth0 netns $p
    ip link set v$tag$i netns $NODE
    ip -n $NODE link set v$tag$i master br0 up
    ip -n $p link set lo up; ip -n $p link set eth0 up
    ip -n $p addr add 10.244.7.$i/24 dev eth0
    ip -n $p route add default via 10.244.7.1
    ip netns exec $p sysctl -qw net.ipv4.tcp_migrate_req=1 2>/dev/null || true
    i=$((i+1))
  done
}

# In-pod capture rules (what the node agent installs; ../shared/spec/node-agent.md §2.8.1).
capture_pods() {
  local p
  for p in $A $B; do
    # The spec's default rule set (DNS capture included), kept once as the redirect crate's golden file.
    ip netns exec $p iptables-restore --noflush < crates/redirect/testdata/spec-default-v4.rules
    ip -n $p route add local 0.0.0.0/0 dev lo table 100
    ip -n $p rule add fwmark 0x111/0xfff lookup 100 pref 32764
  done
}

uncapture_pods() {
  local p
  for p in $A $B; do
    ip netns exec $p iptables -t nat -F; ip netns exec $p iptables -t mangle -F; ip netns exec $p iptables -t raw -F
    ip -n $p rule del fwmark 0x111/0xfff lookup 100 pref 32764 2>/dev/null || true
    ip -n $p route flush table 100 2>/dev/null || true
  done
}

# Mesh config in ztunnel's local-config format, and a shared development CA.
mesh_config() {
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
}

# start_proxy NETNS WORKLOAD-INFO LOGFILE [ENV=VALUE...]
start_proxy() {
  local ns=$1 info=$2 log=$3; shift 3
  ip netns exec "$ns" env PROXY_MODE=dedicated PROXY_WORKLOAD_INFO="$info" LOCAL_XDS_PATH="$T/mesh.yaml" \
    XDS_ADDRESS= FAKE_CA=true FAKE_CA_ROOT="$T/ca" PACKET_MARK=1337 "$@" "$AMBIT" proxy >"$log" 2>&1 &
  PROXY_PIDS+=($!)
  local _
  for _ in $(seq 200); do
    ip netns exec "$ns" curl -sf http://127.0.0.1:15021/healthz/ready >/dev/null && return 0
    sleep 0.05
  done
  echo "proxy in $ns did not become ready:" >&2; cat "$log" >&2; return 1
}

start_proxies() {
  start_proxy $A default/client/client "$T/proxy-a.log" "$@"
  start_proxy $B default/web/web "$T/proxy-b.log" "$@"
}

stop_proxies() {
  local p
  for p in "${PROXY_PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  PROXY_PIDS=()
}
