#!/usr/bin/env bash
# `make bench`: measures sluice on this machine and writes docs/benchmarks.md.
#
# Each part is a function that writes a Markdown fragment to $OUT/md/NN-name.md
# and logs the commands it ran (run_logged) to $OUT/md/NN-name.cmds; the
# document is the header followed by every fragment, in file-name order,
# each with its commands. To add a part, write one more function and add
# one line to the list at the bottom.
#
# Environment: SLUICE_BENCH_POSTS (50000), SLUICE_BENCH_RUN (incident run
# length, 40s), SLUICE_BENCH_ROUNDS (incident pairs against sluice, 3),
# SLUICE_BENCH_TPUT (closed-loop length per path, 10s),
# SLUICE_BENCH_CONCURRENCY (16), SLUICE_BENCH_PEER_LEG (one server, one
# round of one peer case, 4s), SLUICE_BENCH_PEER_ROUNDS (6),
# SLUICE_BENCH_ZIPF_S (1.1), SLUICE_BENCH_CONTROL_CASES (the peer part's
# control, sluice against a second sluice: "zipf1,50"), SLUICE_BENCH_FAIR_RUN (each fair-share run,
# 20s), SLUICE_BENCH_FAIR_ROUNDS (3), SLUICE_BENCH_WRITE_RUN (each
# write-path leg, 5s), SLUICE_BENCH_WRITE_ROUNDS (2), SLUICE_BENCH_JOURNAL_ROUNDS
# (journal-row rounds, 3), SLUICE_BENCH_TOMBSTONE_ROUNDS (3), SLUICE_BENCH_DIR (.bench).
# SLUICE_BENCH_PARTS ("cachehit incident fairshare coldpath peer writepath journalrow tombstones") runs only the
# parts it names and then writes $OUT/BENCHMARKS.md instead of the doc.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${SLUICE_BENCH_DIR:-.bench}
POSTS=${SLUICE_BENCH_POSTS:-50000}
RUN=${SLUICE_BENCH_RUN:-40s}
ROUNDS=${SLUICE_BENCH_ROUNDS:-3}
TPUT=${SLUICE_BENCH_TPUT:-10s}
CONC=${SLUICE_BENCH_CONCURRENCY:-16}
PEER_LEG=${SLUICE_BENCH_PEER_LEG:-4s}
PEER_ROUNDS=${SLUICE_BENCH_PEER_ROUNDS:-6}
ZIPF_S=${SLUICE_BENCH_ZIPF_S:-1.1}
FAIR_RUN=${SLUICE_BENCH_FAIR_RUN:-20s}
FAIR_ROUNDS=${SLUICE_BENCH_FAIR_ROUNDS:-3}
WRITE_RUN=${SLUICE_BENCH_WRITE_RUN:-5s}
WRITE_ROUNDS=${SLUICE_BENCH_WRITE_ROUNDS:-2}
CAP=64 # sluice's --memcached-max-conns
DOC=docs/benchmarks.md
BIN=$OUT/bin
DATA=$OUT/data
URIS=$DATA/uris.txt
BASE_PORT=${SLUICE_BENCH_BASE_PORT:-24000}  # below the ephemeral range (32768+), which the naive server fills

log() { echo "bench: $*" >&2; }

PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# run_logged PART CMD… runs CMD and appends it to PART's command list.
run_logged() {
  local part=$1; shift
  echo "$*" >>"$OUT/md/$part.cmds"
  "$@"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() {
  for _ in $(seq 100); do port_open "$1" && return 0; sleep 0.1; done
  log "nothing listens on port $1"; exit 1
}
stop_pid() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# start_memcached PART PORT: a fresh memcached with the production defaults
# (1,024 connections) and room for the dataset. Sets MC_PID.
start_memcached() {
  local user=()
  [[ $(id -u) -eq 0 ]] && user=(-u root)
  echo "memcached -l 127.0.0.1 -p $2 -U 0 -m 1024 -c 1024 &" >>"$OUT/md/$1.cmds"
  /usr/bin/memcached -l 127.0.0.1 -p "$2" -U 0 -m 1024 -c 1024 "${user[@]}" &
  MC_PID=$!; PIDS+=("$MC_PID")
  wait_port "$2"
}

# start_sluice PART MCPORT GRPCPORT HTTPPORT. Sets SRV_PID. SLUICE_CONFIG
# (config/bench.yaml) names another config file.
start_sluice() {
  local config=${SLUICE_CONFIG:-config/bench.yaml}
  echo "$BIN/sluice serve --config $config --data-dir $DATA --memcached 127.0.0.1:$2 --memcached-max-conns $CAP --grpc-addr 127.0.0.1:$3 --http-addr 127.0.0.1:$4 &" >>"$OUT/md/$1.cmds"
  "$BIN/sluice" serve --config "$config" --data-dir "$DATA" --memcached "127.0.0.1:$2" --memcached-max-conns "$CAP" \
    --grpc-addr "127.0.0.1:$3" --http-addr "127.0.0.1:$4" 2>>"$OUT/sluice.log" &
  SRV_PID=$!; PIDS+=("$SRV_PID")
  wait_port "$3"; wait_port "$4"
}

# start_naive PART MCPORT GRPCPORT HTTPPORT LOG. Sets SRV_PID.
start_naive() {
  echo "$BIN/sluice-naive --data-dir $DATA --memcached 127.0.0.1:$2 --grpc-addr 127.0.0.1:$3 --http-addr 127.0.0.1:$4 --log $5 &" >>"$OUT/md/$1.cmds"
  "$BIN/sluice-naive" --data-dir "$DATA" --memcached "127.0.0.1:$2" --grpc-addr "127.0.0.1:$3" \
    --http-addr "127.0.0.1:$4" --log "$5" 2>>"$OUT/naive.log" &
  SRV_PID=$!; PIDS+=("$SRV_PID")
  wait_port "$3"; wait_port "$4"
}

part_setup() {
  scripts/apt-install.sh memcached
  rm -rf "$OUT"; mkdir -p "$OUT/md" "$BIN" "$DATA"
  go build -o "$BIN/" ./cmd/sluice ./cmd/sluice-load ./bench/cmd/sluice-bench ./bench/naive/cmd/sluice-naive ./bench/peer/cmd/sluice-peer
  run_logged 00-setup "$BIN/sluice" seed --data-dir "$DATA" --posts "$POSTS" --uris-out "$URIS"
}

part_cachehit() {
  local p=10-cachehit mc=$((BASE_PORT + 11)) g=$((BASE_PORT + 51)) h=$((BASE_PORT + 80))
  start_memcached $p $mc; local mcpid=$MC_PID
  start_sluice $p $mc $g $h
  run_logged $p "$BIN/sluice-bench" cachehit --target 127.0.0.1:$g --memcached 127.0.0.1:$mc --uris "$URIS" \
    --concurrency "$CONC" --batch 50 --duration "$TPUT" --server-pid "$SRV_PID" --memcached-pid "$mcpid" --md "$OUT/md/$p.md"
  stop_pid "$SRV_PID"; stop_pid "$mcpid"
}

# incident_run PART SERVER(sluice|naive) NAME [EXTRA sluice-load flags…]
incident_run() {
  local p=$1 server=$2 name=$3; shift 3
  local n=${#PIDS[@]}
  local mc=$((BASE_PORT + 20 + n)) g=$((BASE_PORT + 60 + n)) h=$((BASE_PORT + 90 + n))
  start_memcached "$p" $mc; local mcpid=$MC_PID
  if [[ $server == sluice ]]; then start_sluice "$p" $mc $g $h; else start_naive "$p" $mc $g $h "$OUT/$name-cache-errors.log"; fi
  log "incident: $name"
  run_logged "$p" "$BIN/sluice-load" --preset incident --uris "$URIS" --duration "$RUN" --warm \
    --target 127.0.0.1:$g --metrics http://127.0.0.1:$h/metrics --server-pid "$SRV_PID" --memcached 127.0.0.1:$mc \
    --json "$OUT/$name.json" --html "$OUT/$name.html" --progress 10s "$@" >"$OUT/$name.txt"
  cat "$OUT/$name.txt" >&2
  stop_pid "$SRV_PID"; stop_pid "$mcpid"
}

part_incident() {
  local p=20-incident
  # sluice runs the pair ROUNDS times: one 40 s p99 on a shared 2-core
  # machine is noisy, so the target is judged on the median ratio and
  # every round is shown.
  local r with=() without=()
  for r in $(seq "$ROUNDS"); do
    local sfx=; [[ $r -gt 1 ]] && sfx=-r$r
    incident_run $p sluice sluice-incident$sfx
    incident_run $p sluice sluice-nobulk$sfx --without bulk
    with+=("$OUT/sluice-incident$sfx.json"); without+=("$OUT/sluice-nobulk$sfx.json")
  done
  incident_run $p naive naive-incident
  incident_run $p naive naive-nobulk --without bulk
  # The bound sluice's default config implies: every admitted request runs
  # a handler (plus gRPC's stream goroutine), and fan-out tasks never exceed
  # the in-flight item budget; plus a fixed 200 for the runtime, gRPC and
  # admin servers.
  local bound=$((1024 * 2 + 20000 + 200))
  run_logged $p "$BIN/sluice-bench" incident --sluice "$(IFS=,; echo "${with[*]}")" --sluice-nobulk "$(IFS=,; echo "${without[*]}")" \
    --naive "$OUT/naive-incident.json" --naive-nobulk "$OUT/naive-nobulk.json" --cap $CAP \
    --goroutine-bound $bound --goroutine-bound-note "1,024 requests × 2 + 20,000 items + 200" --md "$OUT/md/$p.md"
}

part_coldpath() {
  local p=30-coldpath mc=$((BASE_PORT + 12)) g=$((BASE_PORT + 52)) h=$((BASE_PORT + 81))
  start_memcached $p $mc; local mcpid=$MC_PID
  start_sluice $p $mc $g $h
  run_logged $p "$BIN/sluice-bench" coldpath --target 127.0.0.1:$g --metrics http://127.0.0.1:$h/metrics --uris "$URIS" \
    --concurrency "$CONC" --batch 50 --duration 120s --out "$OUT/coldpath.json"
  stop_pid "$SRV_PID"; stop_pid "$mcpid"
  run_logged $p "$BIN/sluice-bench" storeread --data-dir "$DATA" --uris "$URIS" --concurrency "$CONC" --batch 50 \
    --fanout 50 --duration 120s --sluice "$OUT/coldpath.json" --md "$OUT/md/$p.md"
}

# part_fairshare: in each round, on a fresh sluice and memcached, the
# cache-hit capacity (closed loop), then the normal clients alone, with
# eight heavy callers at about 120% of capacity, and with the trusted
# indexer's split 20,000-URI batches; sluice-bench fairshare reports every
# figure against the same round's baseline and capacity.
part_fairshare() {
  local p=45-fairshare r mc=$((BASE_PORT + 14)) g=$((BASE_PORT + 55)) h=$((BASE_PORT + 83))
  local heavy=heavy-1,heavy-2,heavy-3,heavy-4,heavy-5,heavy-6,heavy-7,heavy-8
  local caps=() alone=() withheavy=() split=() loads=()
  for r in $(seq "$FAIR_ROUNDS"); do
    loads+=("$(cut -d' ' -f1 /proc/loadavg)")
    start_memcached $p $mc; local mcpid=$MC_PID
    start_sluice $p $mc $g $h
    run_logged $p "$BIN/sluice-bench" capacity --target 127.0.0.1:$g --uris "$URIS" --concurrency "$CONC" --batch 50 \
      --duration "$TPUT" --json "$OUT/fair-capacity-r$r.json"
    # The heavy callers together offer 120% of the capacity just measured,
    # the indexer 50% (the presets' rates assume an idle 2-core machine).
    local capacity hrate irate
    capacity=$(grep -o '"items_per_sec":[0-9.e+]*' "$OUT/fair-capacity-r$r.json" | cut -d: -f2)
    hrate=$(awk -v c="$capacity" 'BEGIN { printf "%.3f", 1.2 * c / (8 * 1000) }')
    irate=$(awk -v c="$capacity" 'BEGIN { printf "%.3f", 0.5 * c / 20000 }')
    # The normal clients run in one sluice-load, the heavy callers or the
    # indexer in a second one started with it, as callers on other
    # machines would: one process's bulk decoding does not delay the
    # other's small requests.
    local name run normal=feed,thread,notifications,search bulkpid
    for run in alone heavy split; do
      name=fair-$run-r$r
      local args=(--preset fair-share --without $heavy) bulk=()
      case $run in
        heavy) bulk=(--preset fair-share --without $normal --rate "heavy-*=$hrate") ;;
        split) args=(--preset split --without indexer); bulk=(--preset split --without $normal --rate "indexer=$irate") ;;
      esac
      log "fairshare: $name"
      bulkpid=
      if ((${#bulk[@]})); then
        echo "$BIN/sluice-load ${bulk[*]} --uris $URIS --duration $FAIR_RUN --target 127.0.0.1:$g --metrics \"\" --json $OUT/$name-bulk.json &" >>"$OUT/md/$p.cmds"
        "$BIN/sluice-load" "${bulk[@]}" --uris "$URIS" --duration "$FAIR_RUN" --target 127.0.0.1:$g --metrics "" \
          --json "$OUT/$name-bulk.json" --progress 10s >"$OUT/$name-bulk.txt" &
        bulkpid=$!
      fi
      run_logged $p "$BIN/sluice-load" "${args[@]}" --uris "$URIS" --duration "$FAIR_RUN" \
        --target 127.0.0.1:$g --metrics http://127.0.0.1:$h/metrics --server-pid "$SRV_PID" --memcached 127.0.0.1:$mc \
        --probe 127.0.0.1:$mc --json "$OUT/$name.json" --html "$OUT/$name.html" --progress 10s >"$OUT/$name.txt"
      [[ -z $bulkpid ]] || wait "$bulkpid"
      cat "$OUT/$name.txt" >&2
      [[ -z $bulkpid ]] || cat "$OUT/$name-bulk.txt" >&2
    done
    stop_pid "$SRV_PID"; stop_pid "$mcpid"
    caps+=("$OUT/fair-capacity-r$r.json"); alone+=("$OUT/fair-alone-r$r.json")
    withheavy+=("$OUT/fair-heavy-r$r.json+$OUT/fair-heavy-r$r-bulk.json"); split+=("$OUT/fair-split-r$r.json+$OUT/fair-split-r$r-bulk.json")
  done
  run_logged $p "$BIN/sluice-bench" fairshare --capacity "$(IFS=,; echo "${caps[*]}")" --alone "$(IFS=,; echo "${alone[*]}")" \
    --heavy "$(IFS=,; echo "${withheavy[*]}")" --split "$(IFS=,; echo "${split[*]}")" --loadavg "$(IFS=,; echo "${loads[*]}")" --md "$OUT/md/$p.md"
}

# part_peer: sluice and the bare peer on one warm memcached, the same
# client alternating between them; then the control, sluice against a
# second sluice of the same binary on a copy of the store, measured the
# same way, whose ratios show the run's noise.
part_peer() {
  local p=40-peer mc=$((BASE_PORT + 13)) g=$((BASE_PORT + 53)) h=$((BASE_PORT + 82)) pg=$((BASE_PORT + 54))
  local cg=$((BASE_PORT + 58)) ch=$((BASE_PORT + 86))
  rm -rf "$OUT/data-control"; cp -r "$DATA" "$OUT/data-control"
  echo "cp -r $DATA $OUT/data-control" >>"$OUT/md/$p.cmds"
  start_memcached $p $mc; local mcpid=$MC_PID
  start_sluice $p $mc $g $h; local slpid=$SRV_PID
  DATA=$OUT/data-control start_sluice $p $mc $cg $ch; local ctlpid=$SRV_PID
  echo "$BIN/sluice-peer --memcached 127.0.0.1:$mc --grpc-addr 127.0.0.1:$pg --max-idle $CAP &" >>"$OUT/md/$p.cmds"
  "$BIN/sluice-peer" --memcached "127.0.0.1:$mc" --grpc-addr "127.0.0.1:$pg" --max-idle "$CAP" 2>>"$OUT/peer.log" &
  local pepid=$!; PIDS+=("$pepid")
  wait_port $pg
  run_logged $p "$BIN/sluice-bench" peer --sluice 127.0.0.1:$g --peer 127.0.0.1:$pg --memcached 127.0.0.1:$mc --uris "$URIS" \
    --sluice-pid "$slpid" --peer-pid "$pepid" --memcached-pid "$mcpid" --concurrency "$CONC" \
    --duration "$PEER_LEG" --rounds "$PEER_ROUNDS" --zipf-s "$ZIPF_S" --cases "${SLUICE_BENCH_PEER_CASES:-1,50,1000,single,zipf1,zipf50}" \
    --control 127.0.0.1:$cg --control-pid "$ctlpid" --control-cases "${SLUICE_BENCH_CONTROL_CASES:-zipf1,50}" --md "$OUT/md/$p.md"
  stop_pid "$pepid"; stop_pid "$ctlpid"; stop_pid "$slpid"; stop_pid "$mcpid"
}

# part_writepath: two sluice servers on copies of the seeded store, one
# with the journal follower on (the default) and one with it disabled,
# each with its own memcached; sluice-bench writepath measures them in
# turn with the same writers and readers and reports on / disabled.
part_writepath() {
  local p=60-writepath mcon=$((BASE_PORT + 15)) mcoff=$((BASE_PORT + 16))
  local gon=$((BASE_PORT + 56)) gof=$((BASE_PORT + 57)) hon=$((BASE_PORT + 84)) hof=$((BASE_PORT + 85))
  local data=$DATA
  rm -rf "$OUT/data-on" "$OUT/data-off"
  cp -r "$data" "$OUT/data-on"; cp -r "$data" "$OUT/data-off"
  { cat config/bench.yaml; printf 'journal:\n  disabled: true\n'; } >"$OUT/bench-journal-disabled.yaml"
  echo "cp -r $data $OUT/data-on; cp -r $data $OUT/data-off; config/bench.yaml + journal: {disabled: true} > $OUT/bench-journal-disabled.yaml" >>"$OUT/md/$p.cmds"
  start_memcached $p $mcon; local mconpid=$MC_PID
  start_memcached $p $mcoff; local mcoffpid=$MC_PID
  DATA=$OUT/data-on start_sluice $p $mcon $gon $hon; local onpid=$SRV_PID
  DATA=$OUT/data-off SLUICE_CONFIG=$OUT/bench-journal-disabled.yaml start_sluice $p $mcoff $gof $hof; local offpid=$SRV_PID
  run_logged $p "$BIN/sluice-bench" writepath --on 127.0.0.1:$gon --off 127.0.0.1:$gof --uris "$URIS" \
    --writers 4 --readers 8 --batch 50 --duration "$WRITE_RUN" --rounds "$WRITE_ROUNDS" --md "$OUT/md/$p.md"
  stop_pid "$onpid"; stop_pid "$offpid"; stop_pid "$mconpid"; stop_pid "$mcoffpid"
  rm -rf "$OUT/data-on" "$OUT/data-off"
}

# alternate_bench PART PKG BENCH A B UNIT ROUNDS N: compiles PKG's tests
# and runs benchmark BENCH's sub-benchmarks A and B alternately, ROUNDS
# times (the order swapped each round, so both see the same machine), N
# iterations each; sets RATES_A and RATES_B to each round's UNIT figure.
alternate_bench() {
  local p=$1 pkg=$2 name=$3 a=$4 b=$5 unit=$6 rounds=$7 n=$8 bench round variant order rate
  bench=$(realpath -m "$BIN/$(basename "$pkg").test") # run from the package's directory below
  if [[ ! -x $bench ]]; then
    go test -c -o "$bench" "./$pkg"
    echo "go test -c -o $bench ./$pkg" >>"$OUT/md/$p.cmds"
  fi
  RATES_A=(); RATES_B=()
  for ((round = 1; round <= rounds; round++)); do
    order="$a $b"; ((round % 2 == 0)) && order="$b $a"
    for variant in $order; do
      log "$name: round $round/$rounds, $variant"
      echo "(cd $pkg && SLUICE_REQUIRE_DEPS=1 $bench -test.run '^\$' -test.bench '$name/^$variant\$' -test.benchtime ${n}x)" >>"$OUT/md/$p.cmds"
      rate=$( (cd "$pkg" && SLUICE_REQUIRE_DEPS=1 "$bench" -test.run '^$' -test.bench "$name/^$variant\$" -test.benchtime "${n}x") |
        awk -v unit="$unit" '$0 ~ unit { for (i = 1; i < NF; i++) if ($(i + 1) == unit) print $i }')
      [[ -n $rate ]] || { log "$name/$variant reported no $unit"; exit 1; }
      if [[ $variant == "$a" ]]; then RATES_A+=("$rate"); else RATES_B+=("$rate"); fi
    done
  done
}

# ratio_table HEAD_A HEAD_B: the rounds of RATES_A and RATES_B as a
# Markdown table with their ratio, then the median ratio in MEDIAN.
ratio_table() {
  local ratios=() round
  echo "| round | $1 | $2 | ratio |"
  echo "|---|---|---|---|"
  for ((round = 0; round < ${#RATES_A[@]}; round++)); do
    ratios+=("$(awk -v a="${RATES_A[$round]}" -v b="${RATES_B[$round]}" 'BEGIN { printf "%.2f", a / b }')")
    printf '| %d | %.0f | %.0f | %s× |\n' $((round + 1)) "${RATES_A[$round]}" "${RATES_B[$round]}" "${ratios[$round]}"
  done
  MEDIAN=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
}

# part_journalrow: what the journal's entries cost a store write —
# boltstore's BenchmarkPutJournal, Put of a 50-record batch with its
# journal entries against the same transaction with the records only.
part_journalrow() {
  local p=61-journalrow
  alternate_bench $p internal/store/boltstore BenchmarkPutJournal journal records-only records/s "${SLUICE_BENCH_JOURNAL_ROUNDS:-3}" 200
  {
    echo "## The journal's cost to a store write"
    echo
    echo "Embedded store, 50-record batches of about 500 bytes each, \`Put\` with each change's journal"
    echo "entry in the same transaction against the same transaction with the records only"
    echo "(\`BenchmarkPutJournal\`, 200 batches per measure, alternating)."
    echo
    ratio_table "with the journal, records/s" "records only, records/s"
    echo
    echo "Median ratio: **$MEDIAN×** the writes/s of a store that recorded nothing."
  } >"$OUT/md/$p.md"
}

# part_tombstones: a 1,000-record write's tombstones, and a replay's
# deletes of 1,000 URIs, on one memcached, pipelined against one command
# per call (cache's BenchmarkInvalidate and BenchmarkDropOn).
part_tombstones() {
  local p=62-tombstones rounds=${SLUICE_BENCH_TOMBSTONE_ROUNDS:-3} tombstones deletes
  alternate_bench $p internal/cache BenchmarkInvalidate pipelined one-by-one tombstones/s "$rounds" 200
  tombstones=$(ratio_table "pipelined, tombstones/s" "one per call, tombstones/s"; echo; echo "Median ratio: **$MEDIAN×** the tombstones/s of one set per call.")
  alternate_bench $p internal/cache BenchmarkDropOn pipelined one-by-one deletes/s "$rounds" 200
  deletes=$(ratio_table "pipelined, keys/s" "one key per call, keys/s"; echo; echo "Median ratio: **$MEDIAN×** the keys/s of one key per call.")
  {
    echo "## Tombstones and replays of many keys"
    echo
    echo "One memcached, 1,000 keys per call: in pipelined writes of up to 500 commands on the refill"
    echo "connections, against one key per call on the pool's other connections, alternating, 200"
    echo "calls per measure. \`Invalidate\` sets the tombstones of a 1,000-record \`PutPostRecords\` or"
    echo "\`DeletePostRecords\`, at the default batch fan-out of 50 (\`BenchmarkInvalidate\`):"
    echo
    echo "$tombstones"
    echo
    echo "\`DropOn\` deletes, in a journal replay onto a server that failed or at start-up, every"
    echo "URI changed since unless it holds a tombstone, at the journal follower's parallelism of 16"
    echo "(\`BenchmarkDropOn\`, each key stored again, untimed, before each replay). Pipelined, each write"
    echo "reads 500 keys' flags and CAS (\`mg\`) and then deletes those unchanged (\`md\`): two round trips;"
    echo "one key per call is a \`get\` and then a \`delete\`, as on a server with too few connections for"
    echo "the pipeline. Until the replay ends the server's keys are read from the store, and at start-up"
    echo "sluice does not serve:"
    echo
    echo "$deletes"
  } >"$OUT/md/$p.md"
}

assemble() {
  local f part
  {
    echo "# Benchmarks"
    echo
    echo "One full \`make bench\` run on this machine ($(nproc) cores, $(uname -sr), $(go version | cut -d' ' -f3)), $(date -u +%Y-%m-%d)."
    echo "The servers, memcached and the load generator share the same cores, so every figure is"
    echo "compared with a baseline measured in the same run; absolute numbers say little."
    echo "Durations are scaled to fit a 2-core machine in a few minutes: $POSTS seeded posts,"
    echo "$TPUT per closed-loop path, $RUN per \`incident\` run. Raw reports (JSON, HTML, text) are"
    echo "left in \`$OUT/\` by the run. Load average (1, 5, 15 min) at the start: $LOADAVG_START; at the end:"
    echo "$(cut -d' ' -f1-3 /proc/loadavg) — the machine is shared, so expect noise."
    echo
    for f in "$OUT"/md/*.md; do
      part=${f%.md}
      cat "$f"
      if [[ -s $part.cmds ]]; then
        echo
        echo "Commands:"
        echo
        echo '```sh'
        cat "$part.cmds"
        echo '```'
      fi
      echo
    done
    if [[ -s $OUT/md/00-setup.cmds ]]; then
      echo "Dataset: \`$(cat "$OUT/md/00-setup.cmds")\`"
    fi
  } >"$DOC"
  log "wrote $DOC"
}

started=$(date +%s)
LOADAVG_START=$(cut -d' ' -f1-3 /proc/loadavg)
PARTS=${SLUICE_BENCH_PARTS:-cachehit incident fairshare coldpath peer writepath journalrow tombstones}
[[ -n ${SLUICE_BENCH_PARTS:-} ]] && DOC=$OUT/BENCHMARKS.md
part_setup
for part in $PARTS; do "part_$part"; done
# one more part: add its function above and a line here
assemble
log "done in $(( $(date +%s) - started ))s"
