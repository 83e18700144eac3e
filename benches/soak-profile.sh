#!/usr/bin/env bash
# Where the harness's CPU goes in a soak: LIFECYCLES lifecycles on the async
# hooks, IN_FLIGHT at once, against the simulator in its own process (rate
# limit off), under `perf record -g` (cpu-clock, 999 Hz, every thread of
# the harness process). Prints each sample's share by where it ran:
#   ledger thread  the ledger's committer thread (`ledger-commit`): SQLite
#                  executing and committing the writes, its `fsync` included;
#   provider       the provider's runtime threads (`createos-*`) and any
#                  other thread's samples in the provider library;
#   harness        the rest: the thread polling the lifecycles, the host,
#                  the ledger's reads, the allocator, the kernel below them;
# and, across all threads, the samples under an `fsync`/`fdatasync` call.
#
#   bash benches/soak-profile.sh [LIFECYCLES] [IN_FLIGHT]    # 1000 100
#   HARNESS=/path/to/host-harness bash benches/soak-profile.sh   # another build
#       (its libcreateos_provider.so beside it, where the harness finds it)
set -euo pipefail
cd "$(dirname "$0")/.."
lifecycles=${1:-1000}
in_flight=${2:-100}
if [ -z "${HARNESS:-}" ]; then
    cargo build --release -q -p host-harness -p createos-provider
    HARNESS=./target/release/host-harness
fi
work=$(mktemp -d)
sim=
trap '[ -n "$sim" ] && kill "$sim" 2>/dev/null; rm -rf "$work"' EXIT

"$HARNESS" sim --no-rate-limit --json >"$work/sim.json" &
sim=$!
for _ in $(seq 1 200); do [ -s "$work/sim.json" ] && break; sleep 0.05; done
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
sim = json.loads(open(f"{work}/sim.json").readline())
config = {"companyId": "bench", "environmentId": "bench", "config": {
    "apiUrl": sim["url"], "apiKey": sim["apiKey"], "shape": "s-1vcpu-1gb",
    "reuseLease": True, "timeoutMs": 1800000, "requestsPerMinute": 100000}}
json.dump(config, open(f"{work}/config.json", "w"))
PY
perf record -q -g -F 999 -o "$work/perf.data" -- \
    "$HARNESS" --json soak --leases "$lifecycles" --concurrency "$in_flight" \
    --config "$work/config.json" --ledger "$work/ledger.sqlite3" | tail -n 1 >"$work/soak.json" || true
kill -TERM "$sim"
wait "$sim" || true
sim=
perf script -i "$work/perf.data" -F comm,tid,ip,sym,dso >"$work/script.txt" 2>/dev/null
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
counts = {"ledger thread": 0, "provider": 0, "harness": 0}
fsync = total = 0


def tally(comm, frames):
    global fsync, total
    if not comm:
        return
    total += 1
    if comm == "ledger-commit":
        counts["ledger thread"] += 1
    elif comm.startswith("createos-") or any("libcreateos_provider" in frame for frame in frames):
        counts["provider"] += 1
    else:
        counts["harness"] += 1
    # The symbol alone: the library's path may hold any word.
    if any("fsync" in frame.split(" (")[0] for frame in frames):
        fsync += 1


comm, frames = None, []
for line in open(f"{work}/script.txt", errors="replace"):
    if not line.strip():
        tally(comm, frames)
        comm, frames = None, []
    elif line[0] not in " \t":
        comm = line.split()[0]
    else:
        frames.append(line.strip())
tally(comm, frames)
soak = json.load(open(f"{work}/soak.json"))
shares = ", ".join(f"{name} {100 * n / total:.1f} %" for name, n in counts.items())
print(f"{total} samples, CPU/lifecycle {soak['cpuPerLifecycleMs']:.2f} ms under perf, {shares}; "
      f"under fsync {100 * fsync / total:.1f} %")
PY
