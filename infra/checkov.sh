#!/usr/bin/env bash
# Scans the deployment with checkov, offline, on both templates: the SAM template (infra/template.yaml,
# scanned as written: checkov's cloudformation framework knows AWS::Serverless::Function and ::Api and
# applies the template's Globals) and the CDK app's synthesized template
# (infra/cdk/cdk.out/TwoPhaseCommit.template.json).
#
#   1. a venv of its own (target/checkov-venv) with the pinned versions of infra/checkov/requirements.txt;
#      recreated whenever the pins or the Python version change;
#   2. the CDK template: synthesized (`bash infra/cdk/synth.sh --no-test`) when it is missing or older
#      than the CDK app's sources; INFRA_CDK_TEMPLATE=FILE scans FILE as it is instead;
#   3. checkov 3.3.30, every check of its cloudformation framework, on each template: the script fails
#      on any failed check. A check is skipped only by the resource's own Metadata, with a reason:
#          Metadata:
#            checkov:
#              skip:
#                - id: CKV_AWS_117
#                  comment: why this resource does not need it
#      (in the CDK app: resource.cfnOptions.metadata or addMetadata('checkov', {skip: [...]})). There is
#      no --skip-check list here, and the script fails on a skip without a comment, on an inline
#      `checkov:skip=` comment, and on a skip that matches no check of its resource (a typo).
#
#   bash infra/checkov.sh            both templates
#   bash infra/checkov.sh sam        only infra/template.yaml
#   bash infra/checkov.sh cdk        only the CDK template
#
# Prints, per template, the counts and each failed check (id, title, resource, file:line), grouped by
# check id; the JSON reports stay in target/checkov/. Offline: checkov runs with a clean environment
# (no BC_API_KEY, no CKV_* option from the caller, no .checkov.yaml from the working or home folder),
# --skip-download and no update check, so it never calls Prisma Cloud / Bridgecrew, PyPI or GitHub.
# Needs python3 (3.11 or later) with venv; the registry only for the venv. Every step is bounded in time.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"

venv="${INFRA_CHECKOV_VENV:-target/checkov-venv}"
requirements=infra/checkov/requirements.txt
sam_template=infra/template.yaml
cdk_synth=infra/cdk/synth.sh
cdk_template="${INFRA_CDK_TEMPLATE:-infra/cdk/cdk.out/TwoPhaseCommit.template.json}"
work=target/checkov
python="${PYTHON:-python3}"

targets=()
for arg in "$@"; do
    case "$arg" in
        sam | cdk) targets+=("$arg") ;;
        -h | --help)
            sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "usage: bash infra/checkov.sh [sam] [cdk]" >&2
            exit 2
            ;;
    esac
