#!/usr/bin/env bash
# Builds Ambit's images (deploy/images/Dockerfile) with the first container engine that works
# here: docker (with a reachable daemon), podman or buildah. Tags are <registry>/ambit:<version>
# and <registry>/ambit-agent:<version>, <version> being the workspace's, which is the chart's
# appVersion, so the chart's default tag names exactly these images.
#
#   deploy/images/build.sh [--registry REGISTRY] [--push] [--dry-run]
#
# REGISTRY defaults to the chart's image.registry (localhost/ambit). --dry-run prints the
# commands without running them. Exits 2 when no engine is usable (nothing is built then).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
registry="localhost/ambit"
push=false
dry_run=false
while [[ $# -gt 0 ]]; do
    case "$1" in
        --registry) registry="${2:?--registry needs a value}"; shift 2 ;;
        --push) push=true; shift ;;
        --dry-run) dry_run=true; shift ;;
        -h|--help) sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 1 ;;
    esac
done
registry="${registry%/}"

# The version: [workspace.package] in Cargo.toml; the chart must say the same.
version="$(awk '/^\[workspace.package\]/ { p = 1; next } /^\[/ { p = 0 } p && $1 == "version" { gsub(/"/, "", $3); print $3; exit }' "$repo/Cargo.toml")"
app_version="$(awk '$1 == "appVersion:" { gsub(/"/, "", $2); print $2 }' "$repo/deploy/charts/ambit/Chart.yaml")"
if [[ -z "$version" || "$version" != "$app_version" ]]; then
    echo "error: Cargo.toml's workspace version ($version) and the chart's appVersion ($app_version) differ; the chart's default tag would name other binaries" >&2
    exit 1
fi

# ENGINES (space separated) overrides the candidates, e.g. ENGINES=podman.
engine=""
for candidate in ${ENGINES:-docker podman buildah}; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    case "$candidate" in
        # A docker client without a daemon cannot build.
        docker) docker info >/dev/null 2>&1 || continue ;;
        podman) podman info >/dev/null 2>&1 || continue ;;
        buildah) buildah version >/dev/null 2>&1 || continue ;;
    esac
    engine="$candidate"
    break
done
if [[ -z "$engine" ]]; then
    if $dry_run; then
        engine="${ENGINES:-docker}"
        engine="${engine%% *}"
    else
        echo "error: no usable container engine (tried: ${ENGINES:-docker podman buildah}; docker needs a running daemon); nothing was built" >&2
        exit 2
    fi
fi

run() {
    printf '+ %s\n' "$*"
    $dry_run || "$@"
}

for target in ambit ambit-agent; do
    tag="$registry/$target:$version"
    case "$engine" in
        buildah) run buildah build --layers --target "$target" -t "$tag" -f "$repo/deploy/images/Dockerfile" "$repo" ;;
        *) run "$engine" build --target "$target" -t "$tag" -f "$repo/deploy/images/Dockerfile" "$repo" ;;
    esac
    if $push; then
        run "$engine" push "$tag"
    fi
done
echo "images: $registry/ambit:$version $registry/ambit-agent:$version (helm: --set image.registry=$registry)"
