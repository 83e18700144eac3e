#!/usr/bin/env bash
# The cold start of a one-shot command (issue 39): a lone `host-harness
# lifecycle` in a fresh process, cold (no memory) and restored (the second
# run on the same ledger, with the poll schedule the first one learnt),
# against a warm process, in one run, release build. The simulator runs in
# the bench's process, independent of the processes measured; its
# transitions last TRANSITION_MS. See host-harness/benches/cold_start.rs.
#
#   bash benches/cold-start.sh                       # 150 ms transitions, 5 rounds
#   TRANSITION_MS=50 ROUNDS=9 bash benches/cold-start.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench -q -p host-harness --bench cold_start
