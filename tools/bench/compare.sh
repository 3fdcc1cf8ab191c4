#!/usr/bin/env bash
# The contention comparison of issue 35: two twopc-bench binaries, a baseline (built from an older
# commit) and the current one, run alternately — baseline, current, baseline, current, baseline,
# current — with only scenarios 3 (uncontended throughput) and 4 (contention, with its
# TransactWriteItems peer 4b), each run bounded in time; then the median of each figure per binary.
#
#   tools/bench/compare.sh BASELINE_BIN CURRENT_BIN [-- TWOPC_BENCH_FLAGS...]
#   tools/bench/compare.sh --summarize DIR       (print the medians of runs already made into DIR)
#
# A baseline binary, from a commit before the change (neither binary is built here):
#   git worktree add ../twopc-baseline <commit>
#   (cd ../twopc-baseline && cargo build --release --locked -p twopc-bench)
#   cargo build --release --locked -p twopc-bench
#   tools/bench/compare.sh ../twopc-baseline/target/release/twopc-bench target/release/twopc-bench
# A baseline's own bench reports what it measured then: a bench from before issue 35 has no 4b and no
# attempts per commit (shown as n/a). For those figures on the baseline too, build it with this bench:
# `cp -r tools/bench/. ../twopc-baseline/tools/bench/` before its build, without --locked there (the
# bench reads the answers' new fields when present and calls nothing the older coordinator lacks).
#
# Flags after `--` go to every run (`--seconds 6`, or `--quick` for a smoke check of the script).
# Environment: PAIRS (runs per binary, default 3), ONLY (the scenarios, default 3,4; issue 45 ran 1,3,5:
# latency, throughput and requests per transaction, uncontended), RUN_TIMEOUT (seconds per run, default 600),
# OUT (where the runs' JSON and logs go, default target/bench/compare/<date-time>).
# Every run starts in the workspace root, so each binary finds (or installs) and starts its DynamoDB
# Local exactly as `cargo run -p twopc-bench` does there. A run that times out or writes no JSON is
# left out of the medians and named; a run that exits 1 (a scenario error) is kept and its errors shown.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"

summarize() {
    python3 - "$1" <<'PY'
import json, pathlib, statistics, sys

out = pathlib.Path(sys.argv[1])

def get(doc, *path):
    for key in path:
        if not isinstance(doc, dict) or doc.get(key) is None:
            return None
        doc = doc[key]
    return doc

def ratio(doc):
    good, base = get(doc, "contention", "goodputPerSecond"), get(doc, "throughput", "twopc", "perSecond")
    return good / base if good is not None and base else None

def requests(name):
    return lambda d: next((c.get("perTransaction") for c in (get(d, "requests", "cases") or []) if c.get("name") == name), None)

# (label, how to read it from one run's figures, format)
FIGURES = [
    ("uncontended 2PC latency p50 (1.), ms", lambda d: get(d, "latency", "twopc", "p50Ms"), "{:.1f}"),
    ("uncontended 2PC latency p99 (1.), ms", lambda d: get(d, "latency", "twopc", "p99Ms"), "{:.1f}"),
    ("uncontended TransactWriteItems latency p50 (1.), ms", lambda d: get(d, "latency", "transactWriteItems", "p50Ms"), "{:.1f}"),
    ("requests per tx, 2PC 1 participant (5.)", requests("2PC, 1 participant"), "{:g}"),
    ("requests per tx, 2PC 2 participants (5.)", requests("2PC, 2 participants"), "{:g}"),
    ("requests per tx, 2PC 8 participants (5.)", requests("2PC, 8 participants"), "{:g}"),
    ("requests per tx, 2PC 2 participants, key (5.)", requests("2PC, 2 participants, Idempotency-Key"), "{:g}"),
    ("requests per tx, 2PC abort (5.)", requests("2PC, 2 participants, one refuses (abort)"), "{:g}"),
    ("uncontended 2PC throughput (3.), tx/s", lambda d: get(d, "throughput", "twopc", "perSecond"), "{:.1f}"),
    ("uncontended TransactWriteItems (3.), tx/s", lambda d: get(d, "throughput", "transactWriteItems", "perSecond"), "{:.1f}"),
    ("contended 2PC goodput (4.), tx/s", lambda d: get(d, "contention", "goodputPerSecond"), "{:.1f}"),
    ("contended goodput / uncontended 2PC", ratio, "{:.0%}"),
    ("contended TransactWriteItems goodput (4b.), tx/s", lambda d: get(d, "contentionTransactWriteItems", "goodputPerSecond"), "{:.1f}"),
    ("2PC refused rate (client requests)", lambda d: get(d, "contention", "load", "abortRate"), "{:.1%}"),
    ("2PC refused rate (coordinator attempts)", lambda d: get(d, "contention", "retries", "coordinatorRefusedRate"), "{:.1%}"),
    ("2PC coordinator attempts per commit, max", lambda d: get(d, "contention", "attemptsPerCommit", "max"), "{:g}"),
    ("2PC coordinator attempts per commit, p99", lambda d: get(d, "contention", "attemptsPerCommit", "p99"), "{:g}"),
    ("2PC client requests per commit, max", lambda d: get(d, "contention", "clientRequestsPerCommit", "max"), "{:g}"),
    ("2PC client requests per commit, p99", lambda d: get(d, "contention", "clientRequestsPerCommit", "p99"), "{:g}"),
    ("2PC gave up, in the window", lambda d: get(d, "contention", "load", "gaveUp"), "{:g}"),
    ("2PC gave up, over the phase", lambda d: get(d, "contention", "gaveUpPhase"), "{:g}"),
    ("2PC contended transfer p99, ms", lambda d: get(d, "contention", "load", "latency", "p99Ms"), "{:.0f}"),
    ("TransactWriteItems refused rate (4b.)", lambda d: get(d, "contentionTransactWriteItems", "refusedRate"), "{:.1%}"),
    ("TransactWriteItems attempts per commit, max", lambda d: get(d, "contentionTransactWriteItems", "attemptsPerCommit", "max"), "{:g}"),
    ("TransactWriteItems attempts per commit, p99", lambda d: get(d, "contentionTransactWriteItems", "attemptsPerCommit", "p99"), "{:g}"),
    ("TransactWriteItems gave up, over the phase", lambda d: get(d, "contentionTransactWriteItems", "gaveUpPhase"), "{:g}"),
]

runs = {}
for label in ("baseline", "current"):
    docs = []
    for path in sorted(out.glob(f"{label}-*.json")):
        doc = json.loads(path.read_text())
        docs.append(doc)
        if doc.get("errors"):
            print(f"note: {path.name} reported errors: {'; '.join(doc['errors'])}")
    runs[label] = docs
missing = sorted(p.name for p in out.glob("*.missing"))
if missing:
    print("left out (no figures): " + ", ".join(m.removesuffix(".missing") for m in missing))

summary = {}
rows = []
for name, read, fmt in FIGURES:
    row = [name]
    summary[name] = {}
    for label in ("baseline", "current"):
        values = [v for v in (read(d) for d in runs[label]) if v is not None]
        if not values:
            row.append("n/a")
            summary[name][label] = None
            continue
        median = statistics.median(values)
        summary[name][label] = {"median": median, "runs": values}
        row.append(fmt.format(median) + " (" + ", ".join(fmt.format(v) for v in values) + ")")
    rows.append(row)

header = ["figure", f"baseline, median ({len(runs['baseline'])} runs)", f"current, median ({len(runs['current'])} runs)"]
widths = [max(len(r[i]) for r in rows + [header]) for i in range(3)]
line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
print(line(header))
print("-" * (sum(widths) + 4))
for r in rows:
    print(line(r))
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(f"\nmedians written to {out / 'summary.json'}")
PY
}

