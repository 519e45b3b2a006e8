#!/usr/bin/env bash
# Install the pinned S3-compatible server (Versity's S3 gateway, versitygw) into .tools/bin.
#
# Its version and checksums come from tools/go-s3/go.mod and go.sum, a module of its own: versitygw's
# dependencies (nats.go 1.5x, the AWS and Azure SDKs) would move the versions Liftbridge is built with in
# tools/go. The build runs `go install` inside that module, like tools/install-servers.sh, and stamps the
# pinned version into the binary (`versitygw --version` prints "git" otherwise). Fast and silent when the
# binary already reports the pinned version. Cold (empty Go caches, 2 CPUs): about 3.5 minutes, a 61 MB
# binary, about 760 MB of Go module and build caches (218 s measured on 2 CPUs).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${LIFTBRIDGE_TOOLS_BIN:-$root/.tools/bin}"
module="$root/tools/go-s3"
want="$(awk '$1 == "require" && $2 == "github.com/versity/versitygw" {print $3}' "$module/go.mod")"
if [ -z "$want" ]; then
  echo "error: tools/go-s3/go.mod does not pin github.com/versity/versitygw" >&2
  exit 1
fi

installed() {
  local version  # read whole first: grep -q stopping early would end versitygw with SIGPIPE (pipefail)
  [ -x "$bin/versitygw" ] && version="$("$bin/versitygw" --version 2>/dev/null)" &&
    grep -qxE "Version *: *${want//./\\.}" <<<"$version"
}

if installed; then
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "error: Go is needed to build the S3 gateway (versitygw $want); install Go 1.25+ (https://go.dev/doc/install or apt-get install golang)" >&2
  exit 1
fi
echo "installing versitygw $want into $bin (go install, about 3.5 minutes on a cold cache)"
mkdir -p "$bin"
started=$(date +%s)
cd "$module"
CGO_ENABLED=0 GOFLAGS=-mod=mod GOBIN="$bin" \
  go install -ldflags "-X main.Version=$want -X main.Build=go.sum" github.com/versity/versitygw/cmd/versitygw
installed || { echo "error: $bin/versitygw does not report $want" >&2; exit 1; }
echo "versitygw $want built in $(($(date +%s) - started)) s"
