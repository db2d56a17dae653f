#!/usr/bin/env bash
# Installs what the AppView client test (test/appview) needs: Node.js and
# npm from Debian's packages when missing, then the npm packages pinned in
# test/appview/package-lock.json with `npm ci`, only when the lock file
# changed since the last install. Prints nothing on stdout, so
# scripts/test-deps.sh can call it inside `eval "$(… up)"`.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=test/appview
log() { echo "appview-deps: $*" >&2; }

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  log "installing nodejs and npm (Debian packages)"
  scripts/apt-install.sh nodejs npm
fi
stamp="$DIR/node_modules/.sluice-lock.sha256"
want=$(sha256sum "$DIR/package-lock.json" | cut -d' ' -f1)
if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
  log "npm packages match package-lock.json (node $(node --version))"
  exit 0
fi
log "npm ci in $DIR (node $(node --version), npm $(npm --version))"
(cd "$DIR" && npm ci --no-audit --no-fund --loglevel=error) >&2
echo "$want" >"$stamp"
