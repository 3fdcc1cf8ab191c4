#!/usr/bin/env bash
# Validates the deployment offline: cfn-lint on the SAM template (no errors, no warnings), then the
# template's own checks (infra/tests): tables and environment against the code, least-privilege IAM,
# arm64 Rust builds, stream event sources, storage. Needs python3 (pytest) and cargo; no AWS account.
#
#   bash infra/check.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! python3 -c 'import cfnlint' 2>/dev/null || ! command -v cfn-lint >/dev/null 2>&1; then
    echo "==> installing cfn-lint"
    python3 -m pip install --quiet cfn-lint
fi
if ! python3 -c 'import pytest' 2>/dev/null; then
    echo "==> installing pytest"
    python3 -m pip install --quiet pytest
fi

echo "==> cfn-lint $(cfn-lint --version | awk '{print $2}') infra/template.yaml"
# Exit code 0 only when there is no error and no warning (informational findings are not shown).
cfn-lint infra/template.yaml
echo "cfn-lint: no errors, no warnings"

echo "==> infra/tests"
PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -q -p no:cacheprovider infra/tests
