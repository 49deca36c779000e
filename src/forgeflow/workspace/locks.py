"""One lock per repository for the git work of a process on that repository's mirror,
clone and worktrees.

A process has one :class:`~forgeflow.workspace.manager.WorkspaceManager`, shared by its
tasks and its pipelines, so these locks order a pipeline's cleanup after a task's
preparation or push of the same repository (and only one fetch of a mirror runs at a
time, which the fetch rule relies on). They order work inside one process; the
database's one-active-task-per-repository rule orders it between processes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import structlog

from forgeflow.domain.ids import RepoRef

log = structlog.get_logger("forgeflow.workspace")

Waiting = Callable[[RepoRef, str], None]


class RepoLocks:
    """The locks, and who holds each one (for the log line of whoever waits)."""

    def __init__(self, on_wait: Waiting | None = None) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._holders: dict[str, str] = {}
        # Called (repository, what waits) when an operation has to wait for another's
        # lock: how a test sees, without a clock, that one waits for the other.
        self.on_wait = on_wait

    @contextlib.asynccontextmanager
    async def hold(self, repo: RepoRef, what: str) -> AsyncIterator[None]:
        """The repository's lock for ``what`` (an operation's name, for the log)."""
        lock = self._locks.setdefault(repo.key, asyncio.Lock())
        if lock.locked():
            holder = self._holders.get(repo.key)
            log.info("workspace.waiting", repo_key=repo.key, waiting=what, holder=holder)
            if self.on_wait is not None:
                self.on_wait(repo, what)
        async with lock:
            self._holders[repo.key] = what
            try:
                yield
            finally:
                self._holders.pop(repo.key, None)
