#!/usr/bin/env bash
# Builds bin/demo-worker from proto/ with Debian's Go toolchain, in GOPATH mode (no module
# proxy needed): generates the stubs, lays out a GOPATH under .gopath/, vets and builds.
#
#   examples/worker-go/build.sh        # needs the Debian packages named in README.md
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
proto=$(cd "$here/../../proto" && pwd)
gopath="$here/.gopath"
pkg="$gopath/src/cyclone.example"   # the import path root of this example

for tool in go protoc protoc-gen-go protoc-gen-go-grpc; do
    command -v "$tool" >/dev/null || { echo "worker-go/build.sh: $tool not found; run scripts/ci_polyglot_setup.sh" >&2; exit 1; }
done

mkdir -p "$pkg/pb" "$here/bin"
# workers.proto has no go_package option, so the M flag names the Go package.
map=Mcyclone/v1/workers.proto=cyclone.example/pb
protoc -I "$proto" \
    --go_out="$gopath/src" --go_opt="$map" \
    --go-grpc_out="$gopath/src" --go-grpc_opt="$map" \
    cyclone/v1/workers.proto
ln -sfn "$here/worker" "$pkg/worker"
ln -sfn "$here/cmd" "$pkg/cmd"

export GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOFLAGS=
cd "$pkg"
go vet ./worker ./cmd/demo-worker
go build -o "$here/bin/demo-worker" ./cmd/demo-worker
