#!/usr/bin/env bash
# Hot swap under load: LEASES lifecycles with CONCURRENCY in flight through
# the loaded CreateOS provider against the embedded simulator (rate limit
# off), swapping SWAPS times, alternating between two builds of the provider:
# the second is built with another version string
# (CREATEOS_PROVIDER_BUILD_TAG=swap: version `0.1.0+swap`). Prints the
# summary: failed lifecycles, leaked sandboxes, unconfirmed leases reused,
# swaps done, calls drained per swap and the longest time a new call waited
# because of a swap; then the swap lines the harness printed.
# Usage: bash benches/swap-soak.sh [LEASES] [CONCURRENCY] [SWAPS]
set -euo pipefail
cd "$(dirname "$0")/.."
leases=${1:-2000}
concurrency=${2:-50}
swaps=${3:-20}
library=libcreateos_provider.so
work=$(mktemp -d)
mkdir "$work/a" "$work/b"
# Leave target/release with the untagged build, whatever happens.
trap 'cargo build --release -q -p createos-provider; rm -rf "$work"' EXIT
CREATEOS_PROVIDER_BUILD_TAG=swap cargo build --release -q -p createos-provider
cp "target/release/$library" "$work/b/"
cargo build --release -q -p host-harness -p createos-provider
cp "target/release/$library" "$work/a/"
status=0
RUST_LOG=warn ./target/release/host-harness --plugin "$work/a/$library" --ledger "$work/ledger.sqlite3" \
    soak --leases "$leases" --concurrency "$concurrency" --no-rate-limit \
    --swap-every $((leases / swaps)) --swap-to "$work/b/$library" --swap-to "$work/a/$library" \
    >"$work/out" 2>"$work/err" || status=$?
tail -n 22 "$work/out"
grep -E "swap(ped| refused)" "$work/err" || true
echo "exit status: $status"
