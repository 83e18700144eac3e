#!/usr/bin/env bash
# Isolation soak: N lifecycles with C in flight through the CreateOS provider
# in a worker process (--isolate) that aborts on SHARE of its hook calls
# (the crashy-createos fixture), against the embedded simulator (rate limit
# off), whose live set the summary reads. Prints the summary and how many
# crashes the fixture announced and the harness reported.
# Usage: bash benches/isolated-soak.sh [LEASES] [CONCURRENCY] [SHARE]
set -euo pipefail
cd "$(dirname "$0")/.."
leases=${1:-1000}
concurrency=${2:-20}
share=${3:-0.01}
cargo build --release -q -p host-harness -p crashy-createos
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
CRASHY_CRASH_SHARE=$share RUST_LOG=warn ./target/release/host-harness --isolate \
    --plugin target/release/libcrashy_createos.so --ledger "$work/ledger.sqlite3" \
    soak --leases "$leases" --concurrency "$concurrency" --no-rate-limit \
    >"$work/out" 2>"$work/err" || status=$?
sed -n '/ lifecycles in /,$p' "$work/out"
echo "crashes announced by the fixture: $(grep -c 'crashy: aborting in' "$work/err" || true)"
echo "crashes reported by the harness:  $(grep -c 'the provider worker (pid' "$work/err" || true)"
echo "exit status: $status"
