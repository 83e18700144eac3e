#!/usr/bin/env bash
# The TCP connections the harness opens in a soak: LIFECYCLES lifecycles on
# the async hooks, IN_FLIGHT at once, against the simulator in its own
# process (rate limit off), under `strace -f -c -e trace=connect,socket`.
# Prints the `connect` calls, the API requests the simulator served, the
# connections per request, and the soak's CPU per lifecycle (under strace).
#
#   bash benches/soak-connections.sh [LIFECYCLES] [IN_FLIGHT]   # 500 100
#   HARNESS=/path/to/host-harness bash benches/soak-connections.sh   # another build
#       (its libcreateos_provider.so beside it, where the harness finds it)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benches/sim-lib.sh
source benches/sim-lib.sh
lifecycles=${1:-500}
in_flight=${2:-100}
prepare_soak

start_sim "$HARNESS" "$work"
strace -f -c -e trace=connect,socket -o "$work/strace.txt" -- \
    "$HARNESS" --json soak --leases "$lifecycles" --concurrency "$in_flight" \
    --config "$work/config.json" --ledger "$work/ledger.sqlite3" | tail -n 1 >"$work/soak.json" || true
stop_sim
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
connects = next((int(line.split()[3]) for line in open(f"{work}/strace.txt") if line.split()[-1:] == ["connect"]), 0)
stopped = [json.loads(line) for line in open(f"{work}/sim.json") if '"stopped"' in line]
requests = stopped[-1]["requests"] if stopped else 0
soak = json.load(open(f"{work}/soak.json"))
print(f"{connects} connects for {requests} requests ({connects / max(requests, 1):.3f} per request), "
      f"{soak['leases']} lifecycles, {sum(soak['failed'].values())} failed, "
      f"CPU/lifecycle {soak['cpuPerLifecycleMs']:.2f} ms under strace")
PY
