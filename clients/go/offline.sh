#!/usr/bin/env bash
# Runs a go command on this module without a module proxy: GOPATH mode over Debian's packaged Go
# sources (golang-google-grpc-dev, golang-google-protobuf-dev in /usr/share/gocode), with the
# module at its import path gcmoe/clients/go inside a GOPATH of its own.
#   clients/go/offline.sh [--work DIR] go run ./example/forward -addr 127.0.0.1:50051
# --work holds that GOPATH and the build cache (default: clients/go/.gopath, git-ignored).
# With network access, plain module mode works too: `go mod tidy && go run ./example/forward`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$here/.gopath
if [ "${1:-}" = "--work" ]; then
  work=$2
  shift 2
fi
if [ $# -eq 0 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,7p' "$0"
  exit 0
fi
mkdir -p "$work/src/gcmoe/clients"
ln -sfn "$here" "$work/src/gcmoe/clients/go"
export GO111MODULE=off GOPATH="$work:/usr/share/gocode" GOCACHE="$work/cache" GOFLAGS= GOPROXY=off
cd "$work/src/gcmoe/clients/go"
exec "$@"
