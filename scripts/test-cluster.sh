#!/usr/bin/env bash
# `make test-cluster`: starts a three-node Cassandra cluster
# (scripts/cassandra-cluster.sh, on 127.0.0.11-13 beside the single test
# node), runs the cluster suite in test/cluster against it — three
# memcached servers and two sluice replicas of its own, steady load, one of
# each lost and brought back — and stops the cluster again, pass or fail.
# A cluster this checkout already started (make cluster-up) is reused and
# left running; one started elsewhere is refused, since the suite stops and
# restarts nodes through this checkout's pid files.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/apt-install.sh memcached >&2
started=
if [[ ! -f .deps/cluster/size ]] && scripts/cassandra-cluster.sh status >/dev/null 2>&1; then
  # The suite stops, kills and restarts nodes through their pid files, so
  # it can use only a cluster this checkout started.
  echo "test-cluster: a Cassandra cluster that this checkout did not start answers on 127.0.0.11-13; stop it (scripts/cassandra-cluster.sh down in the checkout that started it) and run again" >&2
  exit 1
fi
if ! scripts/cassandra-cluster.sh status >/dev/null 2>&1; then
  scripts/cassandra-cluster.sh down >/dev/null 2>&1 || true
  started=1
  trap 'scripts/cassandra-cluster.sh down || true' EXIT
  scripts/cassandra-cluster.sh up 3 >/dev/null
else
  echo "test-cluster: reusing the cluster that is up" >&2
fi
eval "$(scripts/cassandra-cluster.sh env)"
export SLUICE_REQUIRE_DEPS=1 MEMCACHED_BIN=/usr/bin/memcached
go test -tags cluster -count=1 -v -timeout 40m ./test/cluster/
