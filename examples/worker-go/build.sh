#!/usr/bin/env bash
# Builds bin/demo-worker from proto/: generates the stubs, vets and builds, with the gRPC and
# protobuf Go packages from one of two places:
#
#   examples/worker-go/build.sh debian    # Debian's packages, GOPATH mode (no module proxy)
#   examples/worker-go/build.sh modules   # the Go module proxy, module mode (pinned below)
#
# protoc: $PROTOC if set (e.g. PROTOC="python -m grpc_tools.protoc"), else `protoc` on PATH.
# scripts/examples_setup.sh picks the mode and brings the tools (see README.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
proto=$(cd "$here/../../proto" && pwd)
mode=${1:-debian}
read -ra protoc <<<"${PROTOC:-protoc}"
say() { echo "worker-go/build.sh: $*" >&2; }

case "$mode" in
    debian)
        root="$here/.gopath/src/cyclone.example"   # the import path root of this example
        export GO111MODULE=off GOPATH="$here/.gopath:/usr/share/gocode" GOFLAGS=
        ;;
    modules)
        root="$here/.gomod"
        export GO111MODULE=on GOFLAGS=-mod=mod GOBIN="$here/.gomod/bin"
        mkdir -p "$GOBIN"
        (cd "$root" && { [ -f go.mod ] || go mod init cyclone.example; } &&
         go get google.golang.org/grpc@v1.64.1 google.golang.org/protobuf@v1.34.2 &&
         go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.34.2 &&
         go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.4.0)
        PATH="$GOBIN:$PATH"
        ;;
    *) say "unknown mode '$mode' (debian or modules)"; exit 2 ;;
esac
for tool in go "${protoc[0]}" protoc-gen-go protoc-gen-go-grpc; do
    command -v "$tool" >/dev/null || { say "$tool not found; run scripts/examples_setup.sh"; exit 1; }
done

mkdir -p "$root/pb" "$here/bin"
# workers.proto has no go_package option, so the M flag names the Go package.
map=Mcyclone/v1/workers.proto=cyclone.example/pb
"${protoc[@]}" -I "$proto" \
    --go_out="$root/pb" --go_opt=paths=source_relative --go_opt="$map" \
    --go-grpc_out="$root/pb" --go-grpc_opt=paths=source_relative --go-grpc_opt="$map" \
    cyclone/v1/workers.proto
mv -f "$root/pb/cyclone/v1/"*.go "$root/pb/" && rm -rf "$root/pb/cyclone"
ln -sfn "$here/worker" "$root/worker"
ln -sfn "$here/cmd" "$root/cmd"

cd "$root"
go vet ./worker ./cmd/demo-worker
go build -o "$here/bin/demo-worker" ./cmd/demo-worker
