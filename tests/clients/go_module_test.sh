#!/usr/bin/env bash
# The Go module (clients/go), offline: its checked-in stubs are what protoc-gen-go and
# protoc-gen-go-grpc generate from proto/ now, `go vet` is clean, and `go test` passes against a
# real `gcmoe serve`. Go builds through clients/go/offline.sh: GOPATH mode over Debian's packaged
# Go sources (/usr/share/gocode: golang-google-grpc-dev, golang-google-protobuf-dev).
#
#   go_module_test.sh SOURCE_DIR WORK_DIR GCMOE_BINARY [plaintext|tls]
#
# plaintext (the default) checks the stubs, vets, and runs every test but TestTLS*; tls runs the
# TestTLS* tests (a service on TLS with a token). Go 1.19's `go test` has no -skip, hence the
# pattern for "every test not named TestTLS".
set -euo pipefail
source_dir=$1
work_dir=$2
binary=$3
mode=${4:-plaintext}
offline=("$source_dir/clients/go/offline.sh" --work "$work_dir")
if [ "$mode" = tls ]; then
  GCMOE_BINARY=$binary "${offline[@]}" go test -count=1 -run '^TestTLS' ./...
  exit
fi

# The stubs: regenerate into a scratch folder and compare.
fresh=$(mktemp -d)
trap 'rm -rf "$fresh"' EXIT
protoc --proto_path="$source_dir/proto" \
  --go_out="$fresh" --go_opt=module=gcmoe/clients/go \
  --go-grpc_out="$fresh" --go-grpc_opt=module=gcmoe/clients/go \
  "$source_dir/proto/gcmoe/v1/moe.proto"
if ! diff -r "$fresh/gcmoev1" "$source_dir/clients/go/gcmoev1"; then
  echo "go_module_test: clients/go/gcmoev1 is stale: regenerate it (see clients/go/README.md)" >&2
  exit 1
fi

# GOPATH mode over Debian's Go sources, as a user without a module proxy runs it.
"${offline[@]}" go vet ./...
GCMOE_BINARY=$binary "${offline[@]}" go test -count=1 -run '^Test([^T]|T[^L]|TL[^S])' ./...
