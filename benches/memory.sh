#!/usr/bin/env bash
# The node proxy's memory at scale (issue 30): loads the generated mesh (N workloads, N/10
# services, one policy per 100 workloads; `ambit_proxy::testing::generated::mesh`) from the
# local-config file into a dedicated `ambit proxy` (NODE_NAME=node-0, as a node proxy runs) and
# reports, per N and file format: time to ready (process start → 200 on /healthz/ready), RSS once
# ready, RSS 5 s later, and peak RSS (VmHWM). With ZTUNNEL=/path/to/ztunnel the same file goes
# through that binary too, in the same round. The xDS path: crates/ambit/tests/bench_xds.rs.
#
# Each proxy runs in a fresh anonymous network namespace (`unshare -n`: its ports collide with
# nothing on the host, and nothing is left behind). As root.
#
# Usage:  bash benches/memory.sh [SIZES] [AMBIT]
#         SIZES  comma-separated workload counts (default 10000,100000; the local file holds
#                at most 1 000 000 workloads)
#         AMBIT  the binary (default target/release/ambit; build it without `--features jemalloc`
#                for the system allocator, as the issue's table was measured)
# Env:    ZTUNNEL   a ztunnel binary to run on the same files
#         FORMATS   file formats, comma-separated (default yaml,json: the same mesh as YAML and as
#                   JSON, which both proxies read as YAML; Ambit reads JSON with a JSON parser)
#         MESH_DIR  where the mesh files are written (default target/memory-bench)
#         ROUNDS    runs per binary, size and format (default 1)
#         READY_TIMEOUT  seconds a proxy may take to become ready (default 600)
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${1:-10000,100000}
AMBIT=${2:-${CARGO_TARGET_DIR:-target}/release/ambit}
MESH_DIR=${MESH_DIR:-${CARGO_TARGET_DIR:-target}/memory-bench}
ROUNDS=${ROUNDS:-1}
FORMATS=${FORMATS:-yaml,json}
mkdir -p "$MESH_DIR"
MESH_DIR=$(realpath "$MESH_DIR")

missing=""
for n in ${SIZES//,/ }; do
  [ -s "$MESH_DIR/mesh-$n.yaml" ] && [ -s "$MESH_DIR/mesh-$n.json" ] || missing="$missing,$n"
done
if [ -n "$missing" ]; then
  AMBIT_SCALE_DIR="$MESH_DIR" AMBIT_SCALE_SIZES="${missing#,}" \
    cargo test -q -p ambit-proxy --test memory -- --ignored write_scale_meshes --nocapture >/dev/null
fi

# One run: prints "ready_s rss_ready_kib rss_settled_kib hwm_kib".
run_one() {
  local kind=$1 bin=$2 file=$3
  unshare -n bash -s "$kind" "$bin" "$file" <<'EOF'
set -euo pipefail
kind=$1 bin=$2 file=$3
ip link set lo up
log=$(mktemp)
export LOCAL_XDS_PATH="$file" XDS_ADDRESS="" PROXY_MODE=dedicated \
  PROXY_WORKLOAD_INFO=ns0/app-0-5d9c7b8f4-0/app-0 NODE_NAME=node-0 RUST_LOG=warn ZTUNNEL_WORKER_THREADS=2
start=$(date +%s.%N)
if [ "$kind" = ambit ]; then
  FAKE_CA=true "$bin" proxy >"$log" 2>&1 &
else
  # A ztunnel built without its `testing` feature has no fake CA: point it at an address where
  # nothing listens (certificates are fetched on demand; loading and readiness do not wait).
  (cd "$(dirname "$log")" && CA_ADDRESS=https://127.0.0.1:15012 exec "$bin" proxy ztunnel >"$log" 2>&1) &
fi
pid=$!
ready=""
deadline=$(( $(date +%s) + ${READY_TIMEOUT:-600} ))
while [ "$(date +%s)" -lt "$deadline" ]; do
  if ! kill -0 "$pid" 2>/dev/null; then echo "the proxy exited:" >&2; tail -20 "$log" >&2; exit 1; fi
  if [ "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:15021/healthz/ready)" = 200 ]; then
    ready=$(date +%s.%N); break
  fi
  sleep 0.01
done
[ -n "$ready" ] || { echo "not ready in ${READY_TIMEOUT:-600} s" >&2; tail -20 "$log" >&2; kill "$pid"; exit 1; }
rss() { awk -v k="$1:" '$1 == k { print $2 }' "/proc/$pid/status"; }
rss_ready=$(rss VmRSS)
sleep 5
rss_settled=$(rss VmRSS)
hwm=$(rss VmHWM)
if [ -n "${VERIFY:-}" ]; then
  # What the proxy holds (after the figures: a dump of the whole state moves the RSS).
  curl -s http://127.0.0.1:15000/config_dump | python3 -c 'import json,sys; d=json.load(sys.stdin); print("  dump:", {k: len(v) for k, v in d.items() if isinstance(v, list)}, file=sys.stderr)'
fi
kill "$pid"; wait "$pid" 2>/dev/null || true
rm -f "$log"
echo "$(echo "$ready - $start" | bc -l) $rss_ready $rss_settled $hwm"
EOF
}

printf '%-8s %-9s %-6s %-5s %12s %16s %18s %14s\n' proxy workloads format round "ready (s)" "RSS ready (MiB)" "RSS +5 s (MiB)" "peak (MiB)"
for n in ${SIZES//,/ }; do
  for format in ${FORMATS//,/ }; do
    file="$MESH_DIR/mesh-$n.$format"
    for r in $(seq 1 "$ROUNDS"); do
      for kind in ambit ${ZTUNNEL:+ztunnel}; do
        bin=$AMBIT
        [ "$kind" = ztunnel ] && bin=$ZTUNNEL
        read -r t a b h < <(run_one "$kind" "$bin" "$file")
        printf '%-8s %-9s %-6s %-5s %12.3f %16.1f %18.1f %14.1f\n' "$kind" "$n" "$format" "$r" "$t" \
          "$(echo "$a/1024" | bc -l)" "$(echo "$b/1024" | bc -l)" "$(echo "$h/1024" | bc -l)"
      done
    done
  done
done
