"""The Scheduler of ARCHITECTURE §5.2/§7: FIFO claiming under repository leases.

No global concurrency cap: each repository runs at most one task (a lease row plus a
unique index in the database), and every repository runs in parallel. A new task is
claimed without waiting for the poll: ingress calls :meth:`Scheduler.wake`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import structlog
from sqlalchemy import Connection

from forgeflow.domain.retry import RetryPolicy
from forgeflow.gitea.client import GiteaError
from forgeflow.store import Store, outbox, scheduling, workers
from forgeflow.store.sql import TASKS_CHANNEL
from forgeflow.store.types import utcnow
from forgeflow.tasks.replies import Replies
from forgeflow.tasks.run import Execution

log = structlog.get_logger("forgeflow.tasks.scheduler")
_RECEIPTS_AT_ONCE = 8
# At most this long the outbox lets this process's preparing tasks go first.
_RECEIPTS_DEFER_SECONDS = 1.0


class Scheduler:
    def __init__(
        self,
        store: Store,
        execution: Execution,
        replies: Replies,
        *,
        owner: str,
        node_prefix: str,
        lease_ttl: timedelta,
        retry: RetryPolicy,
        poll_seconds: float = 5.0,
        worker_id: str | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.store = store
        self.execution = execution
        self.replies = replies
        self.owner = owner
        self.node_prefix = node_prefix
        self.lease_ttl = lease_ttl
        self.retry = retry
        self.poll_seconds = poll_seconds
        self._wake = asyncio.Event()
        self._outbox_wake = asyncio.Event()
        self._running: dict[str, asyncio.Task[Any]] = {}
        # Repository → the task of this process that holds it. A task's run still ends
        # (reply verification) after its lease went to the next task: only the holder
        # named here frees the repository.
        self._busy_repos: dict[str, str] = {}
        # Busy repositories the last claim round saw tasks waiting for.
        self._waiting_repos: set[str] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._stopping = False
        # Set after the first claim round: `serve` imports its HTTP layer only then.
        self.first_round_done = asyncio.Event()
        execution.moves.handoff = self

    def wake(self) -> None:
        # The outbox is woken by the claim loop once its round is done: a task claimed
        # now posts its own receipt while its workspace is prepared, and the outbox's
        # queries do not compete with the claim.
        self._wake.set()

    async def recover(self) -> None:
        """Move on work left by dead workers (run at start-up, then every lease period)."""
        changed = await self.store.write(
            partial(
                scheduling.recover,
                owner=self.owner,
                node_prefix=self.node_prefix,
                retry=self.retry,
                ttl=self.lease_ttl,
            )
        )
        for task in changed:
            log.info("recovery.task", task_id=task["task_id"], state=task["state"])
        if changed:
            self.wake()

    async def start(self) -> None:
        await self.recover()
        self._loops = [
            asyncio.create_task(self._heartbeat(), name="scheduler.heartbeat"),
            asyncio.create_task(self._claim_loop(), name="scheduler.claim"),
            asyncio.create_task(self._outbox_loop(), name="scheduler.outbox"),
        ]
        if self.store.dialect == "postgresql":
            self._loops.append(asyncio.create_task(self._listen(), name="scheduler.listen"))

    async def stop(self) -> None:
        """Stop claiming and leave running work to restart recovery."""
        self._stopping = True
        for t in [*self._loops, *self._running.values()]:
            t.cancel()
        for t in [*self._loops, *self._running.values()]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def _heartbeat(self) -> None:
        """Keep this worker's row fresh: its repositories stay bound to it."""
        if self.worker_id is None:
            return
        worker_id = self.worker_id
        while not self._stopping:
            await asyncio.sleep(self.lease_ttl.total_seconds() / 3)
            try:
                await self.store.write(partial(workers.beat, worker_id=worker_id, owner=self.owner))
            except Exception as exc:
                log.warning("worker.heartbeat_failed", error=type(exc).__name__)

    async def _listen(self) -> None:
        """PostgreSQL LISTEN: tasks accepted by another process wake this one at once."""
        import psycopg

        delay = 0.5
        while not self._stopping:
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

    async def _sleep(self, event: asyncio.Event, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(seconds, 0.0)):
                await event.wait()
        event.clear()

    async def _claim_loop(self) -> None:
        last_recovery = asyncio.get_running_loop().time()
        while not self._stopping:
            try:
                now = asyncio.get_running_loop().time()
                if now - last_recovery >= self.lease_ttl.total_seconds():
                    # Another worker may have died meanwhile: its leases expire, we recover.
                    last_recovery = now
                    await self.recover()
                due = await self._claim_round()
                self._outbox_wake.set()
            except Exception:
                log.exception("scheduler.round_failed")
                self._outbox_wake.set()
                due = None
            self.first_round_done.set()
            delay = self.poll_seconds
            if due is not None:
                delay = min(delay, max((due - utcnow()).total_seconds(), 0.01))
            await self._sleep(self._wake, delay)

    async def _claim_round(self) -> datetime | None:
        """Claim what can start; returns when the next retry_wait task becomes due."""
        waiting: set[str] = set()
        round_ = await self.store.write(
            partial(
                scheduling.claim_round,
                busy_repos=frozenset(self._busy_repos),
                running=frozenset(self._running),
                owner=self.owner,
                ttl=self.lease_ttl,
                worker_id=self.worker_id,
                waiting=waiting,
            )
        )
        self._waiting_repos = waiting
        self.started(round_.claims)
        return round_.next_due

    # -- the handoff (task_moves.Handoff) ---------------------------------------------

    def claimer(
        self, repo_key: str, released_by: str
    ) -> Callable[[Connection], list[scheduling.Claim]] | None:
        if self._stopping or repo_key not in self._waiting_repos:
            # No task was seen waiting for it in the last round (one task per repository
            # is the common case): no query; a task accepted since then is claimed by
            # the round its acceptance wakes, or the one after this run ends.
            return None
        running = frozenset(self._running)  # taken here, on the event loop

        def claim_next(conn: Connection) -> list[scheduling.Claim]:
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

    def started(self, claims: list[scheduling.Claim]) -> None:
        for claim in claims:
            task = claim.task
            if claim.lease_id is not None:
                self._busy_repos[task["repo_key"]] = task["task_id"]
            if task["state"] == "preparing":
                self.execution.preparer.expect(task["task_id"])
            self._running[task["task_id"]] = asyncio.create_task(
                self._execute(task, claim.repo, claim.session), name=f"task {task['task_id']}"
            )

    async def _execute(
        self,
        task: dict[str, Any],
        repo: dict[str, Any] | None = None,
        session: dict[str, Any] | None = None,
    ) -> None:
        try:
            await self.execution.run(task, repo=repo, session=session)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("execution.crashed", task_id=task["task_id"])
            try:
                await self.store.write(
                    partial(
                        scheduling.abandon,
                        task_id=task["task_id"],
                        owner=self.owner,
                        retry=self.retry,
                    )
                )
            except Exception:
                log.exception("execution.abandon_failed", task_id=task["task_id"])
        finally:
            self._running.pop(task["task_id"], None)
            if self._busy_repos.get(task["repo_key"]) == task["task_id"]:
                del self._busy_repos[task["repo_key"]]
            self.wake()

    async def _outbox_loop(self) -> None:
        while not self._stopping:
            try:
                await self._outbox_round()
            except Exception:
                log.exception("outbox.round_failed")
            await self._sleep(self._outbox_wake, self.poll_seconds)

    def _not_ours(self, receipts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # A task this process prepares posts its own receipt, beside its workspace
        # work, and waits for it before its turn; later states are retried here.
        return [
            t for t in receipts if not (t["task_id"] in self._running and t["state"] == "preparing")
        ]

    async def _outbox_round(self) -> None:
        # Receipts go out side by side (a burst of mentions must not queue each one
        # behind the others' round trips), at most _RECEIPTS_AT_ONCE at a time.
        limit = asyncio.Semaphore(_RECEIPTS_AT_ONCE)

        async def receipt(task: dict[str, Any]) -> None:
            async with limit:
                position = await self.store.read(partial(scheduling.queue_position, task=task))
                try:
                    await self.replies.receipt(task, queue_position=position or None)
                except GiteaError as exc:
                    log.warning("outbox.receipt_failed", task_id=task["task_id"], error=str(exc))

        found = await self.store.read(outbox.owed)
        owed = self._not_ours(found.receipts)
        idle = self.execution.preparer.idle
        if owed and not idle.is_set():
            # A burst of mentions: the first task's preparation goes first (its turn
            # waits for it; the queued tasks' receipts only say "received"), bounded.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_RECEIPTS_DEFER_SECONDS):
                    await idle.wait()
            owed = self._not_ours(await self.store.read(outbox.receipts_owed))
        await asyncio.gather(*(receipt(t) for t in owed))
        for row in found.command_replies:
            try:
                await self.replies.command_reply(row)
            except GiteaError as exc:
                log.warning("outbox.command_reply_failed", key=row["comment_key"], error=str(exc))
        for task in found.results:
            try:
                if task["state"] == "failed" and await self.replies.answered(task):
                    # The task failed after its answer landed (a crash between the agent's
                    # post and our record): the user has an answer; no failure notice.
                    await self.store.write(partial(outbox.skip_result, task=task))
                    continue
                await self.replies.result(task, outbox.result_text(task))
            except GiteaError as exc:
                log.warning("outbox.result_failed", task_id=task["task_id"], error=str(exc))
