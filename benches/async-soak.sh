#!/usr/bin/env bash
# Async hooks at scale: whole lifecycles, all in flight at once
# (100 in flight: 1,000 lifecycles, 100 at a time), through the loaded
# CreateOS provider against the simulator run as its own process (rate
# limit off), so the harness's figures hold only the harness and the
# provider. One run reports, side by side:
#   100 / 1,000 / BIG in flight (every lifecycle a future on one thread,
#   awaiting the provider's hooks).
# Per row: lifecycles/s, failed, sandboxes left live in the simulator,
# peak threads of the harness process, resident memory added per lifecycle
# in flight, the API requests per lifecycle (the provider polls more while
# a loaded simulator is slow to create and pause) and the harness's CPU per
# lifecycle and per request.
#
#   bash benches/async-soak.sh [BIG]        # BIG defaults to 3000
#   SOAK_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 bash benches/async-soak.sh 10000
#       # the same with another allocator preloaded into the soak process only
#
# The simulator runs every command as a real process, on the same two
# cores: it is the bottleneck, and slows as lifecycles pile up. The
# provider keeps at most 1,024 requests awaiting a reply from it (its
# request gate), the rest waiting in the provider without a connection; the
# simulator bounds the commands it runs by its limit of open files (1,333
# at 20,000), the rest waiting for a running one to end. At 10,000 in
# flight a request so waits minutes: the lifecycles' hooks get a 30-minute
# timeout (`timeoutMs`), so what the row measures is the harness, not how
# long an overloaded simulator makes a hook wait.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benches/sim-lib.sh
source benches/sim-lib.sh
big=${1:-3000}
cargo build --release -q -p host-harness -p createos-provider
# Thousands of lifecycles in flight hold a connection each in both
# processes and three pipes per running command in the simulator's: the
# harness (and `sim`) raise their soft limit of open files to the hard one;
# as root, lift the hard one first (a container may refuse).
if [ "$(id -u)" = 0 ]; then ulimit -Hn 262144 2>/dev/null || true; fi
harness=./target/release/host-harness
work=$(mktemp -d)
sim=
trap '[ -n "$sim" ] && kill "$sim" 2>/dev/null; rm -rf "$work"' EXIT

# run LABEL IN_FLIGHT LIFECYCLES [SOAK ARGS...]: one soak of LIFECYCLES
# lifecycles, IN_FLIGHT at once, against a fresh simulator; prints one row.
run() {
    local label=$1 in_flight=$2 lifecycles=$3
    shift 3
    rm -f "$work"/sim.json "$work"/ledger.sqlite3*
    start_sim "$harness" "$work"
    LD_PRELOAD=${SOAK_PRELOAD:-} "$harness" --json soak --leases "$lifecycles" --concurrency "$in_flight" "$@" \
        --config "$work/config.json" --ledger "$work/ledger.sqlite3" | tail -n 1 >"$work/soak.json" || true
    stop_sim
    python3 - "$work" "$label" "$in_flight" "$lifecycles" <<'PY'
import json, sys
work, label = sys.argv[1], sys.argv[2]
in_flight, lifecycles = int(sys.argv[3]), int(sys.argv[4])
soak = json.load(open(f"{work}/soak.json"))
stopped = [json.loads(line) for line in open(f"{work}/sim.json") if '"stopped"' in line]
live = stopped[-1]["liveSandboxes"] if stopped else "?"
requests = stopped[-1]["requests"] / lifecycles if stopped else float("nan")
failed = sum(soak["failed"].values())
cpu = soak["cpuPerLifecycleMs"]
print(f"| {label:<8} | {in_flight:>6,} | {lifecycles:>6,} | {soak['lifecyclesPerS']:>8.1f} | {failed:>6} | {live:>4} | "
      f"{soak['peakThreads']:>7} | {soak['rssPerInFlightLifecycleBytes'] / 1024:>8.1f} | {requests:>6.1f} | "
      f"{cpu:>7.2f} | {cpu * 1000 / requests:>6.0f} | "
      f"{'held' if soak['invariantsHeld'] else 'BROKEN: ' + '; '.join(soak['broken'])} |")
PY
}

echo "| calls | in flight | lifecycles | lifecycles/s | failed | live sandboxes after | peak threads | RSS KiB per lifecycle in flight | requests per lifecycle | harness CPU ms per lifecycle | harness CPU µs per request | invariants |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
# 100 in flight finishes 100 lifecycles in a few seconds, too short for a
# steady CPU figure (4.8 to 7.3 ms per lifecycle over three runs): that row
# runs 1,000 lifecycles, 100 at a time. The others start every lifecycle
# at once.
run async 100 1000
run async 1000 1000
run async "$big" "$big"
