#!/usr/bin/env bash
# Regenerates the committed Go code of the wire contract, sdks/go/cyclonepb/, from
# proto/cyclone/v1/*.proto. With --check it writes nothing and fails, listing the files,
# when regenerating would change anything (tests/acceptance/test_go_sdk.py runs it).
#
#   sdks/go/scripts/gen.sh           # rewrite sdks/go/cyclonepb/
#   sdks/go/scripts/gen.sh --check   # exit 1 if it is stale
#
# Pinned tools, so that a regeneration is byte for byte the committed code: protoc from
# grpcio-tools (the version pyproject.toml pins; $PROTOC overrides the command), and the
# protoc-gen-go v1.28.1 and protoc-gen-go-grpc 1.0 of Debian 12 (packages protoc-gen-go and
# protoc-gen-go-grpc, which scripts/examples_setup.sh installs). The protos have no
# go_package option: M flags name the Go package.
set -euo pipefail
sdk=$(cd "$(dirname "$0")/.." && pwd)
repo=$(cd "$sdk/../.." && pwd)
module=github.com/cyclone-workflows/cyclone/sdks/go
pkg=cyclonepb
say() { echo "gen.sh: $*" >&2; }

check=no
case "${1:-}" in
    --check) check=yes ;;
    "") ;;
    *) say "usage: $0 [--check]"; exit 2 ;;
esac

read -ra protoc <<<"${PROTOC:-$repo/.venv/bin/python -m grpc_tools.protoc}"
want_go="protoc-gen-go v1.28.1"
want_grpc="protoc-gen-go-grpc 1.0"
for tool in protoc-gen-go protoc-gen-go-grpc; do
    command -v "$tool" >/dev/null || { say "$tool not found: apt-get install protoc-gen-go protoc-gen-go-grpc"; exit 1; }
done
[ "$(protoc-gen-go --version)" = "$want_go" ] ||
    { say "needs $want_go (Debian 12), found $(protoc-gen-go --version)"; exit 1; }
[ "$(protoc-gen-go-grpc --version 2>&1)" = "$want_grpc" ] ||
    { say "needs $want_grpc (Debian 12), found $(protoc-gen-go-grpc --version 2>&1)"; exit 1; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
files=()
opts=(--go_opt="module=$module" --go-grpc_opt="module=$module")
for path in "$repo"/proto/cyclone/v1/*.proto; do
    rel=cyclone/v1/$(basename "$path")
    files+=("$rel")
    opts+=(--go_opt="M$rel=$module/$pkg" --go-grpc_opt="M$rel=$module/$pkg")
done
"${protoc[@]}" -I "$repo/proto" --go_out="$out" --go-grpc_out="$out" "${opts[@]}" "${files[@]}"

if [ "$check" = yes ]; then
    if ! diff -r -q "$out/$pkg" "$sdk/$pkg" >&2; then
        say "sdks/go/$pkg is stale: run sdks/go/scripts/gen.sh"
        exit 1
    fi
    say "sdks/go/$pkg is up to date (${#files[@]} protos)"
    exit 0
fi
rm -rf "$sdk/$pkg"
mkdir -p "$sdk/$pkg"
cp "$out/$pkg"/*.go "$sdk/$pkg/"
say "wrote sdks/go/$pkg ($(ls "$sdk/$pkg" | wc -l) files from ${#files[@]} protos)"
