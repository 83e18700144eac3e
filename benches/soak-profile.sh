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
# Then the provider's samples by what they were doing, per request (the
# soak's request count): each sample goes to the first of these its stack
# holds, innermost frame first: the kernel (sockets, wakeups), the
# allocator, copies (memcpy/memmove), serde_json, rustls, hyper and the
# other HTTP crates, tokio, the provider's own code, the rest. Last, the
# provider's samples by activity, from their whole stack: in an HTTP
# request (the client, reqwest, hyper), in the runtime alone (parking,
# scheduling, timers), in the provider's own work outside requests, or
# unattributed (a stack that ends at its leaf). Release builds have no
# frame pointers, so most stacks end at their leaf; for this split build
# with them:
#   RUSTFLAGS="-C force-frame-pointers=yes" CARGO_TARGET_DIR=target/fp \
#       cargo build --release -p host-harness -p createos-provider
#   HARNESS=target/fp/release/host-harness bash benches/soak-profile.sh
#
#   bash benches/soak-profile.sh [LIFECYCLES] [IN_FLIGHT]    # 1000 100
#   PROFILE_OUT=DIR bash benches/soak-profile.sh   # keep perf.data and its script in DIR
#   HARNESS=/path/to/host-harness bash benches/soak-profile.sh   # another build
#       (its libcreateos_provider.so beside it, where the harness finds it)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benches/sim-lib.sh
source benches/sim-lib.sh
lifecycles=${1:-1000}
in_flight=${2:-100}
prepare_soak

start_sim "$HARNESS" "$work"
perf record -q -g -F 999 -o "$work/perf.data" -- \
    "$HARNESS" --json soak --leases "$lifecycles" --concurrency "$in_flight" \
    --config "$work/config.json" --ledger "$work/ledger.sqlite3" | tail -n 1 >"$work/soak.json" || true
stop_sim
perf script -i "$work/perf.data" -F comm,tid,ip,sym,dso >"$work/script.txt" 2>/dev/null
if [ -n "${PROFILE_OUT:-}" ]; then mkdir -p "$PROFILE_OUT" && cp "$work/perf.data" "$work/script.txt" "$PROFILE_OUT/"; fi
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
        parts[provider_part(frames)] += 1
        activities[activity(frames)] += 1
    else:
        counts["harness"] += 1
    # The symbol alone: the library's path may hold any word.
    if any("fsync" in frame.split(" (")[0] for frame in frames):
        fsync += 1


PARTS = [  # (name, test on one frame's text), innermost frame first
    ("kernel", lambda f: "[kernel.kallsyms]" in f),
    ("allocator", lambda f: any(w in f for w in ("malloc", "free", "realloc", "_int_", "tcache"))),
    ("copies", lambda f: "memcpy" in f or "memmove" in f),
    ("serde_json", lambda f: "serde_json" in f),
    ("rustls", lambda f: "rustls" in f or "ring::" in f),
    ("hyper/http", lambda f: any(w in f for w in ("hyper", "reqwest", "http::", "h2::", "httparse"))),
    ("tokio", lambda f: "tokio" in f),
    ("provider code", lambda f: "createos_provider" in f),
]
parts = {name: 0 for name, _ in PARTS}
parts["other"] = 0
activities = {"HTTP request": 0, "runtime alone": 0, "own work outside requests": 0, "unattributed": 0}


def activity(frames):
    if any(w in frame for frame in frames for w in ("createos_provider::client::", "reqwest::", "hyper")):
        return "HTTP request"
    if any("createos_provider::" in frame for frame in frames):
        return "own work outside requests"
    if any("tokio::runtime" in frame for frame in frames):
        return "runtime alone"
    return "unattributed"


def provider_part(frames):
    for frame in frames:
        for name, test in PARTS:
            if test(frame):
                return name
    return "other"


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
stopped = [json.loads(line) for line in open(f"{work}/sim.json") if '"stopped"' in line]
requests = stopped[-1]["requests"] if stopped else 0
provider = max(counts["provider"], 1)
cpu_us = soak["cpuPerLifecycleMs"] * 1000 * soak["leases"] * counts["provider"] / total
print("provider by part: " + ", ".join(f"{name} {100 * n / provider:.1f} %" for name, n in parts.items())
      + (f"; provider CPU per request {cpu_us / requests:.0f} µs under perf" if requests else ""))
print("provider by activity: " + ", ".join(f"{name} {100 * n / provider:.1f} %" for name, n in activities.items()))
PY
