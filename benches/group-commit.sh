#!/usr/bin/env bash
# Group commit of the SQLite ledger (issue 39): whole lifecycles on the
# async hooks, IN_FLIGHT at once, against the simulator in its own process
# (rate limit off), and what the ledger paid for them: the harness's CPU per
# lifecycle, its `fsync` calls per lifecycle (counted by `strace -f`, in a
# second run, since tracing slows the process) and the ledger's transactions
# and writes per lifecycle (the soak summary's `ledger` counters).
#
#   bash benches/group-commit.sh [LIFECYCLES] [IN_FLIGHT]    # 1000 100
#   HARNESS=/path/to/host-harness bash benches/group-commit.sh   # another build
#       (its libcreateos_provider.so beside it, where the harness finds it)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benches/sim-lib.sh
source benches/sim-lib.sh
lifecycles=${1:-1000}
in_flight=${2:-100}
prepare_soak

# soak [TRACE]: one soak against a fresh simulator; prints its summary line.
soak() {
    rm -f "$work"/sim.json "$work"/ledger.sqlite3*
    start_sim "$HARNESS" "$work"
    local trace=()
    [ "${1:-}" = trace ] && trace=(strace -f -c -e trace=fsync,fdatasync -o "$work/strace.txt")
    "${trace[@]}" "$HARNESS" --json soak --leases "$lifecycles" --concurrency "$in_flight" \
        --config "$work/config.json" --ledger "$work/ledger.sqlite3" | tail -n 1 >"$work/soak.json" || true
    stop_sim
}

soak
python3 - "$work" "$lifecycles" <<'PY'
import json, sys
work, lifecycles = sys.argv[1], int(sys.argv[2])
soak = json.load(open(f"{work}/soak.json"))
ledger = soak.get("ledger") or {}
commits, writes = ledger.get("commits"), ledger.get("writes")
per = lambda n: f"{n / lifecycles:.2f}" if n is not None else "-"
print(f"lifecycles/s {soak['lifecyclesPerS']:.1f}, failed {sum(soak['failed'].values())}, "
      f"CPU/lifecycle {soak['cpuPerLifecycleMs']:.2f} ms, commits/lifecycle {per(commits)}, "
      f"writes/lifecycle {per(writes)}, invariants {'held' if soak['invariantsHeld'] else soak['broken']}")
PY
soak trace
python3 - "$work" "$lifecycles" <<'PY'
import sys
work, lifecycles = sys.argv[1], int(sys.argv[2])
calls = 0
for line in open(f"{work}/strace.txt"):
    fields = line.split()
    if fields and fields[-1] in ("fsync", "fdatasync"):
        calls += int(fields[3])  # % time, seconds, usecs/call, calls
print(f"fsyncs/lifecycle {calls / lifecycles:.2f} (strace -f, second run)")
PY
