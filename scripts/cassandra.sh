#!/usr/bin/env bash
# Fetches, starts and stops one Apache Cassandra node for sluice's tests and
# benchmarks: org.apache.cassandra:cassandra-all and its runtime
# dependencies from Maven Central (with mvn, cached under .deps/cassandra
# and reused between runs), one node on 127.0.0.1:9042 under OpenJDK 17
# with a 1 GB heap and fresh data each start.
#
#   scripts/cassandra.sh fetch   download the jars if the cache lacks them
#   scripts/cassandra.sh up      fetch, start, wait until CQL answers
#   scripts/cassandra.sh down    stop the node this script started
#   scripts/cassandra.sh status  say whether CQL answers on the port
#
# A Cassandra already answering on the port is reused, not restarted.
# scripts/cassandra-cluster.sh runs this script once per node of a
# multi-node cluster, with the CASSANDRA_NODE_* variables below set:
# the node's address, run directory, seeds, heap, token and whether its
# data survives a restart.
# Progress goes to stderr; stdout stays clean for `eval`.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VERSION=${CASSANDRA_VERSION:-5.0.8}
CH="$ROOT/.deps/cassandra"
mkdir -p "$CH"
LIB="$CH/lib-$VERSION"
RUN="$CH/run"
PORT=${SLUICE_TEST_CASSANDRA_PORT:-9042}
STORAGE_PORT=${SLUICE_TEST_CASSANDRA_STORAGE_PORT:-7000}
START_TIMEOUT=${CASSANDRA_START_TIMEOUT:-180}
PIDFILE="$CH/cassandra.pid"
ADDR=127.0.0.1
SEEDS="127.0.0.1:$STORAGE_PORT"
HEAP=1g
CLUSTER_NAME="sluice test"
INITIAL_TOKEN=
KEEP_DATA=
if [[ -n ${CASSANDRA_NODE_ADDR:-} ]]; then
  ADDR=$CASSANDRA_NODE_ADDR
  RUN=${CASSANDRA_NODE_RUN:?CASSANDRA_NODE_RUN names the run directory of the node}
  PIDFILE="$RUN/cassandra.pid"
  SEEDS=${CASSANDRA_NODE_SEEDS:?CASSANDRA_NODE_SEEDS lists the seed addresses}
  HEAP=${CASSANDRA_NODE_HEAP:-768m}
  CLUSTER_NAME=${CASSANDRA_NODE_CLUSTER:-sluice cluster}
  INITIAL_TOKEN=${CASSANDRA_NODE_TOKEN:-}
  KEEP_DATA=${CASSANDRA_NODE_KEEP_DATA:-}
fi

log() { echo "cassandra: $*" >&2; }

# java17 finds a full OpenJDK 17 (Cassandra 5.0 runs on 11 or 17 only; a
# JDK 24+ cannot run it at all).
java17() {
  local d
  for d in "${CASSANDRA_JAVA_HOME:-}" /usr/lib/jvm/java-17-openjdk-amd64 /usr/lib/jvm/java-17-openjdk-arm64 /usr/lib/jvm/java-17-openjdk; do
    if [[ -n $d && -x $d/bin/java && -x $d/bin/javac ]]; then echo "$d"; return; fi
  done
  log "installing openjdk-17-jdk-headless (Cassandra 5.0 needs Java 17)"
  scripts/apt-install.sh openjdk-17-jdk-headless
  for d in /usr/lib/jvm/java-17-openjdk-*; do
    [[ -x $d/bin/java ]] && { echo "$d"; return; }
  done
  log "no OpenJDK 17 found under /usr/lib/jvm"; exit 1
}

