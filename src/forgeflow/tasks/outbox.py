"""Comments owed to users: every task's receipt, answers to commands, failure notices.

A task's receipt has one path, :meth:`Outbox.receipt`. A task this process prepares
posts it from its preparation, side by side with the workspace work, and its turn
starts only once it is settled; the outbox loop posts the receipts of tasks still
queued (with their place in the queue) and of every task whose receipt a crash or a
Gitea failure left unposted. Every post is exactly-once (see ``replies.post_once``).
"""

from __future__ import annotations

import asyncio
from functools import partial

import structlog

from forgeflow.domain import modes
from forgeflow.domain.records import Task
from forgeflow.domain.states import TaskState
from forgeflow.gitea.client import GiteaError
from forgeflow.store import Store, outbox, scheduling
from forgeflow.store.audit import AuditEvent
from forgeflow.store.db import Unit
from forgeflow.tasks.dispatch import Preparing, Wakeup
from forgeflow.tasks.moves import task_event
from forgeflow.tasks.replies import Replies

log = structlog.get_logger("forgeflow.tasks.outbox")
_RECEIPTS_AT_ONCE = 8
# At most this long the outbox lets this process's preparing tasks go first.
_RECEIPTS_DEFER_SECONDS = 1.0


class Outbox:
    def __init__(self, store: Store, replies: Replies, preparing: Preparing) -> None:
        self.store = store
        self.replies = replies
        self.preparing = preparing
        # Set by the claim loop once its round is done: a task claimed in the round
        # posts its own receipt while its workspace is prepared, and the outbox's
        # queries do not compete with the claim.
        self.wakeup = Wakeup()

    async def receipt(self, task: Task, *, record: list[Unit] | None = None) -> list[AuditEvent]:
        """Post the task's receipt once; return the audit rows of a failure to post.

        ``record`` (from a preparation): the record of the post is appended there, to be
        written with the task's next move instead of in a commit of its own. Without
        it, the receipt says how many tasks of the repository are ahead of this one."""
        if modes.is_draft(task.mode):
            return []  # a review/plan (draft) task posts nothing on Gitea
        claimed = record is not None
        position = None
        if not claimed:
            position = await self.store.read(partial(scheduling.queue_position, task=task))
        try:
            # A preparation waits for another poster's attempt to settle: the task's
            # turn must not answer before its receipt is out.
            await self.replies.receipt(
                task, queue_position=position or None, wait_in_flight=claimed, defer_record=record
            )
        except GiteaError as exc:
            log.warning("outbox.receipt_failed", task_id=task.task_id, error=str(exc))
            return [
                task_event(
                    task,
                    "comment.receipt_failed",
                    error_code="gitea_unavailable",
                    metadata={"error": str(exc)},
                )
            ]
        return []

    async def loop(self, poll_seconds: float, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                await self.round()
            except Exception:
                log.exception("outbox.round_failed")
            await self.wakeup.sleep(poll_seconds)

    async def round(self) -> None:
        found = await self.store.read(outbox.owed)
        owed = self._not_preparing(found.receipts)
        if owed and not self.preparing.idle.is_set():
            # A burst of mentions: the first task's preparation goes first (its turn
            # waits for it; the queued tasks' receipts only say "received"), bounded.
            await self.preparing.first(_RECEIPTS_DEFER_SECONDS)
            owed = self._not_preparing(await self.store.read(outbox.receipts_owed))
        await self._receipts(owed)
        for row in found.command_replies:
            try:
                await self.replies.command_reply(row)
            except GiteaError as exc:
                log.warning("outbox.command_reply_failed", key=row.comment_key, error=str(exc))
        for task in found.results:
            await self._result(task)

    def _not_preparing(self, receipts: list[Task]) -> list[Task]:
        # A task this process prepares posts its own receipt, beside its workspace work.
        return [t for t in receipts if t.task_id not in self.preparing]

    async def _receipts(self, owed: list[Task]) -> None:
        # Side by side (a burst of mentions must not queue each receipt behind the
        # others' round trips), at most _RECEIPTS_AT_ONCE at a time.
        limit = asyncio.Semaphore(_RECEIPTS_AT_ONCE)

        async def one(task: Task) -> None:
            async with limit:
                await self.receipt(task)

        await asyncio.gather(*(one(t) for t in owed))

    async def _result(self, task: Task) -> None:
        try:
            if task.state == TaskState.FAILED and await self.replies.answered(task):
                # The task failed after its answer landed (a crash between the agent's
                # post and our record): the user has an answer; no failure notice.
                await self.store.write(partial(outbox.skip_result, task=task))
                return
            await self.replies.result(task, outbox.result_text(task))
        except GiteaError as exc:
            log.warning("outbox.result_failed", task_id=task.task_id, error=str(exc))
