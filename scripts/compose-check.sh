#!/usr/bin/env bash
# Validates docker-compose.yml with Debian's docker-compose (installed when
# missing); no container engine is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/apt-install.sh docker-compose
docker-compose -f docker-compose.yml config -q
echo "compose-check: docker-compose.yml is valid ($(docker-compose -f docker-compose.yml config --services | tr '\n' ' '))"
