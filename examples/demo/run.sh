#!/usr/bin/env bash
# The whole mesh on this machine, in one command: installs what `ambit up` needs (apt), builds
# `ambit` and the CNI plugin `ambit-cni` (release), then runs `ambit up --demo`: a two-node
# cluster of network namespaces with `ambit control`, and per node `ambit agent` and
# `ambit proxy`; the pods of examples/demo/demo.yaml created through the real CNI chain; every
# flow of the demo run and checked (the verdict table). The cluster stays up afterwards:
# `target/release/ambit status` shows it, `target/release/ambit down` removes all of it.
#
# Usage, as root: bash examples/demo/run.sh   (Debian/Ubuntu with Rust; the C toolchain is
# installed with apt if missing)
set -euo pipefail

cd "$(dirname "$0")/../.."

if [ "$(id -u)" -ne 0 ]; then
  echo "run.sh needs root (network namespaces, links, cgroups); run it as root: bash examples/demo/run.sh" >&2
  exit 1
fi
need=()
for c in cc:build-essential ip:iproute2 sysctl:procps /usr/lib/cni/bridge:containernetworking-plugins; do
  tool=${c%%:*}
  if [ "${tool#/}" != "$tool" ]; then [ -x "$tool" ] || need+=("${c#*:}"); continue; fi
  command -v "$tool" >/dev/null || need+=("${c#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    ca-certificates "${need[@]}" >/dev/null
fi
echo "building ambit and ambit-cni (release)…"
cargo build --release -q -p ambit -p ambit-cni
exec target/release/ambit up --demo
