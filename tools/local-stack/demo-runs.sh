#!/usr/bin/env bash
# Runs the README's demo (`cargo run -p local-stack -- demo`) N times in a row (default 20), each a fresh
# stack on DynamoDB Local in memory, and stops at the first run that fails, keeping its output. The demo
# races two transfers on one account, so a run may meet the coordinator's retries: this is how a change
# to them shows that a fresh clone's first command passes every time, not just once.
#
#   bash tools/local-stack/demo-runs.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../.."

runs=${1:-20}
cargo build --locked --quiet -p local-stack
binary=target/debug/twopc-local
mkdir -p target/demo-runs
passed=0
for ((run = 1; run <= runs; run++)); do
    log=target/demo-runs/run-$run.log
    started=$SECONDS
    if timeout 600 "$binary" demo >"$log" 2>&1; then
        passed=$((passed + 1))
        echo "run $run: passed in $((SECONDS - started)) s"
    else
        status=$?
        echo "run $run: failed (exit $status) after $((SECONDS - started)) s; its output:"
        cat "$log"
        echo "$passed passed, 1 failed"
        exit 1
    fi
done
echo "$passed passed, 0 failed"
