#!/usr/bin/env bash
# Starts and stops an N-node Apache Cassandra cluster for sluice's cluster
# suite and for trying sluice against more than one node: the same Maven
# jars and JDK as scripts/cassandra.sh, one node per loopback address
# (127.0.0.11, .12, … by default, beside the single test node on
# 127.0.0.1), every node on the same ports, the first node the seed.
#
#   scripts/cassandra-cluster.sh up [N]        start N nodes (3), one after another; wait until all are UN
#   scripts/cassandra-cluster.sh down          stop every node this script started
#   scripts/cassandra-cluster.sh status        print each node's view of the ring
#   scripts/cassandra-cluster.sh stop-node I   SIGTERM node I (1-based) and wait for it to exit
#   scripts/cassandra-cluster.sh kill-node I   SIGKILL node I
#   scripts/cassandra-cluster.sh start-node I… start the nodes again on their old data, one after another;
#                                              wait until every node of the cluster is UN
#   scripts/cassandra-cluster.sh env           print the cluster's environment for tests
#
# Tokens are spread evenly (num_tokens 1, initial_token i/N of the ring), so
# each node owns the same share and a per-node read count can be checked
# against it. auto_bootstrap is off: this is always a fresh cluster, whose
# nodes have nothing to stream. Each node gets a 768 MiB heap
# (CASSANDRA_CLUSTER_HEAP), so three fit beside the single test node,
# memcached, sluice and the tests on a 24 GiB machine.
#
# Progress goes to stderr; stdout stays clean for `eval`.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BASE=${CASSANDRA_CLUSTER_BASE:-127.0.0.1}
FIRST=${CASSANDRA_CLUSTER_FIRST:-11}
DIR="$ROOT/.deps/cluster"
PORT=${SLUICE_TEST_CASSANDRA_PORT:-9042}
STORAGE_PORT=${SLUICE_TEST_CASSANDRA_STORAGE_PORT:-7000}
HEAP=${CASSANDRA_CLUSTER_HEAP:-768m}
START_TIMEOUT=${CASSANDRA_START_TIMEOUT:-420}
# A node restarting on a busy 2-core machine can take minutes (JVM pauses
# of tens of seconds were seen); every wait of this script and of the
# cassandra.sh it runs gets the same patient bound.
export CASSANDRA_START_TIMEOUT=$START_TIMEOUT
mkdir -p "$DIR"

log() { echo "cluster: $*" >&2; }

size() { if [[ -f $DIR/size ]]; then cat "$DIR/size"; else echo "${1:-3}"; fi; }
addr() { local prefix=${BASE%.*}; echo "$prefix.$((FIRST + $1 - 1))"; }

# token prints node i's initial token: i-1 steps of 2^64/n from -2^63,
# added one step at a time so no intermediate leaves 64-bit range.
token() {
  local i=$1 n=$2 t=-9223372036854775808 step k
  step=$(((9223372036854775807 / n) * 2))
  for ((k = 1; k < i; k++)); do t=$((t + step)); done
  echo "$t"
}

node() { # node I VERB [KEEP]: run scripts/cassandra.sh VERB as node I
  local i=$1 verb=$2 keep=${3:-} n; n=$(size)
  CASSANDRA_NODE_ADDR="$(addr "$i")" CASSANDRA_NODE_RUN="$DIR/node$i" \
    CASSANDRA_NODE_SEEDS="$(addr 1):$STORAGE_PORT" CASSANDRA_NODE_HEAP="$HEAP" \
    CASSANDRA_NODE_TOKEN="$(token "$i" "$n")" CASSANDRA_NODE_CLUSTER="sluice cluster" \
    CASSANDRA_NODE_KEEP_DATA="$keep" scripts/cassandra.sh "$verb"
}

probe() {
  [[ -x $ROOT/.deps/cassandra/cqlprobe ]] || go build -o "$ROOT/.deps/cassandra/cqlprobe" ./scripts/cqlprobe
  "$ROOT/.deps/cassandra/cqlprobe" "$@"
}

# wait_ring waits until every node answers CQL and sees all n nodes NORMAL
# in its gossip view: Cassandra's UN, asked over CQL (no JMX, no nodetool).
wait_ring() {
  local n=$1 start=$SECONDS last=-10 hosts=() i
  for ((i = 1; i <= n; i++)); do hosts+=("$(addr "$i"):$PORT"); done
  while ((SECONDS - start < START_TIMEOUT)); do
    if probe ring "$n" "${hosts[@]}" >/dev/null 2>&1; then
      log "all $n nodes are up and NORMAL in every node's view after $((SECONDS - start))s"
      return
    fi
    if ((SECONDS - last >= 10)); then
      last=$SECONDS
      log "waiting for a ring of $n ($((SECONDS - start))s of ${START_TIMEOUT}s): $(probe ring "$n" "${hosts[@]}" 2>&1 | tail -1)"
    fi
    sleep 1
  done
  log "the ring did not settle within ${START_TIMEOUT}s"; probe ring "$n" "${hosts[@]}" >&2 || true
  exit 1
}

up() {
  local n=${1:-3} i
  if [[ -f $DIR/size ]] && [[ $(cat "$DIR/size") != "$n" ]]; then
    log "a cluster of $(cat "$DIR/size") nodes is recorded in ${DIR#"$ROOT"/}; run down first"; exit 1
  fi
  echo "$n" >"$DIR/size"
  scripts/cassandra.sh fetch
  for ((i = 1; i <= n; i++)); do
    log "node $i of $n on $(addr "$i") (token $(token "$i" "$n"))"
    node "$i" up
  done
  wait_ring "$n"
}

down() {
  local n i; n=$(size)
  for ((i = 1; i <= n; i++)); do
    [[ -f $DIR/node$i/cassandra.pid ]] && node "$i" down
  done
  rm -f "$DIR/size"
  log "stopped"
}

signal_node() {
  local i=$1 sig=$2 f="$DIR/node$1/cassandra.pid" pid
  [[ -f $f ]] || { log "node $i is not running"; exit 1; }
  pid=$(cat "$f")
  kill "-$sig" "$pid" 2>/dev/null || true
  for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then log "node $i (pid $pid) ignored SIG$sig for 30s; killing it"; kill -9 "$pid"; fi
  rm -f "$f"
  log "node $i (pid $pid) stopped by SIG$sig"
}

print_env() {
  local n i hosts=(); n=$(size)
  for ((i = 1; i <= n; i++)); do hosts+=("$(addr "$i"):$PORT"); done
  cat <<ENV
export SLUICE_TEST_CLUSTER=$(IFS=,; echo "${hosts[*]}")
export SLUICE_TEST_CLUSTER_SCRIPT=$ROOT/scripts/cassandra-cluster.sh
ENV
}

case "${1:-}" in
  up)         up "${2:-3}"; print_env ;;
  down)       down ;;
  status)     n=$(size); hosts=(); for ((i = 1; i <= n; i++)); do hosts+=("$(addr "$i"):$PORT"); done; probe ring "$n" "${hosts[@]}" ;;
  stop-node)  signal_node "${2:?node number}" TERM ;;
  kill-node)  signal_node "${2:?node number}" KILL ;;
  start-node) shift; [[ $# -gt 0 ]] || { echo "start-node: name a node number" >&2; exit 2; }
              for i in "$@"; do node "$i" up keep; done; wait_ring "$(size)" ;;
  env)        print_env ;;
  *)          echo "usage: $0 up [N]|down|status|stop-node I|kill-node I|start-node I…|env" >&2; exit 2 ;;
esac
