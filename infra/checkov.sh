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
#   3. checkov 3.3.30, every check of its cloudformation framework, on each template twice: as written
#      (the parameters' defaults), and as a variant with the defaults flipped (target/checkov/
#      <sam|cdk>.flipped.template.json: WafEnabled=true, LakeAccessLogging=CloudTrailDataEvents,
#      ApiGatewayAccountRole=Existing, AlarmActionArn and JwtIssuer set), since checkov evaluates each
#      Condition with the defaults and leaves out the resources whose Condition is false. A marker check
#      (infra/checkov/scanned, always passing, not counted) names every resource scanned: the script
#      fails unless every resource of the template is in at least one scan's report. The script fails
#      on any failed check. A check is skipped only by the resource's own Metadata, with a reason:
#          Metadata:
#            checkov:
#              skip:
#                - id: CKV_AWS_117
#                  comment: why this resource does not need it
#      (in the CDK app: resource.cfnOptions.metadata or addMetadata('checkov', {skip: [...]})). There is
#      no --skip-check list here, and the script fails on a skip without a comment, on an inline
#      `checkov:skip=` comment, and on a skip that matches no check of its resource in either scan (a
#      typo), in the template and in its variant alike.
#
#   bash infra/checkov.sh            both templates
#   bash infra/checkov.sh sam        only infra/template.yaml
#   bash infra/checkov.sh cdk        only the CDK template
#
# Prints, per template and scan, the counts and each failed check (id, title, resource, file:line),
# grouped by check id; the JSON reports stay in target/checkov/. Offline: checkov runs with a clean environment
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
            sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'
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
marker_checks="$root/infra/checkov/scanned"

# env -i: only what is named here reaches the venv's Python (no BC_API_KEY, no CKV_SKIP_CHECK, ...).
# BC_SKIP_MAPPING and --skip-download: no policy metadata from the platform; the update check off: no
# request to PyPI.
clean() {
    (cd "$work/home" && env -i PATH="$venv_abs/bin:/usr/bin:/bin" HOME="$work_abs/home" LANG=C.UTF-8 \
        PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1 LOG_LEVEL=WARNING \
        BC_SKIP_MAPPING=TRUE CKV_SKIP_PACKAGE_UPDATE_CHECK=true \
        CKV_GITHUB_CONFIG_FETCH_DATA=false CKV_GITLAB_CONFIG_FETCH_DATA=false "$@")
}

status=0
for target in "${targets[@]}"; do
    case "$target" in
        sam) template="$sam_template" ;;
        cdk) template="$cdk_template" ;;
    esac
    template_abs="$(cd "$(dirname "$template")" && pwd)/$(basename "$template")"
    started=$SECONDS

    # 3a. The template with its parameters' defaults flipped: checkov evaluates each resource's
    # Condition with the defaults and leaves out the resources whose Condition is false (the WAF, the
    # trail, the authorizer, ...). Read with checkov's own parser, written as JSON (the same template,
    # only Parameters.<name>.Default changed), and scanned as a second template.
    flipped="$work_abs/$target.flipped.template.json"
    if ! clean timeout 120 "$venv_abs/bin/python" - "$template_abs" "$flipped" <<'EOF'; then
import json, sys

from checkov.cloudformation.parser import parse

# The value each parameter takes in the flipped scan: every other branch of the templates' Conditions.
FLIPPED = {
    "WafEnabled": "true",  # UseWaf: the web ACL, its association, log group and logging
    "LakeAccessLogging": "CloudTrailDataEvents",  # LakeCloudTrail: the trail of the lake's data events
    "ApiGatewayAccountRole": "Existing",  # CreateApiGatewayAccount false
    "AlarmActionArn": "arn:aws:sns:us-east-1:111122223333:alarms",  # CreateAlarmTopic false
    "JwtIssuer": "https://issuer.example.com",  # UseJwt: the authorizer, its wiring and alarms
    "JwtAudience": "example-audience",  # required with JwtIssuer (the rule JwtAudienceWithIssuer)
}
POSITIONS = {"__file__", "__startline__", "__endline__"}  # the parser's, not the template's


def plain(value):
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items() if k not in POSITIONS}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


source, out = sys.argv[1:3]
errors = {}
document, _ = parse(source, out_parsing_errors=errors)
if not isinstance(document, dict) or errors:
    sys.exit(f"!! checkov's parser could not read {source}: {errors}")
document = plain(document)
parameters = document.get("Parameters") or {}
missing = [name for name in FLIPPED if name not in parameters]
if missing:
    sys.exit(f"!! {source}: no parameters {missing} to flip (infra/checkov.sh FLIPPED)")
for name, value in FLIPPED.items():
    allowed = parameters[name].get("AllowedValues")
    if allowed is not None and value not in [str(v) for v in allowed]:
        sys.exit(f"!! {source}: {name}={value!r} is not one of its AllowedValues {allowed}")
    parameters[name]["Default"] = value