fetch() {
  if [[ -f $LIB/.complete ]]; then
    log "using cached jars in ${LIB#"$ROOT"/} ($(ls "$LIB" | wc -l) files)"
    return
  fi
  command -v mvn >/dev/null || scripts/apt-install.sh maven
  local jh; jh=$(java17)
  mkdir -p "$LIB"
  cat >"$CH/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.sluice</groupId>
  <artifactId>cassandra-test-node</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.cassandra</groupId>
      <artifactId>cassandra-all</artifactId>
      <version>$VERSION</version>
    </dependency>
  </dependencies>
</project>
POM
  log "downloading cassandra-all $VERSION and its dependencies (first run only; may take minutes)"
  # One progress line per downloaded file (name and size) instead of
  # Maven's byte counters; Maven's local repository keeps them for later.
  JAVA_HOME=$jh mvn -B -f "$CH/pom.xml" \
    org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies \
    -DoutputDirectory="$LIB" -DincludeScope=runtime 2>&1 |
    grep --line-buffered -E '^\[INFO\] Downloaded|BUILD|ERROR' | grep --line-buffered -v 'systemPath' |
    sed -u -E 's#^\[INFO\] Downloaded from [^ ]+ .*/([^/]+) \((.*)\)$#fetched \1 (\2)#; s/^/cassandra: mvn: /' >&2 || true
  local n; n=$(ls "$LIB"/*.jar 2>/dev/null | wc -l)
  if [[ ! -f $LIB/cassandra-all-$VERSION.jar ]]; then
    log "download failed: $LIB/cassandra-all-$VERSION.jar missing ($n jars present)"; exit 1
  fi
  touch "$LIB/.complete"
  log "cached $n jars in ${LIB#"$ROOT"/}"
}

write_conf() {
  mkdir -p "$RUN/conf" "$RUN/logs"
  cat >"$RUN/conf/cassandra.yaml" <<YAML
# A throwaway node for tests: no auth, no snapshots, fast sync.
cluster_name: '$CLUSTER_NAME'
num_tokens: 1
${INITIAL_TOKEN:+initial_token: $INITIAL_TOKEN}
auto_bootstrap: false
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: SimpleSnitch
listen_address: $ADDR
rpc_address: $ADDR
storage_port: $STORAGE_PORT
native_transport_port: $PORT
start_native_transport: true
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "$SEEDS"
cdc_enabled: false
commitlog_sync: periodic
commitlog_sync_period: 10s
commitlog_segment_size: 5MiB
auto_snapshot: false
incremental_backups: false
hinted_handoff_enabled: false
memtable_allocation_type: heap_buffers
disk_access_mode: standard
column_index_size: 4KiB
YAML
  cat >"$RUN/conf/logback.xml" <<'XML'
<configuration>
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%-5level [%thread] %date{ISO8601} %logger{0}: %msg%n</pattern></encoder>
  </appender>
  <logger name="org.apache.cassandra" level="INFO"/>
  <root level="WARN"><appender-ref ref="STDOUT"/></root>
</configuration>
XML
}

# jvm_flags prints the JDK 17 flags of Cassandra's jvm17-server.options.
jvm_flags() {
  cat <<FLAGS
-Xms$HEAP -Xmx$HEAP -Xss256k
-XX:+UseG1GC -XX:+ParallelRefProcEnabled -XX:MaxGCPauseMillis=300
-XX:+UseThreadPriorities -XX:+PerfDisableSharedMem -XX:+ExitOnOutOfMemoryError
-ea -da:net.openhft...
-Djdk.attach.allowAttachSelf=true
--add-exports java.base/jdk.internal.misc=ALL-UNNAMED
--add-exports java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED
--add-exports java.management/com.sun.jmx.remote.security=ALL-UNNAMED
--add-exports java.rmi/sun.rmi.registry=ALL-UNNAMED
--add-exports java.rmi/sun.rmi.server=ALL-UNNAMED
--add-exports java.sql/java.sql=ALL-UNNAMED
--add-exports java.base/java.lang.ref=ALL-UNNAMED
--add-exports jdk.unsupported/sun.misc=ALL-UNNAMED
--add-exports jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED
--add-exports jdk.attach/sun.tools.attach=ALL-UNNAMED
--add-opens java.base/java.lang.module=ALL-UNNAMED
--add-opens java.base/jdk.internal.loader=ALL-UNNAMED
--add-opens java.base/jdk.internal.ref=ALL-UNNAMED
--add-opens java.base/jdk.internal.reflect=ALL-UNNAMED
--add-opens java.base/jdk.internal.math=ALL-UNNAMED
--add-opens java.base/jdk.internal.module=ALL-UNNAMED
--add-opens java.base/jdk.internal.util.jar=ALL-UNNAMED
--add-opens jdk.management/com.sun.management.internal=ALL-UNNAMED
--add-opens java.base/sun.nio.ch=ALL-UNNAMED
--add-opens java.base/java.io=ALL-UNNAMED
--add-opens java.base/java.lang.reflect=ALL-UNNAMED
--add-opens jdk.compiler/com.sun.tools.javac=ALL-UNNAMED
--add-opens java.base/java.lang=ALL-UNNAMED
--add-opens java.base/java.util=ALL-UNNAMED
--add-opens java.base/java.nio=ALL-UNNAMED
-Dio.netty.tryReflectionSetAccessible=true
-Dio.netty.allocator.useCacheForAllThreads=true
-Dio.netty.allocator.maxOrder=11
FLAGS
}

port_open() { (exec 3<>"/dev/tcp/$ADDR/$PORT") 2>/dev/null; }

# cql_ready asks the node for its version over CQL with the project's own
# probe (a few lines of gocql), so no cqlsh or Python is needed.
cql_ready() {
  port_open || return 1
  probe >/dev/null 2>&1
}

probe() {
  [[ -x $CH/cqlprobe ]] || go build -o "$CH/cqlprobe" ./scripts/cqlprobe
  "$CH/cqlprobe" "$ADDR:$PORT"
}

up() {
  if cql_ready; then
    log "reusing the Cassandra already answering CQL on $ADDR:$PORT"
    return
  fi
  if port_open; then
    log "something listens on $ADDR:$PORT but does not answer CQL yet; waiting for it"
    wait_ready ""; return
  fi
  fetch
  local jh; jh=$(java17)
  write_conf
  [[ -n $KEEP_DATA ]] || rm -rf "$RUN/data"
  mkdir -p "$RUN/data" "$RUN/tmp"
  local jamm; jamm=$(ls "$LIB"/jamm-*.jar | head -1)
  log "starting Cassandra $VERSION on $ADDR:$PORT ($jh, $HEAP heap; log ${RUN#"$ROOT"/}/logs/stdout.log)"
  # shellcheck disable=SC2046
  nohup "$jh/bin/java" $(jvm_flags) -javaagent:"$jamm" \
    -Dcassandra.config="file://$RUN/conf/cassandra.yaml" \
    -Dlogback.configurationFile="$RUN/conf/logback.xml" \
    -Dcassandra.storagedir="$RUN/data" -Dcassandra.logdir="$RUN/logs" \
    -Dcassandra-foreground=yes -Djava.net.preferIPv4Stack=true \
    -Dcassandra.skip_wait_for_gossip_to_settle=0 -Dcassandra.superuser_setup_delay_ms=0 \
    -Dcassandra.skip_sync=true -Dcassandra.ring_delay_ms=1000 \
    -Dcassandra.ignore_kernel_bug_1057843_check=true \
    -Djna.tmpdir="$RUN/tmp" -Djava.io.tmpdir="$RUN/tmp" \
    -cp "$RUN/conf:$LIB/*" org.apache.cassandra.service.CassandraDaemon \
    >"$RUN/logs/stdout.log" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
  wait_ready "$(cat "$PIDFILE")"
}

# wait_ready waits until CQL answers, failing fast if pid (when given) dies.
wait_ready() {
  local pid=$1 start=$SECONDS last=-10
  while ((SECONDS - start < START_TIMEOUT)); do
    if cql_ready; then
      log "Cassandra answers CQL on $ADDR:$PORT after $((SECONDS - start))s ($(probe))"
      return
    fi
    if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then
      log "Cassandra exited during start-up; last log lines:"
      tail -n 30 "$RUN/logs/stdout.log" >&2
      rm -f "$PIDFILE"; exit 1
    fi
    if ((SECONDS - last >= 10)); then
      last=$SECONDS
      log "waiting for CQL on $ADDR:$PORT ($((SECONDS - start))s of ${START_TIMEOUT}s)"
    fi
    sleep 1
  done
  log "Cassandra did not answer CQL within ${START_TIMEOUT}s; last log lines:"
  [[ -f $RUN/logs/stdout.log ]] && tail -n 30 "$RUN/logs/stdout.log" >&2
  exit 1
}

down() {
  [[ -f $PIDFILE ]] || { log "no Cassandra started by this script"; return; }
  local pid; pid=$(cat "$PIDFILE")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
    log "stopped (pid $pid)"
  fi
  rm -f "$PIDFILE"
}

case "${1:-}" in
  fetch)  fetch ;;
  up)     up ;;
  down)   down ;;
  status) if cql_ready; then log "answering on $ADDR:$PORT"; else log "not answering on $ADDR:$PORT"; exit 1; fi ;;
  *)      echo "usage: $0 fetch|up|down|status" >&2; exit 2 ;;
esac
