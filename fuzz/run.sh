#!/usr/bin/env bash
# The fuzz targets, each run for a bounded time from its committed seed corpus (CI calls this).
#
# Installs the pinned nightly and cargo-fuzz when missing, builds every target, then runs each for
# FUZZ_SECONDS (default 30). New corpus entries go to fuzz/target/corpus/<target>, never into the
# committed seeds. Exits non-zero on any crash, panic, failed property, slow input or memory blow-up,
# and prints where the input that did it is kept and how to replay it.
#
#   FUZZ_SECONDS=600 bash fuzz/run.sh                  # a longer local run
#   FUZZ_TARGETS="stream_record" bash fuzz/run.sh      # some targets only
set -euo pipefail
cd "$(dirname "$0")/.."

# A pinned nightly, so that a new nightly cannot break CI; cargo-fuzz needs nightly for its
# -Z sanitizer and coverage flags.
NIGHTLY=nightly-2026-05-20
CARGO_FUZZ_VERSION=0.13.2
# 30 s a target by default: the build (the AWS SDKs that twopc links) is most of the CI step's
# time (about 4.5 of its 6 minutes on 2 cores), and the committed seeds take each target to its
# parsers' deep paths within seconds.
SECONDS_PER_TARGET=${FUZZ_SECONDS:-30}
ALL_TARGETS="request_parser stream_record stream_attribute"
read -r -a TARGETS <<<"${FUZZ_TARGETS:-$ALL_TARGETS}"

# No address sanitizer: the code under test is safe Rust, whose failures (panics, overflow,
# runaway time or memory) libFuzzer catches without one, and ASan would instrument every crate of
# an already long build and slow each run. Debug assertions stay on, for overflow checks. 16
# codegen units instead of cargo-fuzz's 1: faster builds; the inlining that costs matters little
# next to the build time in a run this short (fuzz/Cargo.toml also builds the dependencies a fuzz
# input never reaches without optimisation).
BUILD_FLAGS=(--sanitizer none --debug-assertions --codegen-units 16)
# No debug info (cargo-fuzz asks for line tables; flags given here come after its own): about a
# sixth less build time. A panic still names its file and line, and the failing input is kept.
export RUSTFLAGS="${RUSTFLAGS:-} -Cdebuginfo=0"
# A single input slower than 10 s, or over 2 GB, is a finding: a request or record must never stall
# the function that parses it.
LIBFUZZER_FLAGS=(-timeout=10 -rss_limit_mb=2048 -print_final_stats=1)

started=$SECONDS
step() { echo "-- fuzz: $1 ($((SECONDS - started)) s)"; }

step "toolchain $NIGHTLY"
timeout 600 rustup toolchain install "$NIGHTLY" --profile minimal --no-self-update

if [[ "$(cargo fuzz --version 2>/dev/null || true)" != "cargo-fuzz $CARGO_FUZZ_VERSION" ]]; then
    step "cargo-fuzz $CARGO_FUZZ_VERSION"
    timeout 900 cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi

# cargo-fuzz has no --locked: the same assertion first, so that the build uses fuzz/Cargo.lock as it is
# committed (a stale lock fails here, instead of being filled in with whatever is newest).
step "fuzz/Cargo.lock is complete (cargo metadata --locked)"
timeout 600 cargo "+$NIGHTLY" metadata --locked --format-version 1 --manifest-path fuzz/Cargo.toml >/dev/null

step "build ${TARGETS[*]}"
if [[ "${TARGETS[*]}" == "$ALL_TARGETS" ]]; then
    # One cargo run builds the targets side by side.
    timeout 1200 cargo "+$NIGHTLY" fuzz build "${BUILD_FLAGS[@]}"
else
    for target in "${TARGETS[@]}"; do
        timeout 1200 cargo "+$NIGHTLY" fuzz build "${BUILD_FLAGS[@]}" "$target"
    done
fi

failed=()
for target in "${TARGETS[@]}"; do
    step "run $target for ${SECONDS_PER_TARGET} s"
    scratch="fuzz/target/corpus/$target"
    seeds="fuzz/corpus/$target"
    artifacts="fuzz/artifacts/$target"
    mkdir -p "$scratch" "$seeds" "$artifacts"
    dict=()
    [[ "$target" != stream_attribute ]] && dict=(-dict=fuzz/json.dict)
    before=$(find "$artifacts" -type f | sort)
    # libFuzzer writes new entries to the first corpus directory and only reads the others.
    # libFuzzer prints a line for every input that adds coverage (thousands a run): they go to a log,
    # and the run's summary is printed; a failure prints the log's end, where libFuzzer says why.
    log="fuzz/target/logs/$target.log"
    mkdir -p "$(dirname "$log")"
    status=0
    timeout $((SECONDS_PER_TARGET + 300)) cargo "+$NIGHTLY" fuzz run "${BUILD_FLAGS[@]}" "$target" "$scratch" "$seeds" -- \
        -max_total_time="$SECONDS_PER_TARGET" "${LIBFUZZER_FLAGS[@]}" "${dict[@]}" >"$log" 2>&1 || status=$?
    grep -E '^(#[0-9]+[[:space:]]+DONE|stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb))' "$log" |
        sed 's/^/   /' || true
    if [[ $status -ne 0 ]]; then
        failed+=("$target")
        echo "!! fuzz: $target failed (exit $status); the end of its log ($log):"
        tail -n 60 "$log" | sed 's/^/!!   /'
        found=$(comm -13 <(echo "$before") <(find "$artifacts" -type f | sort) | sed '/^$/d')
        if [[ -n "$found" ]]; then
            while read -r input; do
                echo "!! fuzz: the input is kept at $input"
                echo "!!       replay: cargo +$NIGHTLY fuzz run ${BUILD_FLAGS[*]} $target $input"
                echo "!!       shrink: cargo +$NIGHTLY fuzz tmin ${BUILD_FLAGS[*]} $target $input"
            done <<<"$found"
        else
            echo "!! fuzz: no input was kept (the run itself failed or ran out of time): see its log above"
        fi
    fi
done

step "done"
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "fuzz: FAILED: ${failed[*]}"
    exit 1
fi
echo "fuzz: ${#TARGETS[@]} targets, ${SECONDS_PER_TARGET} s each, no crash"
