"""The dispatcher: the claims this process runs, their leases, the preparation slots.

One :class:`Dispatcher` per process, owned by the scheduler and built before it, so the
objects that need a little of its state receive it in their constructors: a task's run
holds its lease here (:meth:`Dispatcher.holding`) and waits here for a preparation
slot (:meth:`Dispatcher.place`); a run's last move gives its repository's lease back
and claims the repository's next task in the same transaction (:meth:`claimer`, the
handoff ``moves.py`` asks for); the outbox leaves the receipts of tasks being prepared
here to their preparation. Nothing else keeps a copy of this state.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from functools import partial

import structlog
from sqlalchemy import Connection

from forgeflow.domain.records import Task
from forgeflow.domain.states import TaskState
from forgeflow.store import Store, leases, scheduling
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


class Holding:
    """A run's hold on its repository's lease: renewed while the task is active (an
    expired lease lets another worker's recovery take the task over)."""

    def __init__(self, beat: asyncio.Task[None] | None) -> None:
        self._beat = beat

    def given_back(self) -> None:
        """The move out of the active states gave the lease back: nothing to renew."""
        if self._beat is not None:
            self._beat.cancel()


class Dispatcher:
    """Claims, leases and preparation slots of this process.

    Claims: a repository runs at most one task; when that task gives its lease back,
    the next task of the repository is claimed in the same transaction, so the
    repository never waits for a scheduler round between two of its tasks, and the
    database's one-lease-per-repository rule still decides. Every claim, a round's or
    a handoff's, is queued here and started by the scheduler (:meth:`next_claim`).

    Preparations: a task is "being prepared" from its claim, not from when its run gets
    to it: work that waits for :meth:`first` (other tasks' receipts, a verification)
    must not slip in between, because it competes with the preparation for the one
    event-loop thread and the preparation is what a turn waits for. At most ``limit``
    of them do their workspace work (clone or fetch, worktree) at once: a burst of first
    mentions on new repositories once started one clone per repository all at once (185
    git processes on two cores), and the webhook's answers waited for the CPU those
    took. A task beyond the bound stays claimed and waits for a place, in claim order:
    its claim, its lease (renewed) and its repository's order are those of any claimed
    task, so nothing about exactly-once or FIFO changes; only its git work waits."""

    def __init__(
        self,
        store: Store,
        *,
        owner: str,
        lease_ttl: timedelta,
        worker_id: str | None,
        max_preparations: int,
    ) -> None:
        if max_preparations < 1:
            raise ValueError("at least one preparation must be allowed")
        self.store = store
        self.owner = owner
        self.lease_ttl = lease_ttl
        self.worker_id = worker_id
        # Every task claimed by this process and not finished: a claim round must not
        # claim one of them again, even before its run started.
        self.ids: set[str] = set()
        # Repository → the task of this process that holds it. A task's run still ends
        # (reply verification) after its lease went to the next task: only the holder
        # named here frees the repository.
        self.busy_repos: dict[str, str] = {}
        # Busy repositories the last claim round saw tasks waiting for.
        self.waiting_repos: frozenset[str] = frozenset()
        self.stopping = False
        self._claims: asyncio.Queue[Claim] = asyncio.Queue()
        self._preparing: set[str] = set()
        self.idle = asyncio.Event()  # set while no task of this process is prepared
        self.idle.set()
        self.limit = max_preparations
        self._places = asyncio.Semaphore(max_preparations)
        self.working = 0  # preparations holding a place: their git work runs
        self.waiting = 0  # preparations waiting for a place

    # -- claims -----------------------------------------------------------------------

    async def claim_round(self) -> datetime | None:
        """Claim what can start; returns when the next retry_wait task becomes due."""
        round_ = await self.store.write(
            partial(
                scheduling.claim_round,
                busy_repos=frozenset(self.busy_repos),
                running=frozenset(self.ids),
                owner=self.owner,
                ttl=self.lease_ttl,
                worker_id=self.worker_id,
            )
        )
        self.waiting_repos = round_.waiting_repos
        self.started(round_.claims)
        return round_.next_due

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
                self._preparing.add(task.task_id)
                self.idle.clear()
            self._claims.put_nowait(claim)

    async def next_claim(self) -> Claim:
        return await self._claims.get()

    def ended(self, task_id: str, repo_key: str) -> None:
        """A run is over: its task is no longer this process's."""
        self.ids.discard(task_id)
        self.prepared(task_id)
        if self.busy_repos.get(repo_key) == task_id:
            del self.busy_repos[repo_key]

    # -- leases -----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def holding(self, task: Task) -> AsyncIterator[Holding]:
        """Renew the task's lease while its run holds it (until :meth:`Holding.given_back`
        or the run's end)."""
        beat = None
        if task.lease_id:
            beat = asyncio.create_task(self._renew(task.repo_key, task.lease_id))
        try:
            yield Holding(beat)
        finally:
            if beat is not None:
                beat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beat

    async def _renew(self, repo_key: str, lease_id: str) -> None:
        ttl = self.lease_ttl
        while True:
            await asyncio.sleep(ttl.total_seconds() / 3)
            if not await self.store.write(lambda c: leases.renew(c, repo_key, lease_id, ttl)):
                log.warning("lease.lost", repo_key=repo_key, lease_id=lease_id)
                return

    # -- preparations -----------------------------------------------------------------

    def preparing(self, task_id: str) -> bool:
        """Whether this process prepares the task now (it posts its own receipt)."""
        return task_id in self._preparing

    def prepared(self, task_id: str) -> None:
        """The task's preparing step is over (or its run ended)."""
        self._preparing.discard(task_id)
        if not self._preparing:
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
