#!/usr/bin/env bash
# Install (idempotently) and run `forgeflow serve` on the embedded SQLite default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh runtime
export PATH="$PWD/tools/node/node_modules/.bin:$PATH"
exec .venv/bin/forgeflow serve "$@"
