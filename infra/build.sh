#!/usr/bin/env bash
# Builds every Lambda function of the workspace for arm64 (Graviton) with cargo-lambda, as the zip
# Lambda deploys, and prints each zip's size.
#
#   infra/build.sh            release build (the root Cargo.toml's size-tuned profile: opt-level s,
#                             fat LTO, one codegen unit, panic=abort, stripped)
#                             -> target/lambda/<function>/bootstrap.zip
#   infra/build.sh --quick    (or QUICK=1) the same functions, same arm64 target, dev profile: no LTO,
#                             so CI proves in a fraction of the time that every function cross-compiles,
#                             links and zips. -> target/lambda-debug/<function>/bootstrap.zip (a separate
#                             directory, so a quick build never passes for a release artifact)
#
# `sam build` (infra/DEPLOY.md) runs cargo-lambda itself; this script is for CI and for checking
# sizes. Installs what it needs when missing: cargo-lambda and zig (PyPI: cargo-lambda, ziglang)
# and the Rust target aarch64-unknown-linux-gnu.
set -euo pipefail

FUNCTIONS=(coordinator participant inventory payments sweeper stream-processor outcomes connections authorizer)
TARGET=aarch64-unknown-linux-gnu

quick="${QUICK:-0}"
for arg in "$@"; do
    case "$arg" in
        --quick) quick=1 ;;
        -h | --help)
            sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "unknown argument: $arg (use --quick or --help)" >&2
            exit 2
            ;;
    esac
done
case "$quick" in 0 | "" | false | no) quick=0 ;; *) quick=1 ;; esac

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# --- tools ---------------------------------------------------------------------------------------

python_scripts_dirs() {
    # Where `pip install` puts console scripts (system, virtualenv or --user installs).
    python3 - <<'PY'
import site, sysconfig
print(sysconfig.get_path("scripts"))
print(site.getuserbase() + "/bin")
PY
}

ensure_on_path() {
    local dir
    while read -r dir; do
        [[ -d "$dir" && ":$PATH:" != *":$dir:"* ]] && PATH="$dir:$PATH"
    done < <(python_scripts_dirs)
    export PATH
}

if ! rustup target list --installed | grep -qx "$TARGET"; then
    echo "==> rustup target add $TARGET"
    rustup target add "$TARGET"
fi

ensure_on_path
# cargo-lambda cross-compiles with zig: a `zig` on PATH or the ziglang Python package. Either missing,
# both are installed at the versions of infra/build-requirements.txt.
if ! cargo lambda --version >/dev/null 2>&1 ||
    { ! command -v zig >/dev/null 2>&1 && ! python3 -c 'import ziglang' 2>/dev/null; }; then
    echo "==> pip install -r infra/build-requirements.txt"
    timeout 600 python3 -m pip install --quiet -r infra/build-requirements.txt
    ensure_on_path
fi
echo "==> $(cargo lambda --version)"

# --- build ---------------------------------------------------------------------------------------

# --locked: what Cargo.lock says, never a newer release resolved here.
args=(lambda build --locked --arm64 --output-format zip)
if [[ "$quick" == 1 ]]; then
    mode="quick (dev profile, arm64)"
    lambda_dir=target/lambda-debug
    args+=(--lambda-dir "$lambda_dir")
else
    mode="release (arm64)"
    lambda_dir=target/lambda
    args+=(--release)
fi
for function in "${FUNCTIONS[@]}"; do
    args+=(--package "$function")
    # A zip left by an earlier build must not pass for this one.
    rm -f "$lambda_dir/$function/bootstrap.zip"
done

echo "==> cargo ${args[*]}"
start=$(date +%s)
cargo "${args[@]}"
elapsed=$(($(date +%s) - start))

# --- report --------------------------------------------------------------------------------------

echo
echo "$mode build of ${#FUNCTIONS[@]} functions: ${elapsed} s"
printf '%-18s %12s %14s  %s\n' function "zip bytes" "bootstrap bytes" path
missing=0
for function in "${FUNCTIONS[@]}"; do
    zip="$lambda_dir/$function/bootstrap.zip"
    if [[ ! -f "$zip" ]]; then
        echo "missing: $zip" >&2
        missing=1
        continue
    fi
    if ! sizes=$(python3 - "$zip" <<'PY'
import os, sys, zipfile
path = sys.argv[1]
with zipfile.ZipFile(path) as z:
    names = z.namelist()
    if "bootstrap" not in names:
        sys.exit(f"{path} has no bootstrap: {names}")
    print(os.path.getsize(path), z.getinfo("bootstrap").file_size)
PY
    ); then
        missing=1
        continue
    fi
    read -r zipped unzipped <<<"$sizes"
    printf '%-18s %12s %14s  %s\n' "$function" "$zipped" "$unzipped" "$zip"
done
exit "$missing"
