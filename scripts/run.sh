#!/usr/bin/env bash
# `make run`: everything a fresh machine needs to serve sluice locally.
# Installs and starts memcached on 127.0.0.1:11211 if nothing answers
# there, builds sluice, seeds a demo dataset into the embedded store if it
# is empty, prints a grpcurl example, and serves in the foreground with
# config/sluice.example.yaml (SLUICE_CONFIG names another file).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${SLUICE_DATA_DIR:-.data}
MEMCACHED=${SLUICE_MEMCACHED:-127.0.0.1:11211}
POSTS=${SLUICE_DEMO_POSTS:-100000}
GRPC_ADDR=${SLUICE_GRPC_ADDR:-127.0.0.1:50051}
HTTP_ADDR=${SLUICE_HTTP_ADDR:-127.0.0.1:8080}

port_open() { (exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null; }

if ! port_open "$MEMCACHED"; then
  scripts/apt-install.sh memcached
  if ! port_open "$MEMCACHED"; then
    echo "run: starting memcached on $MEMCACHED" >&2
    user=(); [[ $(id -u) -eq 0 ]] && user=(-u root)
    mkdir -p .deps
    /usr/bin/memcached -d -P "$PWD/.deps/run-memcached.pid" -l "${MEMCACHED%:*}" -p "${MEMCACHED##*:}" -U 0 -m 512 "${user[@]}"
    for _ in $(seq 50); do port_open "$MEMCACHED" && break; sleep 0.1; done
  fi
fi

go build -o bin/sluice ./cmd/sluice
bin/sluice seed --if-empty --data-dir "$DATA_DIR" --posts "$POSTS" --uris-out "$DATA_DIR/uris.txt"
scripts/tools.sh grpcurl >/dev/null

URI=$(head -n 1 "$DATA_DIR/uris.txt" 2>/dev/null || echo "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/app.bsky.feed.post/3k2yihcrp6f2c")
cat >&2 <<MSG

sluice is starting: gRPC on $GRPC_ADDR, admin on http://$HTTP_ADDR (/metrics, /readyz, /debug/pprof/)
Try it from another shell:

  .tools/bin/grpcurl -plaintext -H 'x-client-id: demo' \\
    -d '{"uris": ["$URI"]}' \\
    $GRPC_ADDR sluice.v1.PostRecords/GetPostRecords

MSG
exec bin/sluice serve --config "${SLUICE_CONFIG:-config/sluice.example.yaml}" --data-dir "$DATA_DIR" --memcached "$MEMCACHED" --grpc-addr "$GRPC_ADDR" --http-addr "$HTTP_ADDR" "$@"
