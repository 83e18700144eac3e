# Sourced by the soak benches (not run on its own): the CreateOS simulator
# in a process of its own, rate limit off, and a harness configuration
# pointing at it.
#
# prepare_soak: sets HARNESS (unless the caller gave one, the release
# harness and provider library, built now) and work (a scratch directory,
# removed at exit after the simulator is stopped).
prepare_soak() {
    if [ -z "${HARNESS:-}" ]; then
        cargo build --release -q -p host-harness -p createos-provider
        HARNESS=./target/release/host-harness
    fi
    work=$(mktemp -d)
    sim=
    trap '[ -n "$sim" ] && kill "$sim" 2>/dev/null; rm -rf "$work"' EXIT
}
#
# start_sim HARNESS WORK: starts `HARNESS sim` (its JSON lines in
# WORK/sim.json, its pid in $sim), waits for its first line, and writes
# WORK/config.json for it (hooks get a 30-minute timeout, the request budget
# is out of the way).
start_sim() {
    local harness=$1 work=$2
    "$harness" sim --no-rate-limit --json >"$work/sim.json" &
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
}

# stop_sim: stops the simulator start_sim started; its last line (the
# requests it answered, the sandboxes still live) lands in WORK/sim.json.
stop_sim() {
    kill -TERM "$sim"
    wait "$sim" || true
    sim=
}