done
[[ ${#targets[@]} -gt 0 ]] || targets=(sam cdk)

# Nothing from outside the venv may reach its interpreter.
unset PYTHONPATH PYTHONHOME
export PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

# --- 1. the venv ---------------------------------------------------------------------------------

# The stamp names the interpreter's version and the pins' digest: a change of either rebuilds.
stamp="$("$python" -c 'import sys; print("python", sys.version.split()[0])') $(sha256sum "$requirements" | cut -d' ' -f1)"
if [[ ! -x "$venv/bin/python" || "$(cat "$venv/.pins" 2>/dev/null)" != "$stamp" ]]; then
    echo "==> creating $venv with the pins of $requirements"
    started=$SECONDS
    rm -rf "$venv"
    timeout 120 "$python" -m venv "$venv"
    timeout 900 "$venv/bin/python" -m pip install --quiet --timeout 60 --retries 3 -r "$requirements"
    timeout 120 "$venv/bin/python" -m pip check
    echo "$stamp" >"$venv/.pins"
    echo "$venv: ready in $((SECONDS - started)) s"
fi

# --- 2. the CDK template ---------------------------------------------------------------------------

if [[ " ${targets[*]} " == *" cdk "* ]]; then
    if [[ -n "${INFRA_CDK_TEMPLATE:-}" ]]; then
        echo "==> INFRA_CDK_TEMPLATE=$cdk_template: scanned as it is, not synthesized"
        [[ -f "$cdk_template" ]] || { echo "no such file: $cdk_template" >&2; exit 2; }
    elif [[ ! -f "$cdk_template" ]] ||
        [[ -n "$(find infra/cdk/bin infra/cdk/lib infra/cdk/cdk.json infra/cdk/package.json \
            infra/cdk/package-lock.json -newer "$cdk_template" -print -quit 2>/dev/null)" ]]; then
        echo "==> bash $cdk_synth --no-test ($cdk_template is missing or older than the CDK app)"
        timeout 1200 bash "$cdk_synth" --no-test
    else
        echo "==> $cdk_template: newer than the CDK app's sources, scanned as it is"
    fi
fi

# --- 3. checkov --------------------------------------------------------------------------------------

# A home and working folder of its own, empty: checkov reads .checkov.yaml from both.
rm -rf "$work"
mkdir -p "$work/home"
venv_abs="$(cd "$venv" && pwd)"
work_abs="$root/$work"

status=0
for target in "${targets[@]}"; do
    case "$target" in
        sam) template="$sam_template" ;;
        cdk) template="$cdk_template" ;;
    esac
    template_abs="$(cd "$(dirname "$template")" && pwd)/$(basename "$template")"
    echo "==> checkov $target: $template"
    started=$SECONDS
    # env -i: only what is named here reaches checkov (no BC_API_KEY, no CKV_SKIP_CHECK, ...).
    # BC_SKIP_MAPPING and --skip-download: no policy metadata from the platform; the update check
    # off: no request to PyPI. Exit 0: no failed check; 1: failed checks; anything else: an error.
    checkov_status=0
    (cd "$work/home" && env -i PATH="$venv_abs/bin:/usr/bin:/bin" HOME="$work_abs/home" LANG=C.UTF-8 \
        PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1 LOG_LEVEL=WARNING \
        BC_SKIP_MAPPING=TRUE CKV_SKIP_PACKAGE_UPDATE_CHECK=true \
        CKV_GITHUB_CONFIG_FETCH_DATA=false CKV_GITLAB_CONFIG_FETCH_DATA=false \
        timeout 300 "$venv_abs/bin/checkov" --file "$template_abs" --framework cloudformation \
        --skip-download --skip-results-upload --output json \
        >"$work_abs/$target.json" 2>"$work_abs/$target.stderr") || checkov_status=$?
    if [[ -s "$work/$target.stderr" ]]; then
        echo "checkov's messages ($work/$target.stderr):"
        sed 's/^/    /' "$work/$target.stderr" | head -40
    fi
    if [[ $checkov_status -ne 0 && $checkov_status -ne 1 ]]; then
        echo "!! checkov $target: exit $checkov_status (an error, not a result)" >&2
        status=1
        continue
    fi
    # The report, read back: the counts and failures, and every skip judged against the template.
    timeout 120 "$venv/bin/python" - "$target" "$template" "$work/$target.json" "$checkov_status" \
        "$((SECONDS - started))" <<'EOF' || status=1
import collections, json, os, re, sys

import yaml

target, template, report_path, checkov_status, seconds = sys.argv[1:6]
problems = []

with open(report_path) as f:
    data = json.load(f)
reports = [r for r in (data if isinstance(data, list) else [data]) if r.get("check_type") == "cloudformation"]
if len(reports) != 1 or not reports[0]["summary"]["resource_count"]:
    print(f"!! checkov read no CloudFormation resource in {template}")
    sys.exit(1)
report = reports[0]
summary, results = report["summary"], report["results"]
for error in results.get("parsing_errors") or []:
    problems.append(f"checkov could not parse {error}")


def place(check):
    path = os.path.relpath(check.get("file_abs_path") or check["file_path"])
    return f"{path}:{(check.get('file_line_range') or [0])[0]}"


# The template as written: its resources' Metadata skips, and no inline skip comment anywhere.
class Loader(yaml.SafeLoader):
    pass


Loader.add_multi_constructor("!", lambda loader, suffix, node: None)  # !Ref, !Sub, ...: not needed
with open(template) as f:
    text = f.read()
doc = json.loads(text) if template.endswith(".json") else yaml.load(text, Loader=Loader)
for number, line in enumerate(text.splitlines(), 1):
    if re.search(r"(checkov|bridgecrew|cortex):skip=", line):
        problems.append(f"{template}:{number}: an inline skip comment; skip in the resource's Metadata")
declared = {}
for logical_id, resource in (doc.get("Resources") or {}).items():
    metadata = resource.get("Metadata") if isinstance(resource, dict) else None
    if not isinstance(metadata, dict):
        continue
    name = f"{resource.get('Type')}.{logical_id}"
    if "bridgecrew" in metadata:
        problems.append(f"{name}: Metadata.bridgecrew; skip with Metadata.checkov.skip")
    if "checkov" not in metadata:
        continue
    skips = metadata["checkov"].get("skip") if isinstance(metadata["checkov"], dict) else None
    if not isinstance(skips, list) or not skips:
        problems.append(f"{name}: Metadata.checkov is not {{skip: [{{id, comment}}, ...]}}")
        continue
    for skip in skips:
        check_id = skip.get("id") if isinstance(skip, dict) else None
        comment = skip.get("comment") if isinstance(skip, dict) else None
        if not isinstance(check_id, str) or not re.fullmatch(r"CKV2?_[A-Z0-9]+_[0-9]+", check_id):
            problems.append(f"{name}: a skip without a checkov check id (CKV_...): {skip!r}")
            continue
        if not isinstance(comment, str) or not comment.strip():
            problems.append(f"{name}: the skip of {check_id} has no comment (say why)")
        declared[(name, check_id)] = comment

# Each skip in the report comes from such a Metadata entry, and each entry skipped a check.
reported = {(c["resource"], c["check_id"]) for c in results["skipped_checks"]}
for name, check_id in sorted(reported - declared.keys()):
    problems.append(f"{name}: {check_id} skipped, but not by the resource's Metadata")
for name, check_id in sorted(declared.keys() - reported):
    problems.append(f"{name}: the skip of {check_id} matches no check checkov runs on this resource")

print(f"checkov {target}: {summary['resource_count']} resources, {summary['passed']} passed, "
      f"{summary['failed']} failed, {summary['skipped']} skipped ({seconds} s)")
failed = collections.defaultdict(list)
for check in results["failed_checks"]:
    failed[(check["check_id"], check["check_name"])].append(check)
for (check_id, title), checks in sorted(failed.items(), key=lambda item: (len(item[0][0]), item[0][0])):
    print(f"  FAILED {check_id} ({len(checks)}): {title}")
    for check in checks:
        print(f"      {check['resource']}  {place(check)}")
for check in sorted(results["skipped_checks"], key=lambda c: (c["check_id"], c["resource"])):
    comment = declared.get((check["resource"], check["check_id"])) or "(no comment)"
    print(f"  skipped {check['check_id']} {check['resource']}  {place(check)}: {comment}")
if (checkov_status == "0") != (summary["failed"] == 0):
    problems.append(f"checkov exited {checkov_status} with {summary['failed']} failed checks")
for problem in problems:
    print(f"  !! {problem}")
sys.exit(1 if summary["failed"] or problems else 0)
EOF
done

if [[ $status -ne 0 ]]; then
    echo "!! checkov: failed checks or skip problems above (reports in $work/)" >&2
fi
exit "$status"
