#!/usr/bin/env bash
# Runs every Go fuzz target in the module for the given budget each; on a
# failure prints the fuzzer's whole output (with the failing input's path
# under testdata/fuzz) and stops.
# Usage: scripts/fuzz.sh 30000x   (an execution count; see the Makefile for
# why counts rather than durations)
set -euo pipefail
cd "$(dirname "$0")/.."
TIME=${1:-30000x}
dirs=(); for d in internal pkg cmd; do [[ -d $d ]] && dirs+=("$d"); done
files=$(grep -rl --include='*_test.go' '^func Fuzz' "${dirs[@]}" | sort || true)
out=$(mktemp); trap 'rm -f "$out"' EXIT
for file in $files; do
  pkg=./$(dirname "$file")
  for target in $(grep -oE '^func Fuzz[A-Za-z0-9_]+' "$file" | sed 's/^func //'); do
    echo "fuzz: $pkg $target, $TIME"
    if ! go test -run '^$' -fuzz "^${target}\$" -fuzztime "$TIME" "$pkg" >"$out" 2>&1; then
      cat "$out"; exit 1
    fi
    tail -n 1 "$out"
  done
done
