#!/usr/bin/env bash
# Memory-safety check of the ABI: runs provider-abi's tests, the end-to-end ABI
# tests (growth, refusals, panics, 16 threads) and `host-harness
# inspect`/`health` on every fixture library under valgrind's memcheck, and
# fails on the first invalid read, write or free. Not in CI (about ten
# minutes on two cores); run it after any change to provider-abi.
# Usage: bash scripts/valgrind-abi.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v valgrind >/dev/null; then
    apt-get update -qq && apt-get install -y -qq valgrind
fi

# Build every test binary (and the fixture libraries) once.
cargo test -p provider-abi -p e2e -p fixture-next-minor --no-run -q
cargo build -q -p host-harness

memcheck=(valgrind --quiet --error-exitcode=99 --errors-for-leak-kinds=none --track-origins=yes)
binary() { # the newest test binary called $1
    ls -t "target/debug/deps/$1"-* | grep -v '\.d$' | head -n 1
}

echo "== provider-abi unit tests"
"${memcheck[@]}" "$(binary provider_abi)" --test-threads=1 -q
echo "== fixture libraries (growth both ways, wrong majors, the forged module)"
"${memcheck[@]}" "$(binary libraries)" --test-threads=1 -q
echo "== frozen layouts"
"${memcheck[@]}" "$(binary frozen_layout)" --test-threads=1 -q
echo "== end-to-end ABI tests"
"${memcheck[@]}" "$(binary e2e)" --test-threads=1 -q abi::
for fixture in createos_provider hello_provider fixture_provider fixture_frozen fixture_next_minor; do
    library=$(ls target/debug/deps/lib"$fixture".so 2>/dev/null || ls target/debug/lib"$fixture".so)
    for command in inspect health; do
        echo "== host-harness $command --plugin $library"
        "${memcheck[@]}" target/debug/host-harness --plugin "$library" --ledger "$(mktemp -u)" "$command" >/dev/null
    done
done
echo "valgrind: 0 errors"
