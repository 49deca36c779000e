#!/usr/bin/env bash
# Installs what forgeflow needs on a fresh machine, idempotently:
#   scripts/setup.sh runtime   virtual environment, forgeflow, pinned Codex CLI
#   scripts/setup.sh test      the same plus test tools (pytest, ruff, mypy, gitea-mcp)
set -euo pipefail
cd "$(dirname "$0")/.."
kind="${1:-runtime}"

python="${PYTHON:-}"
if [ -z "$python" ]; then
  for candidate in python3.12 python3.11 python3; do
    # A pyenv shim exists for every version it knows and complains for the absent ones.
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      python="$candidate"; break
    fi
  done
fi
[ -n "$python" ] || { echo "setup: Python >= 3.11 is required" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
pip_quiet=(--quiet --disable-pip-version-check)
if [ "$kind" = "test" ]; then
  .venv/bin/pip install "${pip_quiet[@]}" -e '.[test]' -e ./testkit
else
  .venv/bin/pip install "${pip_quiet[@]}" -e .
fi

# The Codex app-server, pinned in tools/node/package-lock.json.
if ! command -v npm >/dev/null 2>&1; then
  echo "setup: npm is missing; installing Debian's nodejs and npm" >&2
  apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
fi
if [ ! -x tools/node/node_modules/.bin/codex ]; then
  (cd tools/node && npm ci --no-audit --no-fund --loglevel=error)
fi

# The agent's jail (FORGEFLOW_SANDBOX=bwrap, the default) is Debian's bubblewrap.
if ! command -v bwrap >/dev/null 2>&1; then
  echo "setup: installing Debian's bubblewrap for the agent's jail" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
fi

# A repository's environment (docs/configuration.md "Environments") is a root built by
# Debian's mmdebstrap in unshare mode (uidmap gives it the user's subordinate ids).
if ! command -v mmdebstrap >/dev/null 2>&1; then
  echo "setup: installing Debian's mmdebstrap for the repositories' environments" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap uidmap >/dev/null
fi

# Debian's chromium for the browser tests: Playwright drives it through executable_path
# (`playwright install` would download a browser build, which this machine cannot).
if [ "$kind" = "test" ] && [ ! -x /usr/bin/chromium ]; then
  echo "setup: installing Debian's chromium for the browser tests" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
