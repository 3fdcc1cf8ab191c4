#!/usr/bin/env bash
# The live page in a real browser: Debian's Chromium driven by Playwright (playwright-core, pinned in
# package-lock.json; it never downloads a browser). Starts the local stack (its own DynamoDB Local, in
# memory, on free ports), runs tests/browser/live-page.test.mjs against its page, stops the stack.
# The screenshot of the page at the end is kept in target/browser/live-page.png (also on failure).
#
#   bash tests/browser/run.sh
#
# Installs what is missing: Debian's chromium (apt-get, as root or with sudo), the npm packages
# (`npm ci`). CHROMIUM=/path/to/chrome uses another Chromium.
set -euo pipefail
cd "$(dirname "$0")/../.."

export CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
if [[ ! -x $CHROMIUM ]]; then
    # Debian's current chromium for this release: Debian replaces it with each security update and
    # keeps no old version, so an exact pin would stop installing; playwright-core, pinned, speaks to
    # it over the DevTools protocol, which is stable across versions.
    sudo=""
    [[ $(id -u) -eq 0 ]] || sudo=sudo
    export DEBIAN_FRONTEND=noninteractive
    timeout 600 $sudo apt-get install -y -q --no-install-recommends chromium >/dev/null ||
        { timeout 600 $sudo apt-get update -q >/dev/null && timeout 600 $sudo apt-get install -y -q --no-install-recommends chromium >/dev/null; }
fi
"$CHROMIUM" --version

(cd tests/browser && timeout 300 npm ci --no-audit --no-fund --loglevel=error)

# The whole workspace with its test targets: the feature set `cargo test --workspace` builds, so after
# the tests this builds nothing.
timeout 1200 cargo build --quiet --workspace --all-targets

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
api=$(free_port) ws=$(free_port) db=$(free_port)
work=$(mktemp -d "${TMPDIR:-/tmp}/twopc-browser.XXXXXX")
target/debug/twopc-local up --in-memory --dynamodb-port "$db" --api-port "$api" --ws-port "$ws" \
    --lake-dir "$work/lake" --sweep-secs 2 >"$work/stack.log" 2>&1 &
stack=$!
stop() {
    kill -INT "$stack" 2>/dev/null || true
    # The stack stops what it started (DynamoDB Local) on Ctrl-C; give it the time it needs, then insist.
    for _ in $(seq 50); do kill -0 "$stack" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$stack" 2>/dev/null || true
    rm -rf "$work"
}
trap stop EXIT

ready=""
for _ in $(seq 300); do
    if curl -fsS "http://127.0.0.1:$api/local/stack.json" -o /dev/null 2>/dev/null; then ready=1; break; fi
    kill -0 "$stack" 2>/dev/null || break
    sleep 0.2
done
if [[ -z $ready ]]; then
    echo "the local stack did not start; its log:" >&2
    cat "$work/stack.log" >&2
    exit 1
fi

mkdir -p target/browser
status=0
(
    cd tests/browser
    TWOPC_PAGE_URL="http://127.0.0.1:$api/" TWOPC_SCREENSHOTS="$PWD/../../target/browser" \
        timeout 300 node --test --test-concurrency=1 live-page.test.mjs
) || status=$?
if [[ $status -ne 0 ]]; then
    echo "the browser test failed (exit $status); the stack's last lines:" >&2
    tail -n 40 "$work/stack.log" >&2
fi
echo "screenshot: target/browser/live-page.png"
exit $status
