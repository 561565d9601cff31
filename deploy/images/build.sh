#!/usr/bin/env bash
# Builds Ambit's images with buildah, from scratch: our release binaries and files taken from
# Debian 12 packages (no base image, no registry). Same binaries and packages, same digests.
#
#   deploy/images/build.sh [--ambit PATH] [--ambit-cni PATH] [--out DIR] [--registry REG]
#
#   ambit        the binaries (`ambit` with its `install-cni` and `ztunnel` links, the CNI
#                plugin) and the C libraries they link (libc, libm, libgcc_s): the control plane,
#                the node proxy, and the agent with its nftables backend. User 65532 unless the
#                pod says otherwise (the chart runs the proxy as root, as it must).
#   ambit-agent  the same plus iptables (legacy and nft variants, for the agent's iptables
#                backend) and the libraries and /etc/protocols it needs.
#
# Each image is tagged <REG>/<name>:<version> (REG defaults to the chart's image.registry,
# localhost/ambit; version is the workspace's, which is the chart's appVersion), and also under
# the names Istio's charts use (<REG>/ztunnel for ambit, <REG>/install-cni for ambit-agent), and
# written to <DIR>/<name>.tar as an OCI archive (DIR defaults to target/images), with
# <name>.packages.txt beside it (also in the image, /usr/share/doc/ambit/packages.txt): every
# Debian package files came from, with its version, and the sha256 of each binary.
#
# Needs: buildah, apt-get (the Debian packages are downloaded into $AMBIT_IMAGE_DEBS, default
# <DIR>/debs), dpkg-deb, readelf, strip. Run as root (buildah's storage).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
registry="localhost/ambit"
ambit_bin="$repo/target/release/ambit"
cni_bin="$repo/target/release/ambit-cni"
out="$repo/target/images"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --ambit) ambit_bin="${2:?--ambit needs a path}"; shift 2 ;;
        --ambit-cni) cni_bin="${2:?--ambit-cni needs a path}"; shift 2 ;;
        --out) out="${2:?--out needs a directory}"; shift 2 ;;
        --registry) registry="${2:?--registry needs a value}"; shift 2 ;;
        -h|--help) sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 1 ;;
    esac
done
registry="${registry%/}"

for tool in buildah apt-get dpkg-deb readelf strip sha256sum; do
    command -v "$tool" >/dev/null || { echo "error: $tool is not installed (apt-get install buildah binutils)" >&2; exit 1; }
done
for bin in "$ambit_bin" "$cni_bin"; do
    [[ -x "$bin" ]] || { echo "error: $bin is not there; build it first: cargo build --release -p ambit -p ambit-cni" >&2; exit 1; }
done

# The version: [workspace.package] in Cargo.toml; the chart must say the same.
version="$(awk '/^\[workspace.package\]/ { p = 1; next } /^\[/ { p = 0 } p && $1 == "version" { gsub(/"/, "", $3); print $3; exit }' "$repo/Cargo.toml")"
app_version="$(awk '$1 == "appVersion:" { gsub(/"/, "", $2); print $2 }' "$repo/deploy/charts/ambit/Chart.yaml")"
if [[ -z "$version" || "$version" != "$app_version" ]]; then
    echo "error: Cargo.toml's workspace version ($version) and the chart's appVersion ($app_version) differ; the chart's default tag would name other binaries" >&2
    exit 1
fi
commit="$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)"
if [[ "$commit" != unknown ]] && ! git -C "$repo" diff --quiet HEAD -- 2>/dev/null; then
    commit="$commit-dirty"
fi

mkdir -p "$out"
out="$(cd "$out" && pwd)"
debs="${AMBIT_IMAGE_DEBS:-$out/debs}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The Debian packages files are taken from. apt-get download fetches the candidate version of
# each (the machine's Debian 12 sources); the versions land in the package list.
base_packages=(libc6 libgcc-s1)
agent_packages=(iptables libip4tc2 libip6tc2 libxtables12 libmnl0 libnetfilter-conntrack3 libnfnetlink0 libnftnl11 netbase)
mkdir -p "$debs" "$work/debs"
for p in "${base_packages[@]}" "${agent_packages[@]}"; do
    deb="$(find "$debs" -maxdepth 1 -name "${p}_*.deb" | sort | tail -1)"
    if [[ -z "$deb" ]]; then
        (cd "$debs" && apt-get download -q -o APT::Sandbox::User=root "$p" >/dev/null) || { echo "error: apt-get download $p failed (run apt-get update?)" >&2; exit 1; }
        deb="$(find "$debs" -maxdepth 1 -name "${p}_*.deb" | sort | tail -1)"
    fi
    dpkg-deb -x "$deb" "$work/debs/all"
    printf '%s %s\n' "$(dpkg-deb -f "$deb" Package)" "$(dpkg-deb -f "$deb" Version)" >>"$work/versions"
done
tree="$work/debs/all"

