# Sourced by the scripts that test against a running local stack (tests/api/run.sh,
# tests/browser/run.sh): `start_local_stack NAME [twopc-local up flags...]` builds what
# `cargo test --workspace` builds, `twopc-local` included (after the tests this builds nothing), starts
# `twopc-local up` with its own in-memory DynamoDB Local on free loopback ports, waits until it
# answers, and stops it (and what it started) when the script exits. It sets `api`, `ws`, `db` (the
# ports), `work` (a scratch folder, removed at exit; the lake is `$work/lake`) and `stack_log`.

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

start_local_stack() {
    local name=$1
    shift
    timeout 1200 cargo test --locked --quiet --workspace --no-run
    api=$(free_port) ws=$(free_port) db=$(free_port)
    work=$(mktemp -d "${TMPDIR:-/tmp}/twopc-$name.XXXXXX")
    stack_log=$work/stack.log
    target/debug/twopc-local up --in-memory --dynamodb-port "$db" --api-port "$api" --ws-port "$ws" \
        --lake-dir "$work/lake" "$@" >"$stack_log" 2>&1 &
    stack_pid=$!
    trap stop_local_stack EXIT

    local ready=""
    for _ in $(seq 300); do
        if curl -fsS "http://127.0.0.1:$api/local/stack.json" -o /dev/null 2>/dev/null; then ready=1; break; fi
        kill -0 "$stack_pid" 2>/dev/null || break
        sleep 0.2
    done
    if [[ -z $ready ]]; then
        echo "the local stack did not start; its log:" >&2
        cat "$stack_log" >&2
        exit 1
    fi
}

stop_local_stack() {
    kill -INT "$stack_pid" 2>/dev/null || true
    # The stack stops what it started (DynamoDB Local) on Ctrl-C; give it the time it needs, then insist.
    for _ in $(seq 50); do kill -0 "$stack_pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$stack_pid" 2>/dev/null || true
    rm -rf "$work"
}