with open(out, "w") as f:
    json.dump(document, f, indent=1)
EOF
        echo "!! checkov $target: could not write the flipped variant $flipped" >&2
        status=1
        continue
    fi

    # 3b. The scans: the template as written (the defaults), then the flipped variant. Every check of
    # the cloudformation framework, and the marker (infra/checkov/scanned) that names every resource
    # scanned. Exit 0: no failed check; 1: failed checks; anything else: an error.
    scan_failed=0
    for scan in defaults flipped; do
        case "$scan" in
            defaults) file="$template_abs" ;;
            flipped) file="$flipped" ;;
        esac
        echo "==> checkov $target ($scan): ${file#"$root/"}"
        checkov_status=0
        clean timeout 300 "$venv_abs/bin/checkov" --file "$file" --framework cloudformation \
            --external-checks-dir "$marker_checks" --skip-download --skip-results-upload --output json \
            >"$work_abs/$target-$scan.json" 2>"$work_abs/$target-$scan.stderr" || checkov_status=$?
        echo "$checkov_status" >"$work_abs/$target-$scan.status"
        if [[ -s "$work/$target-$scan.stderr" ]]; then
            echo "checkov's messages ($work/$target-$scan.stderr):"
            sed 's/^/    /' "$work/$target-$scan.stderr" | head -40
        fi
        if [[ $checkov_status -ne 0 && $checkov_status -ne 1 ]]; then
            echo "!! checkov $target ($scan): exit $checkov_status (an error, not a result)" >&2
            scan_failed=1
        fi
    done
    if [[ $scan_failed -ne 0 ]]; then
        status=1
        continue
    fi

    # 3c. The reports, read back: the counts and failures of each scan, every skip judged against the
    # template (and the variant), and every resource of the template scanned at least once.
    timeout 120 "$venv/bin/python" - "$target" "$template" "$work" "$((SECONDS - started))" <<'EOF' || status=1
import collections, json, os, re, sys

import yaml

target, template, work, seconds = sys.argv[1:5]
MARKER = "CKV_TWOPC_1"  # infra/checkov/scanned/scanned.py
problems = []


def problem(text):
    if text not in problems:
        problems.append(text)


class Loader(yaml.SafeLoader):
    pass


Loader.add_multi_constructor("!", lambda loader, suffix, node: None)  # !Ref, !Sub, ...: not needed


def read(path):
    with open(path) as f:
        text = f.read()
    return text, (json.loads(text) if path.endswith(".json") else yaml.load(text, Loader=Loader))


def declared_skips(path, text, doc):
    """The resources' Metadata skips of one scanned file, (Type.LogicalId, check id) -> comment; and no
    inline skip comment, no Metadata.bridgecrew, no skip without an id or a comment."""
    for number, line in enumerate(text.splitlines(), 1):
        if re.search(r"(checkov|bridgecrew|cortex):skip=", line):
            problem(f"{path}:{number}: an inline skip comment; skip in the resource's Metadata")
    declared = {}
    for logical_id, resource in (doc.get("Resources") or {}).items():
        metadata = resource.get("Metadata") if isinstance(resource, dict) else None
        if not isinstance(metadata, dict):
            continue
        name = f"{resource.get('Type')}.{logical_id}"
        if "bridgecrew" in metadata:
            problem(f"{name}: Metadata.bridgecrew; skip with Metadata.checkov.skip")
        if "checkov" not in metadata:
            continue
        skips = metadata["checkov"].get("skip") if isinstance(metadata["checkov"], dict) else None
        if not isinstance(skips, list) or not skips:
            problem(f"{name}: Metadata.checkov is not {{skip: [{{id, comment}}, ...]}}")
            continue
        for skip in skips:
            check_id = skip.get("id") if isinstance(skip, dict) else None
            comment = skip.get("comment") if isinstance(skip, dict) else None
            if not isinstance(check_id, str) or not re.fullmatch(r"CKV2?_[A-Z0-9]+_[0-9]+", check_id):
                problem(f"{name}: a skip without a checkov check id (CKV_...): {skip!r}")
                continue
            if check_id == MARKER:
                problem(f"{name}: skips {MARKER}, infra/checkov.sh's marker of a scanned resource")
            if not isinstance(comment, str) or not comment.strip():
                problem(f"{name}: the skip of {check_id} has no comment (say why)")
            declared[(name, check_id)] = comment
    return declared


template_text, template_doc = read(template)
resources = template_doc.get("Resources") or {}
# Where each resource starts in the template (the flipped variant's lines are the JSON's, not the template's).
starts = {}
for number, line in enumerate(template_text.splitlines(), 1):
    match = re.match(r'^  "?([A-Za-z0-9]+)"?: ?[{]?$', line) if not template.endswith(".json") else \
        re.match(r'^  {0,4}"([A-Za-z0-9]+)": [{]$', line)
    if match and match.group(1) in resources and match.group(1) not in starts:
        starts[match.group(1)] = number