if [[ ${1:-} == --summarize ]]; then
    [[ -d ${2:-} ]] || { echo "usage: $0 --summarize DIR" >&2; exit 2; }
    summarize "$2"
    exit 0
fi
if [[ $# -lt 2 ]]; then
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2
    exit 2
fi
command -v python3 >/dev/null || { echo "python3 is needed for the medians" >&2; exit 2; }
absolute() { [[ $1 == /* ]] && echo "$1" || echo "$PWD/$1"; }
declare -A bin=([baseline]="$(absolute "$1")" [current]="$(absolute "$2")")
shift 2
[[ ${1:-} == -- ]] && shift
extra=("$@")
for label in baseline current; do
    [[ -x ${bin[$label]} ]] || { echo "$label: ${bin[$label]} is not an executable" >&2; exit 2; }
done
pairs=${PAIRS:-3}
only=${ONLY:-3,4}
limit=${RUN_TIMEOUT:-600}
cd "$root"
out=$(absolute "${OUT:-target/bench/compare/$(date +%Y%m%d-%H%M%S)}")
mkdir -p "$out"
echo "baseline: ${bin[baseline]}"
echo "current:  ${bin[current]}"
echo "runs: $pairs of each, alternated, --only $only ${extra[*]}; at most ${limit} s each; into $out"

for i in $(seq 1 "$pairs"); do
    for label in baseline current; do
        name="$label-$i"
        rm -f "$out/$name".{json,svg,log,missing}
        started=$SECONDS
        status=0
        # --svg: scenario 2 does not run, so no chart is drawn; named anyway so no run could overwrite
        # BENCHMARKS-latency.svg. --kill-after: a bench that ignores SIGTERM is killed (its DynamoDB
        # Local dies with it: the JVM is started to die with its parent).
        timeout --kill-after=30 "$limit" "${bin[$label]}" --only "$only" --no-progress \
            --out "$out/$name.json" --svg "$out/$name.svg" "${extra[@]}" >"$out/$name.log" 2>&1 || status=$?
        took=$((SECONDS - started))
        if [[ ! -s $out/$name.json ]]; then
            rm -f "$out/$name.json"
            case $status in
                124 | 137) why="timed out after ${limit} s" ;;
                *) why="exit status $status, no figures" ;;
            esac
            echo "$why" >"$out/$name.missing"
            echo "$name: $why (log: $out/$name.log)"
            continue
        fi
        echo "$name: exit status $status, ${took} s; $(grep -E '^  (PASS|FAIL|ERROR) +contended goodput' "$out/$name.log" | sed 's/  */ /g' || true)"
    done
done
echo
summarize "$out"
