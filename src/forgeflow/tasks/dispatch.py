"""What the scheduler, a task's run and the outbox share, built before any of them.

The scheduler starts runs; a run's last move gives its repository's lease back and
claims the repository's next task in the same transaction; the outbox posts receipts
but leaves those of tasks being prepared here to their preparation; the preparations
share a bound on how many of them run git at once. Each of these needs to know a little
of the others' state. Rather than patch one object into another after
construction, that state lives here and every object receives it in its constructor.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import timedelta

import structlog
from sqlalchemy import Connection

from forgeflow.domain.states import TaskState
from forgeflow.store import scheduling
from forgeflow.store.scheduling import Claim

log = structlog.get_logger("forgeflow.tasks.dispatch")


class Wakeup:
    """A nudge for a loop that otherwise sleeps until its next poll.

    Ingress sets it when it accepts a task, so the task is claimed at once instead of
    after the poll interval; it is made before the scheduler exists (and when this
    process runs no scheduler, nobody waits for it)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` or until set, whichever comes first; then forget the nudge."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(seconds, 0.0)):
                await self._event.wait()
        self._event.clear()


class Preparing:
    """The tasks this process is preparing (workspace, receipt, prompt context), and the
    bound on how many of them do their workspace work (clone or fetch, worktree) at once.

    Busy from the claim, not from when the run gets to its preparation: work that
    waits for :attr:`idle` (other tasks' receipts, a verification) must not slip in
    between, because it competes with the preparation for the one event-loop thread
    and the preparation is what a turn waits for.

    The bound: a burst of first mentions on new repositories once started one clone
    per repository all at once (185 git processes on two cores), and the webhook's
    answers waited for the CPU those took. A task beyond the bound stays claimed and
    waits here for a place, in claim order: its claim, its lease (renewed by its run's
    heartbeat, which is already running) and its repository's order are those of any
    claimed task, so nothing about exactly-once or FIFO changes; only its git work
    waits."""

    def __init__(self, *, limit: int) -> None:
        if limit < 1:
            raise ValueError("at least one preparation must be allowed")
        self._ids: set[str] = set()
        self.idle = asyncio.Event()
        self.idle.set()
        self.limit = limit
        self._places = asyncio.Semaphore(limit)
        self.working = 0  # preparations holding a place: their git work runs
        self.waiting = 0  # preparations waiting for a place

    def __contains__(self, task_id: str) -> bool:
        return task_id in self._ids

    def expect(self, task_id: str) -> None:
        self._ids.add(task_id)
        self.idle.clear()

    def done(self, task_id: str) -> None:
        self._ids.discard(task_id)
        if not self._ids:
            self.idle.set()

    async def first(self, seconds: float) -> None:
        """Let the preparations go first, for at most ``seconds``."""
        if not self.idle.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await self.idle.wait()

    @contextlib.asynccontextmanager
    async def place(self) -> AsyncIterator[None]:
        """Hold one of the :attr:`limit` places for a preparation's workspace work;
        waits (first come, first served) while all are taken."""
        self.waiting += 1
        try:
            await self._places.acquire()
        finally:
            self.waiting -= 1
        self.working += 1
        try:
            yield
        finally:
            self.working -= 1
            self._places.release()


class Runs:
    """The claims this process runs and the repositories they hold.

    A repository runs at most one task; when that task gives its lease back, the next
    task of the repository is claimed in the same transaction (:meth:`claimer`), so the
    repository never waits for a scheduler round between two of its tasks, and the
    database's one-lease-per-repository rule still decides. New claims are queued here
    and started by the scheduler (:meth:`next_claim`)."""

    def __init__(
        self,
        *,
        owner: str,
        lease_ttl: timedelta,
        worker_id: str | None,
        preparing: Preparing,
    ) -> None:
        self.owner = owner
        self.lease_ttl = lease_ttl
        self.worker_id = worker_id
        self.preparing = preparing
        # Every task claimed by this process and not finished: a claim round must not
        # claim one of them again, even before its run started.
        self.ids: set[str] = set()
        # Repository → the task of this process that holds it. A task's run still ends
        # (reply verification) after its lease went to the next task: only the holder
        # named here frees the repository.
        self.busy_repos: dict[str, str] = {}
        # Busy repositories the last claim round saw tasks waiting for.
        self.waiting_repos: set[str] = set()
        self.stopping = False
        self._claims: asyncio.Queue[Claim] = asyncio.Queue()

    def claimer(
        self, repo_key: str, released_by: str
    ) -> Callable[[Connection], list[Claim]] | None:
        """The unit that claims the repository's next task (None: do not claim now);
        built on the event loop, run on the writer thread inside the releasing
        transaction."""
        if self.stopping or repo_key not in self.waiting_repos:
            # No task was seen waiting for it in the last round (one task per repository
            # is the common case): no query; a task accepted since then is claimed by
            # the round its acceptance wakes, or the one after this run ends.
            return None
        running = frozenset(self.ids)  # taken here, on the event loop

        def claim_next(conn: Connection) -> list[Claim]:
            # In its own savepoint: whatever goes wrong here must not undo the move that
            # releases the lease; the claim round then picks the task up as before.
            try:
                with conn.begin_nested():
                    return scheduling.claim_next(
                        conn,
                        repo_key,
                        released_by=released_by,
                        running=running,
                        owner=self.owner,
                        ttl=self.lease_ttl,
                        worker_id=self.worker_id,
                    )
            except Exception:
                log.exception("scheduler.handoff_failed", repo_key=repo_key)
                return []

        return claim_next

    def started(self, claims: list[Claim]) -> None:
        """Take what a claim committed (on the event loop, after the commit)."""
        for claim in claims:
            task = claim.task
            self.ids.add(task.task_id)
            if claim.lease_id is not None:
                self.busy_repos[task.repo_key] = task.task_id
            if task.state == TaskState.PREPARING:
                self.preparing.expect(task.task_id)
            self._claims.put_nowait(claim)

    async def next_claim(self) -> Claim:
        return await self._claims.get()

    def ended(self, task_id: str, repo_key: str) -> None:
        self.ids.discard(task_id)
        self.preparing.done(task_id)
        if self.busy_repos.get(repo_key) == task_id:
            del self.busy_repos[repo_key]