# Copies file $1 (a path inside the extracted packages) into root $2, symlinks and all.
take() {
    local path="$1" root="$2"
    mkdir -p "$root/$(dirname "$path")"
    cp -a "$tree/$path" "$root/$path"
    if [[ -L "$tree/$path" ]]; then
        local target
        target="$(readlink "$tree/$path")"
        [[ "$target" = /* ]] || target="$(dirname "$path")/$target"
        take "$target" "$root"
    fi
}

# The shared libraries ELF file $1 needs, found in the extracted packages, copied into root $2
# (with what they need in turn). A library found nowhere is an error: the image would not run.
libs_of() {
    local elf="$1" root="$2" lib path
    for lib in $(readelf -d "$elf" | awk '/NEEDED/ { gsub(/[\[\]]/, "", $5); print $5 }'); do
        path=""
        for dir in lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu; do
            [[ -e "$tree/$dir/$lib" ]] && { path="$dir/$lib"; break; }
        done
        [[ -n "$path" ]] || { echo "error: $elf needs $lib, which no listed Debian package has" >&2; exit 1; }
        [[ -e "$root/$path" ]] && continue
        take "$path" "$root"
        libs_of "$tree/$path" "$root"
    done
}

# The files both images hold.
base="$work/root-ambit"
mkdir -p "$base/usr/local/bin" "$base/opt/cni/bin" "$base/usr/share/doc/ambit" "$base/tmp"
chmod 1777 "$base/tmp"
strip -o "$base/usr/local/bin/ambit" "$ambit_bin"
strip -o "$base/opt/cni/bin/ambit-cni" "$cni_bin"
chmod 0755 "$base/usr/local/bin/ambit" "$base/opt/cni/bin/ambit-cni"
ln -s ambit "$base/usr/local/bin/install-cni"
ln -s ambit "$base/usr/local/bin/ztunnel"
ln -s /opt/cni/bin/ambit-cni "$base/usr/local/bin/ambit-cni"
take lib64/ld-linux-x86-64.so.2 "$base"
libs_of "$base/usr/local/bin/ambit" "$base"
libs_of "$base/opt/cni/bin/ambit-cni" "$base"

# The agent's: iptables and ip6tables, legacy and nft, with -save and -restore (the agent picks
# the variant the node uses); the plain names are the nft variant, as Debian's default.
agent="$work/root-ambit-agent"
cp -a "$base" "$agent"
for multi in xtables-legacy-multi xtables-nft-multi; do
    take "usr/sbin/$multi" "$agent"
    libs_of "$tree/usr/sbin/$multi" "$agent"
done
for fam in iptables ip6tables; do
    for variant in legacy nft; do
        for suffix in "" -save -restore; do
            take "usr/sbin/$fam-$variant$suffix" "$agent"
        done
    done
    for suffix in "" -save -restore; do
        ln -s "$fam-nft$suffix" "$agent/usr/sbin/$fam$suffix"
    done
done
mkdir -p "$agent/usr/lib/x86_64-linux-gnu/xtables" "$agent/etc" "$agent/run/xtables"
cp -a "$tree/usr/lib/x86_64-linux-gnu/xtables/." "$agent/usr/lib/x86_64-linux-gnu/xtables/"
for ext in "$agent"/usr/lib/x86_64-linux-gnu/xtables/*.so; do
    libs_of "$ext" "$agent"
done
cp -a "$tree/etc/protocols" "$tree/etc/services" "$agent/etc/"

# The package list of each image: the packages its files came from, and the binaries.
list() {
    local root="$1" name="$2"
    shift 2
    {
        echo "# $name $version ($commit): the Debian packages its files come from, then the binaries"
        grep -E "^($(IFS='|'; echo "$*")) " "$work/versions" | sort
        (cd "$root" && sha256sum usr/local/bin/ambit opt/cni/bin/ambit-cni | awk '{ print "file /" $2 " sha256:" $1 }')
    } >"$out/$name.packages.txt"
    cp "$out/$name.packages.txt" "$root/usr/share/doc/ambit/packages.txt"
}
list "$base" ambit "${base_packages[@]}"
list "$agent" ambit-agent "${base_packages[@]}" "${agent_packages[@]}"

# One image from a root directory. Every file is stamped with the epoch and owned by root, and
# the commit's timestamp is the epoch too, so the same input gives the same digest.
image() {
    local name="$1" root="$2" user="$3" istio_name="$4"
    shift 4
    find "$root" -exec touch -h -d @0 {} +
    local ctr
    ctr="$(buildah from --quiet scratch)"
    buildah copy --quiet --chown 0:0 "$ctr" "$root/" / >/dev/null
    buildah config \
        --os linux --arch amd64 \
        --entrypoint '["/usr/local/bin/ambit"]' --cmd '' \
        --user "$user" --workingdir / \
        --label "org.opencontainers.image.title=$name" \
        --label "org.opencontainers.image.version=$version" \
        --label "org.opencontainers.image.revision=$commit" \
        --label "org.opencontainers.image.licenses=Apache-2.0" \
        "$@" "$ctr"
    buildah commit --quiet --timestamp 0 --rm "$ctr" "$registry/$name:$version" >/dev/null
    buildah tag "$registry/$name:$version" "$registry/$istio_name:$version"
    rm -f "$out/$name.tar"
    buildah push --quiet "$registry/$name:$version" "oci-archive:$out/$name.tar:$registry/$name:$version" >/dev/null
    local digest size
    digest="$(buildah inspect --type image --format '{{.FromImageDigest}}' "$registry/$name:$version")"
    size="$(du -k "$out/$name.tar" | cut -f1)"
    printf '%-12s %s/%s:%s (also %s/%s:%s)  %s  %s KiB  %s\n' "$name" "$registry" "$name" "$version" \
        "$registry" "$istio_name" "$version" "$digest" "$size" "$out/$name.tar"
}
image ambit "$base" 65532:65532 ztunnel
# The root filesystem is read-only in the chart; iptables-legacy's lock goes to the emptyDir
# the chart mounts at /run/xtables.
image ambit-agent "$agent" 0:0 install-cni --env XTABLES_LOCKFILE=/run/xtables/xtables.lock
