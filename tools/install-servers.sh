#!/usr/bin/env bash
# Install the pinned Liftbridge server and NATS server into .tools/bin.
#
# Versions and checksums come from tools/go/go.mod and go.sum. The build runs
# `go install` inside that module (not `go install pkg@version`, which asks the
# module proxy for the version list and is refused there). Fast and silent
# when both binaries are already installed at the pinned versions.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${LIFTBRIDGE_TOOLS_BIN:-$root/.tools/bin}"
modfile="$root/tools/go/go.mod"
want_lb="$(awk '$1 == "github.com/liftbridge-io/liftbridge" {print $2}' "$modfile")"
want_nats="$(awk '$1 == "github.com/nats-io/nats-server/v2" {print $2}' "$modfile")"

installed() {
  [ -x "$bin/liftbridge" ] && [ -x "$bin/nats-server" ] &&
    "$bin/liftbridge" --version 2>/dev/null | grep -qF "$want_lb" &&
    "$bin/nats-server" --version 2>/dev/null | grep -qF "$want_nats"
}

if installed; then
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "error: Go is needed to build the Liftbridge server ($want_lb); install Go 1.21+ (https://go.dev/doc/install or apt-get install golang)" >&2
  exit 1
fi
echo "installing liftbridge $want_lb and nats-server $want_nats into $bin (go install, about a minute)"
mkdir -p "$bin"
cd "$root/tools/go"
CGO_ENABLED=0 GOFLAGS=-mod=mod GOBIN="$bin" \
  go install github.com/liftbridge-io/liftbridge github.com/nats-io/nats-server/v2
installed || { echo "error: installed binaries in $bin do not report $want_lb / $want_nats" >&2; exit 1; }
"$bin/liftbridge" --version
"$bin/nats-server" --version
