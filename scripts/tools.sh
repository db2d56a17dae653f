#!/usr/bin/env bash
# Installs the pinned Go tools sluice's scripts use into .tools/bin and
# prints the path of the one asked for. Usage: scripts/tools.sh NAME
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS="$PWD/.tools/bin"
declare -A PKG=(
  [grpcurl]=github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.3
  [staticcheck]=honnef.co/go/tools/cmd/staticcheck@v0.8.2
)
name=${1:?usage: scripts/tools.sh NAME}
[[ -n ${PKG[$name]:-} ]] || { echo "tools: unknown tool $name" >&2; exit 2; }
if [[ ! -x "$TOOLS/$name" ]]; then
  echo "tools: installing ${PKG[$name]}" >&2
  GOBIN="$TOOLS" go install "${PKG[$name]}"
fi
echo "$TOOLS/$name"
