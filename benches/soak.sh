#!/usr/bin/env bash
# Scale soak: N lifecycles with C in flight through the loaded CreateOS
# provider, against the simulator run as its own process (rate limit off),
# so the harness's memory, threads and CPU figures hold only the harness and
# the provider. Usage: bash benches/soak.sh [LEASES] [CONCURRENCY] [PLUGIN]
# [SOAK OPTIONS...] (for instance --faults hostile).
set -euo pipefail
cd "$(dirname "$0")/.."
leases=${1:-1000}
concurrency=${2:-100}
cargo build --release -q -p host-harness -p createos-provider
harness=./target/release/host-harness
work=$(mktemp -d)
trap 'kill "$sim" 2>/dev/null || true; rm -rf "$work"' EXIT

"$harness" sim --no-rate-limit --json >"$work/sim.json" &
sim=$!
for _ in $(seq 1 100); do [ -s "$work/sim.json" ] && break; sleep 0.1; done
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
sim = json.load(open(f"{work}/sim.json"))
config = {"companyId": "bench", "environmentId": "bench", "config": {
    "apiUrl": sim["url"], "apiKey": sim["apiKey"], "shape": "s-1vcpu-1gb",
    "reuseLease": True, "timeoutMs": 120000, "requestsPerMinute": 100000}}
json.dump(config, open(f"{work}/config.json", "w"))
PY
plugin=()
[ -n "${3:-}" ] && plugin=(--plugin "$3")
"$harness" "${plugin[@]}" soak --leases "$leases" --concurrency "$concurrency" "${@:4}" \
    --config "$work/config.json" --ledger "$work/ledger.sqlite3" | tail -n 14
