#!/usr/bin/env bash
# Build tools/golbbench, the go-liftbridge reference program of `make bench` and of the consumer group interop
# tests, into .tools/bin/golbbench.
#
# go-liftbridge's version and checksums come from tools/golbbench/go.mod and go.sum. Fast and
# silent when the binary is newer than every source file of the program.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${LIFTBRIDGE_TOOLS_BIN:-$root/.tools/bin}"
src="$root/tools/golbbench"
target="$bin/golbbench"

if [ -x "$target" ] && [ -z "$(find "$src" -maxdepth 1 \( -name '*.go' -o -name 'go.mod' -o -name 'go.sum' \) -newer "$target")" ]; then
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  want="$(awk '$1 == "require" && $2 == "github.com/liftbridge-io/go-liftbridge/v2" {print $3}' "$src/go.mod")"
  echo "error: Go is needed to build tools/golbbench (go-liftbridge ${want:-v2}) for \`make bench\` and the interop tests; install Go 1.25+ (https://go.dev/doc/install or apt-get install golang)" >&2
  exit 1
fi
echo "building golbbench (go-liftbridge reference benchmark) into $target"
mkdir -p "$bin"
cd "$src"
CGO_ENABLED=0 GOFLAGS=-mod=mod go build -o "$target" ./
