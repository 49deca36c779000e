"""The fetch rule: when a task may use a main clone as it is, without a fetch.

With a ``fetch_interval`` above 0, a task for an issue or pull request skips the fetch
("reused") when

- its session's worktree exists and this manager fetched the clone less than
  ``fetch_interval`` seconds ago: such a task uses no fetched ref (its branch exists); or
- the worktree is new and Gitea's head of the default branch is the commit
  the mirror's default branch already is: the new branch starts from the current head
  either way.

With 0, every task fetches.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from forgeflow.workspace.git import GitRunner
from forgeflow.workspace.records import RepoCheckout


@dataclass(frozen=True)
class Fetched:
    """The last clone or fetch of a main clone by this manager."""

    at: float  # time.monotonic()
    branch: str
    head: str


class FetchRule:
    def __init__(self, git: GitRunner, interval: float) -> None:
        self.git = git
        self.interval = interval
        self._fetched: dict[str, Fetched] = {}

    def record(self, path: str, branch: str, head: str) -> None:
        self._fetched[path] = Fetched(time.monotonic(), branch, head)

    def forget(self, path: str) -> None:
        self._fetched.pop(path, None)

    async def reuse(
        self,
        path: str,
        branch: str,
        worktree_exists: bool,
        upstream: asyncio.Future[str | None] | None,
    ) -> RepoCheckout | None:
        """The clone as it is, when the rule lets this task skip the fetch; ``upstream``
        is Gitea's answer for the default branch's head, asked for a new worktree."""
        last = self._fetched.get(path)
        now = time.monotonic()
        if worktree_exists:
            if upstream is not None:
                upstream.cancel()
            if last is not None and last.branch == branch and now - last.at < self.interval:
                return RepoCheckout(path, "reused", last.head, now - last.at)
            return None
        head = await upstream if upstream is not None else None
        if not head:
            return None
        if last is not None and last.branch == branch:
            # Only this manager fetches the mirror, under its lock: the head it recorded
            # is still the mirror's, without a git process to ask.
            ours = last.head
        else:
            ours = (
                await self.git.run(
                    "rev-parse", "--verify", "--quiet",
                    f"refs/heads/{branch}^{{commit}}", cwd=path, check=False,
                )
            ).stdout.strip()  # fmt: skip
        if ours != head:
            return None
        ago = now - last.at if last is not None else float("inf")
        return RepoCheckout(path, "reused", head, ago)
