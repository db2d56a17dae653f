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
# The benchmark also splits each reader's CPU time between its own
# process, the Cassandra node and memcached, given their pids.
SLUICE_BENCH_CASSANDRA_PID=$(cat .deps/cassandra/cassandra.pid)
SLUICE_BENCH_MEMCACHED_PID=$(cat ".deps/memcached-${SLUICE_TEST_MEMCACHED##*:}.pid")
export SLUICE_BENCH_CASSANDRA_PID SLUICE_BENCH_MEMCACHED_PID
CMD="go test -run '^\$' -bench BenchmarkColdPathCQL -benchtime $BENCHTIME -count $COUNT ./internal/app/"
# A Cassandra just started answers slowly until its JIT has compiled the
# read path, which flatters every ratio to gocql: one run first, not kept.
echo "bench-cql: warm-up run (not kept)" >&2
go test -run '^$' -bench BenchmarkColdPathCQL -benchtime "$BENCHTIME" -count 1 ./internal/app/ >&2
echo "bench-cql: $CMD" >&2
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
eval "$CMD" | tee "$raw" >&2

section=$(mktemp)
{
  echo "## Cold path on Cassandra"
  echo
  echo "Every read misses the cache (memcached is flushed before each read that"
  echo "goes through it): a 500-URI \`GetPostRecords\` through sluice over gRPC"
  echo "(guard, cache miss, the misses read in groups of \`--cql-read-group\`"
  echo "partitions, 20 by default, one \`SELECT ... WHERE uri IN ?\` per group at"
  echo "LOCAL_ONE, cache refill) against the same 500 URIs read directly with"
  echo "gocql as a service without sluice would read them: one token-aware"
  echo "single-partition SELECT per URI at the method's concurrency (50). They take"
  echo "turns in the same run against the one Cassandra 5.0 node of the test"
  echo "scripts. The ratio is sluice's throughput to the driver's read per URI;"
  echo "absolute figures depend on the"
  echo "machine and its load. On this machine the benchmark's client, sluice,"
  echo "memcached and the Cassandra JVM share the same cores."
  echo
  echo "Two more readers take the same turns, to show which layer keeps what:"
  echo "sluice's CQL store alone (\`store\`: its batch read of the 500, 25 groups"
  echo "under its query slots, retry policy and speculative attempt, at fan-out"
  echo "50) and sluice's read path in"
  echo "process (\`posts\`: the near and shared cache miss, the shared and"
  echo "instrumented batch read and the refill, at fan-out 50, without"
  echo "gRPC and the guard). Through gRPC the guard serves the batch as it serves"
  echo "any 500-URI batch by default: in 5 pieces of 100 (\`piece_items\`), two"
  echo "at a time, each with its own cache lookup, batch read (5 groups) and refill."
  echo "Each reader goes first in turn, after a garbage collection. One run"
  echo "of the same benchmark goes first and is not kept, so that Cassandra's JIT"
  echo "has compiled its read path before the runs below. The"
  echo "benchmark's process runs under the memory plan \`sluice serve\` applies"
  echo "(the soft memory limit and \`guard.gc_percent\`, 400 by default), as a"
  echo "deployed sluice does; the direct readers share the process, and so the plan."
  echo
  echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores ($(uname -m)), \`$CMD\`"
  echo "(run it with \`make bench\`):"
  echo
  echo "| run | gocql items/s | store items/s | posts items/s | sluice items/s | store/gocql | posts/gocql | **sluice/gocql** |"
  echo "|---|---|---|---|---|---|---|---|"
  awk '/^BenchmarkColdPathCQL/ {
    n++; g=""; st=""; p=""; s=""; rst=""; rp=""; r=""
    for (i = 1; i <= NF; i++) {
      if ($(i+1) == "gocql-items/s") g = $i
      if ($(i+1) == "store-items/s") st = $i
      if ($(i+1) == "posts-items/s") p = $i
      if ($(i+1) == "sluice-items/s") s = $i
      if ($(i+1) == "store/gocql") rst = $i
      if ($(i+1) == "posts/gocql") rp = $i
      if ($(i+1) == "sluice/gocql") r = $i
    }
    printf "| %d | %s | %s | %s | %s | %s | %s | %s |\n", n, g, st, p, s, rst, rp, r
    gs += g; sts += st; ps += p; ss += s; rsts += rst; rps += rp; rs += r
  }
  END { if (n) printf "| mean | %.0f | %.0f | %.0f | %.0f | %.3f | %.3f | **%.3f** |\n", gs/n, sts/n, ps/n, ss/n, rsts/n, rps/n, rs/n }' "$raw"
  echo
  echo "Where the CPU went, µs per record (user + system, means of the runs; each"
  echo "reader's garbage collected in its window): the"
  echo "benchmark's own process (its client, sluice and the driver), the"
  echo "Cassandra node and memcached, and how busy the machine's cores were"
  echo "during the reader's turns. Where they were near saturation, throughput"
  echo "follows the sum; a reader that leaves them idler is bound by its own"
  echo "waits (sluice serves a batch in pieces, two at a time)."
  echo
  echo "| reader | this process | Cassandra | memcached | sum | machine busy |"
  echo "|---|---:|---:|---:|---:|---:|"
  awk '/^BenchmarkColdPathCQL/ {
    for (i = 2; i <= NF; i++) {
      if ($i ~ /-µs\/item$/) {
        split($i, p, "-"); r = p[1]; part = p[2]
        sum[r, part] += $(i-1); n[r, part]++
      }
      if ($i ~ /-machine-busy$/) {
        split($i, p, "-"); busy[p[1]] += $(i-1); nb[p[1]]++
      }
    }
  }
  END {
    split("gocql store posts sluice", readers, " ")
    for (k = 1; k <= 4; k++) {
      r = readers[k]; t = 0; row = ""
      split("proc cassandra memcached", parts, " ")
      for (j = 1; j <= 3; j++) {
        v = n[r, parts[j]] ? sum[r, parts[j]] / n[r, parts[j]] : 0; t += v
        row = row sprintf(" %.1f |", v)
      }
      printf "| %s |%s %.1f | %.0f%% |\n", r, row, t, nb[r] ? 100 * busy[r] / nb[r] : 0
    }
  }' "$raw"
  echo
  echo "Target: sluice/gocql ≥ 0.8. The steps between the columns are what each"
  echo "layer costs or gains: the store's from gocql to \`store\` (its grouped"
  echo "reads cost the node far less CPU per record than one query each); the read path's (cache"
  echo "miss, coalescing, store metrics, refill) from \`store\` to \`posts\`;"
  echo "from \`posts\` to sluice, gRPC's, the guard's (serving in pieces among"
  echo "it) and the client's decoding."
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
