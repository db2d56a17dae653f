#!/usr/bin/env bash
# Cold-path benchmark on Cassandra: items/s of uncached batches read through
# sluice against the same reads made directly with gocql at the same
# concurrency, in one run. Starts the servers it needs, prints go test's
# lines as they come, and writes the table to docs/benchmarks.md under
# "## Cold path on Cassandra" (other sections of the file are kept).
#
#   scripts/bench-cql.sh            BENCHTIME=40x COUNT=5 by default
set -euo pipefail
cd "$(dirname "$0")/.."
BENCHTIME=${BENCHTIME:-40x}
COUNT=${COUNT:-5}
OUT=docs/benchmarks.md
# Through a variable, so that set -e stops here when a server cannot be set
# up (eval of a failed command substitution would carry on with nothing).
deps_env=$(scripts/test-deps.sh up)
eval "$deps_env"
CMD="go test -run '^\$' -bench BenchmarkColdPathCQL -benchtime $BENCHTIME -count $COUNT ./internal/app/"
echo "bench-cql: $CMD" >&2
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
eval "$CMD" | tee "$raw" >&2

section=$(mktemp)
{
  echo "## Cold path on Cassandra"
  echo
  echo "Every read misses the cache (memcached is flushed before each request):"
  echo "a 500-URI \`GetPostRecords\` through sluice over gRPC (guard, cache miss,"
  echo "one token-aware single-partition SELECT per URI at LOCAL_ONE, cache refill)"
  echo "against the same 500 SELECTs made directly with gocql at the method's"
  echo "concurrency (50), taking turns in the same run against the one Cassandra 5.0"
  echo "node of the test scripts. The ratio is what sluice keeps of the driver's"
  echo "throughput; absolute figures depend on the machine and its load. Per item,"
  echo "sluice adds a memcached miss and refill, protobuf and gRPC encoding and the"
  echo "guard's admission, and on this machine the benchmark's client, sluice and"
  echo "the Cassandra JVM share the same cores."
  echo
  echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores ($(uname -m)), \`$CMD\`"
  echo "(run it with \`make bench\`):"
  echo
  echo "| run | sluice items/s | gocql items/s | sluice/gocql |"
  echo "|---|---|---|---|"
  awk '/^BenchmarkColdPathCQL/ {
    n++; s=""; g=""; r=""
    for (i = 1; i <= NF; i++) {
      if ($(i+1) == "sluice-items/s") s = $i
      if ($(i+1) == "gocql-items/s") g = $i
      if ($(i+1) == "sluice/gocql") r = $i
    }
    printf "| %d | %s | %s | %s |\n", n, s, g, r
    ss += s; gs += g; rs += r
  }
  END { if (n) printf "| mean | %.0f | %.0f | %.3f |\n", ss/n, gs/n, rs/n }' "$raw"
  echo
} >"$section"

mkdir -p docs
[[ -f $OUT ]] || printf '# Benchmarks\n\nEach section is written by the script named in it; `make bench` runs them all.\n\n' >"$OUT"
# Replace the section (from its heading to the next "## " heading) or append it.
awk -v sec="$section" '
  BEGIN { while ((getline line < sec) > 0) body = body line "\n" }
  /^## Cold path on Cassandra$/ { printf "%s", body; skip = 1; done = 1; next }
  skip && /^## / { skip = 0 }
  !skip { print }
  END { if (!done) printf "%s", body }
' "$OUT" >"$OUT.tmp" && mv "$OUT.tmp" "$OUT"
echo "bench-cql: wrote the table to $OUT" >&2
