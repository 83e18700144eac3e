#!/usr/bin/env bash
# End-to-end throughput of `exec`'s output, before and after: MB/s of
# `exec -- head -c BYTES /dev/urandom > /dev/null` (binary output) and of
# `exec -- sh -c 'yes | head -c BYTES' > /dev/null` (text), each version's
# release build against its own simulator (`host-harness sim`, the journal
# CreateOS's 1 MiB, rate limit off), the two versions taking turns in one
# run so they share the machine's load. A run whose output was evicted
# ("output was evicted", exit 1) is counted, not timed.
#
# Usage: bash benches/exec-bytes.sh [BASE] [ROUNDS] [BYTES]
#   BASE    the commit to compare with (default 46d2788, the byte path
#           before the decoder and the simulator's stream were reworked)
#   ROUNDS  runs of each command per version (default 12)
#   BYTES   output per run (default 50000000)
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-46d2788}
rounds=${2:-12}
bytes=${3:-50000000}
repo=$(pwd)
work=$(mktemp -d)
sims=()
cleanup() {
    for pid in "${sims[@]}"; do kill "$pid" 2>/dev/null || true; done
    git -C "$repo" worktree remove --force "$work/base-src" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# The base builds in a target directory of its own (kept for the next run):
# cargo names a workspace crate's artifacts by its path inside the
# workspace, so two checkouts sharing one would take each other's crates
# for fresh.
git worktree add -q --detach "$work/base-src" "$base"
CARGO_TARGET_DIR="$repo/target/exec-bytes-base" cargo build --release -q \
    --manifest-path "$work/base-src/Cargo.toml" -p host-harness -p createos-provider
cargo build --release -q -p host-harness -p createos-provider
mkdir -p "$work/old" "$work/new"
cp target/exec-bytes-base/release/host-harness target/exec-bytes-base/release/libcreateos_provider.so "$work/old/"
cp target/release/host-harness target/release/libcreateos_provider.so "$work/new/"

for version in old new; do
    "$work/$version/host-harness" sim --no-rate-limit --json >"$work/$version/sim.json" &
    sims+=("$!")
done
for version in old new; do
    for _ in $(seq 1 100); do [ -s "$work/$version/sim.json" ] && break; sleep 0.1; done
done

python3 - "$work" "$rounds" "$bytes" "$base" <<'PY'
import json, statistics, subprocess, sys, time
work, rounds, size, base = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
versions = ("old", "new")
commands = {
    "random": ["head", "-c", str(size), "/dev/urandom"],
    "yes": ["sh", "-c", f"yes | head -c {size}"],
}

def harness(version, *args, **kw):
    d = f"{work}/{version}"
    return subprocess.run([f"{d}/host-harness", "--plugin", f"{d}/libcreateos_provider.so",
                           "--ledger", f"{d}/ledger.sqlite3", *args], **kw)

leases = {}
for version in versions:
    sim = json.load(open(f"{work}/{version}/sim.json"))
    config = {"companyId": "bench", "environmentId": "bench", "config": {
        "apiUrl": sim["url"], "apiKey": sim["apiKey"], "shape": "s-1vcpu-1gb",
        "reuseLease": True, "timeoutMs": 120000, "requestsPerMinute": 100000}}
    json.dump(config, open(f"{work}/{version}/config.json", "w"))
    lease = harness(version, "acquire", "--config", f"{work}/{version}/config.json",
                    capture_output=True, check=True).stdout
    open(f"{work}/{version}/lease.json", "wb").write(lease)

rates = {(v, c): [] for v in versions for c in commands}
evicted = {(v, c): 0 for v in versions for c in commands}
for _ in range(rounds):
    for name, command in commands.items():
        for version in versions:
            d = f"{work}/{version}"
            start = time.perf_counter()
            run = harness(version, "exec", "--config", f"{d}/config.json", "--lease", f"{d}/lease.json",
                          "--", *command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            elapsed = time.perf_counter() - start
            if run.returncode == 0:
                rates[(version, name)].append(size / elapsed / 1e6)
            elif b"evicted" in run.stderr:
                evicted[(version, name)] += 1
            else:
                sys.exit(f"{version} {name}: exit {run.returncode}: {run.stderr.decode(errors='replace')}")

print(f"exec output, {size:,} bytes a run, {rounds} runs per version and command, base {base}")
print(f"{'command':8} {'version':7} {'median MB/s':>11} {'min':>7} {'max':>7} {'evicted':>9}")
for name in commands:
    for version in versions:
        r = rates[(version, name)]
        cells = (f"{statistics.median(r):11.1f} {min(r):7.1f} {max(r):7.1f}" if r else f"{'-':>11} {'-':>7} {'-':>7}")
        print(f"{name:8} {version:7} {cells} {evicted[(version, name)]:>4} of {rounds}")
    old, new = rates[("old", name)], rates[("new", name)]
    if old and new:
        print(f"{name:8} ratio   {statistics.median(new) / statistics.median(old):11.2f} (new/old median MB/s)")
PY
