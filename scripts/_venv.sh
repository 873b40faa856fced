# Sourced by scripts/test.sh and scripts/dev.sh: keeps .venv in step with pyproject.toml.
# Needs only Python 3.11+ (PYTHON=... picks another interpreter).

python=${PYTHON:-python3}
venv=.venv

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "$0: needs Python 3.11 or newer as '$python' (set PYTHON=...)" >&2
    exit 1
fi

mkdir -p "$venv"
# Two runs at once must not both install into the venv.
if command -v flock >/dev/null; then
    exec 9>"$venv/.lock"
    flock 9
fi

if [ ! -x "$venv/bin/python" ]; then
    echo "$0: creating $venv" >&2
    if ! "$python" -m venv "$venv"; then
        echo "$0: '$python -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)" >&2
        exit 1
    fi
fi

# Reinstall only when pyproject.toml changed since the last successful install.
stamp="$venv/.cyclone-pyproject.sha256"
want=$("$venv/bin/python" -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "$0: installing the project and its dev dependencies into $venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[dev]'
    echo "$want" >"$stamp"
fi

if command -v flock >/dev/null; then
    exec 9>&-
fi
