#!/usr/bin/env bash
# Installs Debian packages that are missing, running apt-get update once if
# the package lists are empty. Usage: scripts/apt-install.sh PKG...
set -euo pipefail
missing=()
for pkg in "$@"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"
if ! apt-cache show "${missing[0]}" >/dev/null 2>&1; then
  $SUDO apt-get update -qq
fi
echo "apt-install: installing ${missing[*]}" >&2
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
