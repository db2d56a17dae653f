#!/usr/bin/env bash
# Starts and stops the real servers sluice's tests run against, installing
# them from Debian's packages when missing: memcached, Prometheus and
# Chromium, and one Cassandra node (scripts/cassandra.sh; a Cassandra already
# answering on 9042 is reused); `up` also installs the Node.js packages of
# the AppView client test (scripts/appview-deps.sh).
#
#   scripts/test-deps.sh up     start them; print the environment tests read
#   scripts/test-deps.sh env    print that environment without starting anything
#   scripts/test-deps.sh down   stop them
#
# Use:  scripts/test-deps.sh up >.deps/test-env.sh && source .deps/test-env.sh
# (as make's WITH_DEPS does). Not eval "$(scripts/test-deps.sh up)": when the
# script fails, that evaluates an empty string and carries on without servers.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEPS="$ROOT/.deps"
MEMCACHED_PORT=${SLUICE_TEST_MEMCACHED_PORT:-21211}
MEMCACHED_PID=$DEPS/memcached-$MEMCACHED_PORT.pid # one per port, so "already running" means on this port
mkdir -p "$DEPS"

log() { echo "test-deps: $*" >&2; }

memcached_up() {
  scripts/apt-install.sh memcached
  # Debian starts a system memcached on 11211 after install; tests use their own.
  if [[ -f "$MEMCACHED_PID" ]] && kill -0 "$(cat "$MEMCACHED_PID")" 2>/dev/null; then
    log "memcached already running on 127.0.0.1:$MEMCACHED_PORT"
    return
  fi
  if (exec 3<>/dev/tcp/127.0.0.1/"$MEMCACHED_PORT") 2>/dev/null; then
    log "reusing the memcached already answering on 127.0.0.1:$MEMCACHED_PORT"
    return
  fi
  local user=()
  [[ $(id -u) -eq 0 ]] && user=(-u root)
  /usr/bin/memcached -d -P "$MEMCACHED_PID" -l 127.0.0.1 -p "$MEMCACHED_PORT" -U 0 -m 256 -c 4096 "${user[@]}"
  for _ in $(seq 50); do
    if (exec 3<>/dev/tcp/127.0.0.1/"$MEMCACHED_PORT") 2>/dev/null; then
      log "memcached up on 127.0.0.1:$MEMCACHED_PORT"
      return
    fi
    sleep 0.1
  done
  log "memcached did not start on 127.0.0.1:$MEMCACHED_PORT"; exit 1
}

stop_pidfile() {
  local f=$1
  [[ -f $f ]] || return 0
  local pid; pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

# Prometheus and Chromium are not servers the tests share: each test that
# needs one starts its own (internal/testenv). Only install them here.
browser_deps() {
  scripts/apt-install.sh prometheus chromium
}

print_env() {
  cat <<ENV
export SLUICE_REQUIRE_DEPS=1
export SLUICE_TEST_MEMCACHED=127.0.0.1:$MEMCACHED_PORT
export MEMCACHED_BIN=/usr/bin/memcached
export PROMETHEUS_BIN=/usr/bin/prometheus
export CHROMIUM_BIN=/usr/bin/chromium
export CASSANDRA_ADDR=127.0.0.1:${SLUICE_TEST_CASSANDRA_PORT:-9042}
ENV
}

case "${1:-}" in
  up)   memcached_up; browser_deps; scripts/appview-deps.sh; scripts/cassandra.sh up; print_env ;;
  env)  print_env ;;
  down) stop_pidfile "$MEMCACHED_PID"; scripts/cassandra.sh down; log "stopped" ;;
  *)    echo "usage: $0 up|env|down" >&2; exit 2 ;;
esac
