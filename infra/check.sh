#!/usr/bin/env bash
# Validates the deployment offline, on both templates: the SAM template (infra/template.yaml) and the
# CDK app's synthesized template (infra/cdk/cdk.out/TwoPhaseCommit.template.json).
#
#   1. a venv of its own (target/infra-venv) with the pinned versions of infra/tests/requirements.txt
#      (cfn-lint, the SAM translator, pytest): never the system's packages, so the result is the same
#      on any machine; recreated whenever the pins or the Python version change;
#   2. the CDK synthesis, `bash infra/cdk/synth.sh` (when the CDK app exists);
#   3. cfn-lint on the SAM template and on the CDK template: no errors, no warnings, no rule ignored;
#   4. infra/tests (pytest) on both: tables and environment against the code, least-privilege IAM,
#      arm64 Rust functions, stream event sources, storage and every production detail of
#      infra/DEPLOY.md. Each check runs on the SAM template after the transform (`sam` cases) and on
#      the CDK template (`cdk` cases).
#
#   bash infra/check.sh                 everything
#   bash infra/check.sh -k sam          pytest arguments are passed on (here: only the SAM cases)
#
# Needs python3 (3.10 or later) with venv, cargo (the code's contract), node/npm for the CDK app; no
# AWS account. Every step is bounded in time.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv="${INFRA_VENV:-target/infra-venv}"
requirements=infra/tests/requirements.txt
cdk_synth=infra/cdk/synth.sh
# INFRA_CDK_TEMPLATE: check another synthesized template instead (the tests read it too).
cdk_template="${INFRA_CDK_TEMPLATE:-infra/cdk/cdk.out/TwoPhaseCommit.template.json}"
python="${PYTHON:-python3}"

# Nothing from outside the venv may reach its interpreter.
unset PYTHONPATH PYTHONHOME
export PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

# --- 1. the venv ---------------------------------------------------------------------------------

# The stamp names the interpreter's version and the pins' digest: a change of either rebuilds.
stamp="$("$python" -c 'import sys; print("python", sys.version.split()[0])') $(sha256sum "$requirements" | cut -d' ' -f1)"
if [[ ! -x "$venv/bin/python" || "$(cat "$venv/.pins" 2>/dev/null)" != "$stamp" ]]; then
    echo "==> creating $venv with the pins of $requirements"
    rm -rf "$venv"
    timeout 120 "$python" -m venv "$venv"
    timeout 900 "$venv/bin/python" -m pip install --quiet -r "$requirements"
    timeout 120 "$venv/bin/python" -m pip check
    echo "$stamp" >"$venv/.pins"
fi
cfn_lint="$venv/bin/cfn-lint"

# --- 2. the CDK synthesis ------------------------------------------------------------------------

if [[ -n "${INFRA_CDK_TEMPLATE:-}" ]]; then
    echo "==> INFRA_CDK_TEMPLATE=$cdk_template: checked as it is, not synthesized"
elif [[ -f "$cdk_synth" ]]; then
    echo "==> bash $cdk_synth"
    timeout 1200 bash "$cdk_synth"
else
    echo "==> no $cdk_synth yet: the cdk cases of infra/tests fail until it writes $cdk_template"
fi

# --- 3. cfn-lint -----------------------------------------------------------------------------------

# Exit code 0 only when there is no error and no warning (informational findings are not shown).
echo "==> cfn-lint $("$cfn_lint" --version | awk '{print $2}') infra/template.yaml"
timeout 300 "$cfn_lint" infra/template.yaml
echo "cfn-lint: no errors, no warnings"
if [[ -f "$cdk_template" ]]; then
    echo "==> cfn-lint $cdk_template"
    timeout 300 "$cfn_lint" "$cdk_template"
    echo "cfn-lint: no errors, no warnings"
fi

# --- 4. the checks ---------------------------------------------------------------------------------

echo "==> infra/tests"
timeout 1800 "$venv/bin/python" -m pytest -q -p no:cacheprovider infra/tests "$@"
