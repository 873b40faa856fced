# Sourced by scripts/test.sh and scripts/dev.sh: keeps .venv in step with pyproject.toml.
# Needs only Python 3.11+ (PYTHON=... picks another interpreter). The caller may set
# extras=dev,examples to install more extras of pyproject.toml (default: dev).

python=${PYTHON:-python3}
venv=.venv
extras=${extras:-dev}

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

# Reinstall only when pyproject.toml (or the extras asked for) changed since the last
# successful install; a venv holding more extras than asked stays as it is.
stamp="$venv/.cyclone-pyproject.sha256"
want=$("$venv/bin/python" -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')
have=$(cat "$stamp" 2>/dev/null || true)
missing_extra=no
for extra in ${extras//,/ }; do
    printf ',%s,' "${have#* }" | grep -q ",$extra," || missing_extra=yes
done
if [ "${have%% *}" != "$want" ] || [ "$missing_extra" = yes ]; then
    # Keep the extras installed before (each once): a later run may ask for fewer.
    [ "${have%% *}" = "$want" ] && extras=$(printf '%s,%s' "${have#* }" "$extras" | tr ',' '\n' | awk 'NF && !seen[$0]++' | paste -sd, -)
    echo "$0: installing the project with its extras [$extras] into $venv (pip install -e '.[$extras]')" >&2
    # Before its rename to cyclone-workflows the project was installed as `cyclone`.
    "$venv/bin/python" -m pip uninstall --quiet --yes cyclone >/dev/null 2>&1 || true
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[$extras]"
    echo "$want $extras" >"$stamp"
fi

if command -v flock >/dev/null; then
    exec 9>&-
fi