declared_all = {}
matched = set()  # (resource, check id) skipped by some scan
scanned_by = collections.defaultdict(list)  # logical id -> the scans that scanned it
shown_skips = set()
for scan in ("defaults", "flipped"):
    scanned_file = template if scan == "defaults" else f"{work}/{target}.flipped.template.json"
    text, doc = read(scanned_file)
    declared = declared_skips(scanned_file, text, doc)
    declared_all.update(declared)
    with open(f"{work}/{target}-{scan}.json") as f:
        data = json.load(f)
    with open(f"{work}/{target}-{scan}.status") as f:
        checkov_status = f.read().strip()
    reports = [r for r in (data if isinstance(data, list) else [data]) if r.get("check_type") == "cloudformation"]
    if len(reports) != 1 or not reports[0]["summary"]["resource_count"]:
        problem(f"checkov read no CloudFormation resource in {scanned_file}")
        continue
    results = reports[0]["results"]
    for error in results.get("parsing_errors") or []:
        problem(f"checkov could not parse {error}")
    marked = [c for c in results["passed_checks"] if c["check_id"] == MARKER]
    if not marked:
        problem(f"{scan}: no resource passed {MARKER}: the marker check (infra/checkov/scanned) did not load")
    scanned = set()
    for check in marked + results["failed_checks"] + results["skipped_checks"]:
        scanned.add(check["resource"])
        scanned_by[check["resource"].rsplit(".", 1)[-1]].append(scan)
    passed = [c for c in results["passed_checks"] if c["check_id"] != MARKER]
    failed, skipped = results["failed_checks"], results["skipped_checks"]

    # Each skip in the report comes from such a Metadata entry.
    reported = {(c["resource"], c["check_id"]) for c in skipped}
    matched |= reported
    for name, check_id in sorted(reported - declared.keys()):
        problem(f"{name}: {check_id} skipped, but not by the resource's Metadata")

    def place(check):
        if scan == "defaults":
            path = os.path.relpath(check.get("file_abs_path") or check["file_path"])
            return f"{path}:{(check.get('file_line_range') or [0])[0]}"
        logical_id = check["resource"].rsplit(".", 1)[-1]
        return f"{template}:{starts.get(logical_id, '?')} (flipped)"

    print(f"checkov {target} ({scan}): {len(scanned)} of {len(resources)} resources scanned, {len(passed)} passed, "
          f"{len(failed)} failed, {len(skipped)} skipped")
    by_check = collections.defaultdict(list)
    for check in failed:
        by_check[(check["check_id"], check["check_name"])].append(check)
    for (check_id, title), checks in sorted(by_check.items(), key=lambda item: (len(item[0][0]), item[0][0])):
        print(f"  FAILED {check_id} ({len(checks)}): {title}")
        for check in checks:
            print(f"      {check['resource']}  {place(check)}")
    for check in sorted(skipped, key=lambda c: (c["check_id"], c["resource"])):
        key = (check["resource"], check["check_id"])
        if key in shown_skips:
            continue  # shown with the defaults' scan
        shown_skips.add(key)
        print(f"  skipped {check['check_id']} {check['resource']}  {place(check)}: {declared.get(key) or '(no comment)'}")
    if (checkov_status == "0") != (len(failed) == 0):
        problem(f"{scan}: checkov exited {checkov_status} with {len(failed)} failed checks")
    if failed:
        problem(f"{scan}: {len(failed)} failed checks")

# Each Metadata skip skipped a check in a scan of its resource (else it is a typo, or stale).
scanned_names = {f"{resources[i].get('Type')}.{i}" for i in scanned_by if i in resources}
for name, check_id in sorted(declared_all.keys() - matched):
    where = "" if name in scanned_names else " (the resource was in no scan)"
    problem(f"{name}: the skip of {check_id} matches no check checkov runs on this resource{where}")
# Every resource of the template was scanned, with the defaults or flipped.
unscanned = [i for i in resources if i not in scanned_by]
for logical_id in unscanned:
    condition = resources[logical_id].get("Condition")
    problem(f"{logical_id}: in no scan's report{f' (Condition {condition}: flip its parameter in infra/checkov.sh)' if condition else ''}")
only_flipped = sorted(i for i, scans in scanned_by.items() if "defaults" not in scans)
print(f"checkov {target}: {len(resources) - len(unscanned)} of {len(resources)} resources scanned "
      f"({len(only_flipped)} only with the defaults flipped: {', '.join(only_flipped) or 'none'}) ({seconds} s)")
for text in problems:
    print(f"  !! {text}")
sys.exit(1 if problems else 0)
EOF
done

if [[ $status -ne 0 ]]; then
    echo "!! checkov: failed checks or skip problems above (reports in $work/)" >&2
fi
exit "$status"
