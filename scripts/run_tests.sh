#!/usr/bin/env bash
# Run pytest in the project venv; "no tests collected" (exit 5) is a failure, not a pass.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi
exit "$rc"
