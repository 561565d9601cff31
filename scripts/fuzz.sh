#!/usr/bin/env bash
# Builds and runs every fuzz target in fuzz/ for SECONDS (default 60) each, one after the other, on the
# seed corpora that fuzz/src/bin/seeds.rs writes (plus whatever earlier runs added), and prints
# one line per target: executions, corpus size, and whether it crashed. Exits non-zero if any
# target crashed (its input is kept in fuzz/artifacts/<target>/) or did not build.
#
# Usage: bash scripts/fuzz.sh [SECONDS]     (as root or not; needs a C/C++ compiler and Rust)
# The toolchain may be stable: cargo-fuzz's nightly flags are allowed with RUSTC_BOOTSTRAP=1.
# Installs cargo-fuzz with `cargo install` when it is missing. CARGO=lcargo uses another cargo.
set -euo pipefail
cd "$(dirname "$0")/.."

SECS=${1:-60}
CARGO_FUZZ_VERSION=0.13.2
# No sanitizer: the crates are `unsafe`-free (ASan would only slow the search); debug
# assertions on, so overflows and other debug checks abort like a crash.
FLAGS=(-s none --debug-assertions)
export RUSTC_BOOTSTRAP=1
: "${CARGO:=cargo}"

if ! "$CARGO" fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz $CARGO_FUZZ_VERSION"
    "$CARGO" install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION"
fi

targets=()
for f in fuzz/fuzz_targets/*.rs; do
    targets+=("$(basename "$f" .rs)")
done

echo "building ${#targets[@]} fuzz targets"
"$CARGO" fuzz build "${FLAGS[@]}"
# The binaries run directly (not through cargo, which would hold the build lock meanwhile).
bin="${CARGO_TARGET_DIR:-fuzz/target}/$(rustc -vV | awk '/^host:/ {print $2}')/release"
# The seed generator is built with the targets (same flags, same target dir).
AMBIT_FUZZ_SEEDS=fuzz/corpus "$bin/seeds"

status=0
printf '%-22s %12s %8s  %s\n' target execs corpus result
for t in "${targets[@]}"; do
    log=$(mktemp)
    mkdir -p "fuzz/artifacts/$t"
    set +e
    "$bin/$t" "fuzz/corpus/$t" \
        -max_total_time="$SECS" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
        -artifact_prefix="fuzz/artifacts/$t/" >"$log" 2>&1
    rc=$?
    set -e
    execs=$(awk '/stat::number_of_executed_units:/ {print $2}' "$log")
    corpus=$(find "fuzz/corpus/$t" -type f | wc -l)
    if [ "$rc" -eq 0 ]; then
        result=ok
    else
        result="CRASH (exit $rc), see fuzz/artifacts/$t/"
        status=1
        grep -E 'panicked|ERROR: libFuzzer|SUMMARY|Test unit written' "$log" | head -5 >&2 || true
    fi
    printf '%-22s %12s %8s  %s\n' "$t" "${execs:-?}" "$corpus" "$result"
    rm -f "$log"
done
exit "$status"
