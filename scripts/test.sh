#!/usr/bin/env bash
# Install (idempotently) and run the whole test suite: lint, types, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
export PATH="$PWD/tools/node/node_modules/.bin:$PATH"

# The suite needs the machine's PostgreSQL (127.0.0.1:5432); start it if it is down.
if command -v pg_isready >/dev/null 2>&1 && ! pg_isready -q -h 127.0.0.1 -p 5432; then
  cluster="$(ls /etc/postgresql 2>/dev/null | head -n1 || true)"
  if [ -n "$cluster" ]; then
    pg_ctlcluster --skip-systemctl-redirect "$cluster" main start || true
  fi
fi

echo "== ruff"
.venv/bin/ruff check src testkit tests bench
.venv/bin/ruff format --check src testkit tests bench
echo "== mypy --strict"
.venv/bin/mypy
echo "== pytest"
status=0
# Three workers on two cores: about half of a test's time is spent waiting on its
# subprocesses (git, bwrap, codex) and sockets. "-n 0" after it runs in one process.
.venv/bin/pytest -n 3 --dist worksteal "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure here" >&2
  exit 1
fi
exit "$status"
