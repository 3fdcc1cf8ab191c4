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

# shellcheck source=tests/local-stack.sh
source tests/local-stack.sh
# CORS as deployed (off locally unless asked for): the last case calls the API from another origin.
start_local_stack browser --sweep-secs 2 --cors-allow-origin '*'

mkdir -p target/browser
status=0
(
    cd tests/browser
    TWOPC_PAGE_URL="http://127.0.0.1:$api/" TWOPC_SCREENSHOTS="$PWD/../../target/browser" \
        timeout 300 node --test --test-concurrency=1 live-page.test.mjs
) || status=$?
if [[ $status -ne 0 ]]; then
    echo "the browser test failed (exit $status); the stack's last lines:" >&2
    tail -n 40 "$stack_log" >&2
fi

# The page signed in as a chosen user, on a stack that authorizes its callers (--auth jwt).
stop_local_stack
start_local_stack browser-auth --sweep-secs 2 --auth jwt
auth_status=0
(
    cd tests/browser
    TWOPC_PAGE_URL="http://127.0.0.1:$api/" timeout 300 node --test --test-concurrency=1 live-page-auth.test.mjs
) || auth_status=$?
if [[ $auth_status -ne 0 ]]; then
    echo "the browser test with --auth jwt failed (exit $auth_status); the stack's last lines:" >&2
    tail -n 40 "$stack_log" >&2
    status=$auth_status
fi
echo "screenshot: target/browser/live-page.png"
exit $status
