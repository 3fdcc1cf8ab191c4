#!/usr/bin/env bash
# The lake's Athena queries (docs/lake.md) on a lake the local stack writes (issue 47): runs
# `twopc-local demo` (its own DynamoDB Local, in memory) with its data in a scratch folder, then
# tests/lake/test_lake_queries.py on its lake with DuckDB's Python package at the pin of
# tests/lake/requirements.txt, in a venv of its own (target/lake-venv, made fresh when missing).
#   tests/lake/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=target/lake-venv
if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c 'import duckdb' 2>/dev/null; then
    rm -rf "$venv"
    timeout 120 python3 -m venv "$venv"
    timeout 600 "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/lake/requirements.txt
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# What `cargo test --workspace` built (after the tests this builds nothing).
timeout 1200 cargo build --locked --quiet -p local-stack --bin twopc-local
# The demo stops its stack when it is done, after delivering what the streams still hold: every line is in.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# On free ports, so that a stack running beside it (`up` on the defaults) is no obstacle.
TWOPC_LOCAL_DIR="$work" timeout 600 target/debug/twopc-local demo --lake-dir "$work/lake" \
    --api-port "$(free_port)" --ws-port "$(free_port)" --dynamodb-port "$(free_port)" >"$work/demo.log" 2>&1 || {
    cat "$work/demo.log"
    exit 1
}
timeout 300 "$venv/bin/python" tests/lake/test_lake_queries.py "$work/lake" -v
