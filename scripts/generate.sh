#!/usr/bin/env bash
# Rebuilds api/ from proto/ with pinned generator versions.
# protoc comes from Debian's protobuf-compiler package; the Go plugins are
# installed into .tools/bin at the versions pinned below.
set -euo pipefail
cd "$(dirname "$0")/.."

PROTOC_VERSION=3.21.12 # Debian bookworm's protobuf-compiler; it is named in every header
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.5.1
TOOLS="$PWD/.tools/bin"

if ! command -v protoc >/dev/null; then
  echo "generate: installing protobuf-compiler (Debian package)" >&2
  scripts/apt-install.sh protobuf-compiler
fi
if [[ $(protoc --version) != "libprotoc $PROTOC_VERSION" ]]; then
  echo "generate: $(command -v protoc) is $(protoc --version), not the pinned libprotoc $PROTOC_VERSION;" \
    "the generated headers would differ from the committed ones" >&2
  exit 1
fi
mkdir -p "$TOOLS"
if [[ ! -x "$TOOLS/protoc-gen-go" ]] || ! "$TOOLS/protoc-gen-go" --version | grep -q "${PROTOC_GEN_GO_VERSION}"; then
  GOBIN="$TOOLS" go install "google.golang.org/protobuf/cmd/protoc-gen-go@${PROTOC_GEN_GO_VERSION}"
fi
if [[ ! -x "$TOOLS/protoc-gen-go-grpc" ]] || ! "$TOOLS/protoc-gen-go-grpc" --version | grep -q "${PROTOC_GEN_GO_GRPC_VERSION#v}"; then
  GOBIN="$TOOLS" go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@${PROTOC_GEN_GO_GRPC_VERSION}"
fi

PROTOS=$(find proto -name '*.proto' | sort)
rm -rf api/sluice api/bsky
PATH="$TOOLS:$PATH" protoc -I proto \
  --go_out=api --go_opt=module=github.com/sluice-dev/sluice/api \
  --go-grpc_out=api --go-grpc_opt=module=github.com/sluice-dev/sluice/api \
  $PROTOS
echo "generate: api/ rebuilt from $(echo "$PROTOS" | wc -w) proto file(s)"

# The AppView client test's JavaScript, from proto/bsky, with the npm
# generators pinned in test/appview/package-lock.json.
scripts/appview-deps.sh
rm -rf test/appview/gen
(cd test/appview && node_modules/.bin/buf generate)
echo "generate: test/appview/gen rebuilt from proto/bsky and proto/sluice/v1"
