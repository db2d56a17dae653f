#!/usr/bin/env bash
# Runs every Go fuzz target in the module for the given time each.
# Usage: scripts/fuzz.sh 5s
set -euo pipefail
cd "$(dirname "$0")/.."
TIME=${1:-5s}
grep -rl --include='*_test.go' '^func Fuzz' $(ls -d internal pkg cmd 2>/dev/null) | sort | while read -r file; do
  pkg=./$(dirname "$file")
  for target in $(grep -oE '^func Fuzz[A-Za-z0-9_]+' "$file" | sed 's/^func //'); do
    echo "fuzz: $pkg $target for $TIME"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$TIME" "$pkg" | tail -n 1
  done
done
