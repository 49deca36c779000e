"""The scheduler: FIFO claiming under repository leases, and a run per claim.

No global cap on claims: each repository runs at most one task (a lease row plus a
unique index in the database), and every repository runs in parallel; only the git work
of preparations is bounded, and a task waiting for it stays claimed. The claims, their
leases and the preparation slots are the scheduler's :class:`Dispatcher`'s. A new task
is claimed without waiting for the poll: ingress sets the :class:`Wakeup` it shares with
the scheduler. A worker binds the repositories it runs, so their workspaces stay on its
disk; a repository whose worker stopped beating is taken over by another.
"""

from __future__ import annotations

import asyncio
import contextlib
from functools import partial
from typing import Any

import structlog

from forgeflow.domain.retry import RetryPolicy
from forgeflow.store import Store, recovery, workers
from forgeflow.store.scheduling import Claim
from forgeflow.store.sql import TASKS_CHANNEL
from forgeflow.store.types import utcnow
from forgeflow.tasks.dispatch import Dispatcher, Wakeup
from forgeflow.tasks.outbox import Outbox
from forgeflow.tasks.run import Execution

log = structlog.get_logger("forgeflow.tasks.scheduler")


class Scheduler:
    def __init__(
        self,
        store: Store,
        execution: Execution,
        dispatcher: Dispatcher,
        outbox: Outbox,
        wakeup: Wakeup,
        *,
        node_prefix: str,
        retry: RetryPolicy,
        poll_seconds: float = 5.0,
    ) -> None:
        self.store = store
        self.execution = execution
        # Its claims, leases and preparation slots (read by /metrics too).
        self.dispatcher = dispatcher
        self.outbox = outbox
        self.wakeup = wakeup
        self.node_prefix = node_prefix
        self.retry = retry
        self.poll_seconds = poll_seconds
        self._running: dict[str, asyncio.Task[Any]] = {}
        self._loops: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        # Set after the first claim round: `serve` imports its HTTP layer only then.
        self.first_round_done = asyncio.Event()

    def wake(self) -> None:
        # The outbox is woken by the claim loop once its round is done: a task claimed
        # now posts its own receipt while its workspace is prepared, and the outbox's
        # queries do not compete with the claim.
        self.wakeup.set()

    async def recover(self) -> None:
        """Move on work left by dead workers (run at start-up, then every lease period)."""
        changed = await self.store.write(
            partial(
                recovery.recover,
                owner=self.dispatcher.owner,
                node_prefix=self.node_prefix,
                retry=self.retry,
                ttl=self.dispatcher.lease_ttl,
            )
        )
        for task in changed:
            log.info("recovery.task", task_id=task.task_id, state=task.state)
        if changed:
            self.wake()

    async def start(self) -> None:
        await self.recover()
        self._loops = [
            asyncio.create_task(self._heartbeat(), name="scheduler.heartbeat"),
            asyncio.create_task(self._claim_loop(), name="scheduler.claim"),
            asyncio.create_task(
                self.outbox.loop(self.poll_seconds, self._stopping), name="scheduler.outbox"
            ),
            asyncio.create_task(self._dispatch_loop(), name="scheduler.dispatch"),
        ]
        if self.store.dialect == "postgresql":
            self._loops.append(asyncio.create_task(self._listen(), name="scheduler.listen"))

    async def stop(self) -> None:
        """Stop claiming and leave running work to restart recovery."""
        self._stopping.set()
        self.dispatcher.stopping = True
        for t in [*self._loops, *self._running.values()]:
            t.cancel()
        for t in [*self._loops, *self._running.values()]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def _heartbeat(self) -> None:
        """Keep this worker's row fresh: its repositories stay bound to it."""
        if self.dispatcher.worker_id is None:
            return
        worker_id = self.dispatcher.worker_id
        while not self._stopping.is_set():
            await asyncio.sleep(self.dispatcher.lease_ttl.total_seconds() / 3)
            try:
                await self.store.write(
                    partial(workers.beat, worker_id=worker_id, owner=self.dispatcher.owner)
                )
            except Exception as exc:
                log.warning("worker.heartbeat_failed", error=type(exc).__name__)

    async def _listen(self) -> None:
        """PostgreSQL LISTEN: tasks accepted by another process wake this one at once."""
        import psycopg

        delay = 0.5
        while not self._stopping.is_set():
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.store.libpq_url(), autocommit=True
                ) as conn:
                    await conn.execute(f"LISTEN {TASKS_CHANNEL}")
                    delay = 0.5
                    self.wake()  # anything that arrived while we were not listening
                    async for _note in conn.notifies():
                        self.wake()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("scheduler.listen_failed", error=type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    async def _claim_loop(self) -> None:
        last_recovery = asyncio.get_running_loop().time()
        while not self._stopping.is_set():
            try:
                now = asyncio.get_running_loop().time()
                if now - last_recovery >= self.dispatcher.lease_ttl.total_seconds():
                    # Another worker may have died meanwhile: its leases expire, we recover.
                    last_recovery = now
                    await self.recover()
                due = await self.dispatcher.claim_round()
                self.outbox.wakeup.set()
            except Exception:
                log.exception("scheduler.round_failed")
                self.outbox.wakeup.set()
                due = None
            self.first_round_done.set()
            delay = self.poll_seconds
            if due is not None:
                delay = min(delay, max((due - utcnow()).total_seconds(), 0.01))
            await self.wakeup.sleep(delay)

    async def _dispatch_loop(self) -> None:
        """Start a run for every claim, whether a claim round or a handoff made it."""
        while not self._stopping.is_set():
            claim = await self.dispatcher.next_claim()
            self._start(claim)

    def _start(self, claim: Claim) -> None:
        task = claim.task
        self._running[task.task_id] = asyncio.create_task(
            self._execute(claim), name=f"task {task.task_id}"
        )

    async def _execute(self, claim: Claim) -> None:
        task = claim.task
        try:
            await self.execution.run(claim)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("execution.crashed", task_id=task.task_id)
            try:
                await self.store.write(
                    partial(
                        recovery.abandon,
                        task_id=task.task_id,
                        owner=self.dispatcher.owner,
                        retry=self.retry,
                    )
                )
            except Exception:
                log.exception("execution.abandon_failed", task_id=task.task_id)
        finally:
            self._running.pop(task.task_id, None)
            self.dispatcher.ended(task.task_id, task.repo_key)
            self.wake()
