"""A thread's Codex rollout out of and into the repository's jail (issue #27).

The rollout is a file in the agent's home, which the agent can write: forgeflow's host
side never opens it. A one-shot jail (oneshot.py) finds it there by the thread's id
(``find -type f``: a symlink in its place is not a rollout) and prints it to a bounded
stdout, which domain/rollout.py parses, bounds and redacts. A restore goes the other way:
the kept rollout is the jail's stdin, and the jail writes it at Codex's own place below
its ``CODEX_HOME``; the name was checked on the way out and is checked again here, so no
path of the agent's choosing is ever written, on the host or in the jail.
"""

from __future__ import annotations

from forgeflow.agent.jail import JAIL_HOME, JailRefused
from forgeflow.agent.oneshot import JailRunner
from forgeflow.domain import rollout
from forgeflow.domain.ids import RepoRef
from forgeflow.redaction import redact_text

# $1 the thread id (checked by the host): its one regular file below sessions/, printed.
EXPORT_STEP = r"""
cd "$CODEX_HOME/sessions" 2>/dev/null || { echo ff:absent; exit 0; }
found=$(find . -type f -name "rollout-*-$1.jsonl" | head -n 2)
[ -n "$found" ] || { echo ff:absent; exit 0; }
[ "$(printf '%s\n' "$found" | wc -l)" -eq 1 ] || { echo ff:many; exit 0; }
echo "ff:rollout ${found#./}"
exec cat -- "$found"
"""

# $1 the rollout's name (checked by the host): stdin written there, then its path said.
RESTORE_STEP = r"""
set -e
dir="$CODEX_HOME/sessions/${1%/*}"
mkdir -p -- "$dir"
cat > "$CODEX_HOME/sessions/$1.part"
mv -f -- "$CODEX_HOME/sessions/$1.part" "$CODEX_HOME/sessions/$1"
echo ff:restored
"""

TIMEOUT = 30.0


class RolloutJail:
    """Reads and writes one repository's thread rollouts through one-shot jails."""

    def __init__(self, runner: JailRunner) -> None:
        self.runner = runner

    def codex_home(self, repo: RepoRef) -> str:
        """``CODEX_HOME`` as the app-server sees it (the path ``thread/resume`` takes)."""
        if self.runner.jailed:
            return f"{JAIL_HOME}/.codex"
        return str(self.runner.paths(repo).home / ".codex")

    async def export(self, repo: RepoRef, thread_id: str) -> rollout.Rollout | rollout.NotKept:
        if not rollout.valid_thread_id(thread_id):
            return rollout.NotKept(rollout.CORRUPT, "not a Codex thread id")
        try:
            res = await self.runner.run(
                ["/bin/sh", "-c", EXPORT_STEP, "forgeflow-rollout", thread_id],
                repository=repo,
                cwd=self.codex_home(repo).rsplit("/", 1)[0],
                timeout=TIMEOUT,
                output_limit=rollout.BYTE_LIMIT + 4096,
                network=False,
            )
        except JailRefused as exc:
            return rollout.NotKept(rollout.CORRUPT, f"the jail refused: {exc.reason}")
        if res.timed_out or (res.returncode != 0 and not res.truncated):
            return rollout.NotKept(rollout.CORRUPT, f"the export step ended {res.returncode}")
        return rollout.parse(thread_id, res.stdout, res.truncated, redact_text)

    async def restore(self, repo: RepoRef, kept: rollout.Rollout) -> str | None:
        """Write ``kept`` into the jail's home; the path to resume it from, or None."""
        if not rollout.check_name(kept.name, kept.thread_id):
            return None
        try:
            res = await self.runner.run(
                ["/bin/sh", "-c", RESTORE_STEP, "forgeflow-rollout", kept.name],
                repository=repo,
                cwd=self.codex_home(repo).rsplit("/", 1)[0],
                stdin=kept.body.encode(),
                timeout=TIMEOUT,
                output_limit=4096,
                network=False,
            )
        except JailRefused:
            return None
        if res.returncode != 0 or res.stdout.strip() != b"ff:restored":
            return None
        return f"{self.codex_home(repo)}/sessions/{kept.name}"
