"""One lock per repository for the git work of a process on that repository's mirror,
clone and worktrees, and the tasks working in them.

A process has one :class:`~forgeflow.workspace.manager.WorkspaceManager`, shared by its
tasks and its pipelines, so these locks order a pipeline's cleanup after a task's
preparation or push of the same repository (and only one fetch of a mirror runs at a
time, which the fetch rule relies on). A task that works in a repository (from its
preparation to its push, the agent's turn between) says so (:meth:`RepoLocks.working`),
and a removal waits until none does: the agent's worktree is not taken away under its
turn. They order work inside one process; the database's one-active-task-per-repository
rule orders it between processes.
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
        self._idle: dict[str, asyncio.Condition] = {}  # on the repository's lock
        self._working: dict[str, int] = {}  # tasks working in the repository now
        self._holders: dict[str, str] = {}
        # Called (repository, what waits) when an operation has to wait for another's
        # lock: how a test sees, without a clock, that one waits for the other.
        self.on_wait = on_wait

    @contextlib.asynccontextmanager
    async def hold(self, repo: RepoRef, what: str) -> AsyncIterator[None]:
        """The repository's lock for ``what`` (an operation's name, for the log)."""
        lock = self._lock(repo)
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

    @contextlib.asynccontextmanager
    async def working(self, repo: RepoRef) -> AsyncIterator[None]:
        """A task works in the repository's clone and worktree while this is entered
        (it takes the lock only to count itself in and out: its own git work waits for
        the lock as anything else's does)."""
        idle = self._condition(repo)
        async with idle:
            self._working[repo.key] = self._working.get(repo.key, 0) + 1
        try:
            yield
        finally:
            async with idle:
                self._working[repo.key] -= 1
                if not self._working[repo.key]:
                    del self._working[repo.key]
                    idle.notify_all()

    @contextlib.asynccontextmanager
    async def when_idle(self, repo: RepoRef, what: str) -> AsyncIterator[None]:
        """The repository's lock once no task works in it (for a removal)."""
        idle = self._condition(repo)
        async with self.hold(repo, what):
            if self._working.get(repo.key):
                log.info("workspace.waiting", repo_key=repo.key, waiting=what, holder="task")
                if self.on_wait is not None:
                    self.on_wait(repo, what)
                await idle.wait_for(lambda: not self._working.get(repo.key))
                self._holders[repo.key] = what  # the lock was lent out while it waited
            yield

    def _lock(self, repo: RepoRef) -> asyncio.Lock:
        return self._locks.setdefault(repo.key, asyncio.Lock())

    def _condition(self, repo: RepoRef) -> asyncio.Condition:
        idle = self._idle.get(repo.key)
        if idle is None:
            idle = self._idle[repo.key] = asyncio.Condition(self._lock(repo))
        return idle
