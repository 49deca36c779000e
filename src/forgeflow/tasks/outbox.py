"""Comments owed to users: every task's receipt, answers to commands, failure notices.

A task's receipt has one path, :meth:`Outbox.receipt`. A task this process prepares
posts it from its preparation, side by side with the workspace work, and its turn
starts only once it is settled; the outbox loop posts the receipts of tasks still
queued (with their place in the queue) and of every task whose receipt a crash or a
Gitea failure left unposted. Every post is exactly-once (see ``replies.post_once``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import partial

import structlog

from forgeflow.domain import modes
from forgeflow.domain.records import Task
from forgeflow.domain.states import TaskState
from forgeflow.gitea.client import GiteaClient, GiteaError
from forgeflow.store import Store, commands, outbox, scheduling
from forgeflow.store.audit import AuditEvent
from forgeflow.store.db import Unit
from forgeflow.tasks.dispatch import Dispatcher, Wakeup
from forgeflow.tasks.moves import task_event
from forgeflow.tasks.replies import Replies
from forgeflow.tasks.tracking import Tracker
from forgeflow.tasks.verify import answered

log = structlog.get_logger("forgeflow.tasks.outbox")
_RECEIPTS_AT_ONCE = 8
# At most this long the outbox lets this process's preparing tasks go first.
_RECEIPTS_DEFER_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Receipt:
    """What posting a claimed task's receipt leaves for the move that ends its
    preparation: the post's record, or the audit rows of a failure to post."""

    record: Unit | None = None
    events: tuple[AuditEvent, ...] = ()


class Outbox:
    def __init__(
        self,
        store: Store,
        replies: Replies,
        dispatcher: Dispatcher,
        *,
        gitea: GiteaClient | None = None,
        tracker: Tracker | None = None,
    ) -> None:
        self.store = store
        self.replies = replies
        self.dispatcher = dispatcher
        self.gitea = gitea  # for reactions (none: no reactions)
        self.tracker = tracker  # the receipt's edits after the turn (tracking.py)
        # Set by the claim loop once its round is done: a task claimed in the round
        # posts its own receipt while its workspace is prepared, and the outbox's
        # queries do not compete with the claim.
        self.wakeup = Wakeup()

    async def receipt(self, task: Task, *, claimed: bool = False) -> Receipt:
        """Post the task's receipt once.

        ``claimed`` (a preparation's): the record of the post is returned, to be written
        with the task's next move instead of in a commit of its own. Else the receipt
        says how many tasks of the repository are ahead of this one."""
        if modes.is_draft(task.mode):
            return Receipt()  # a review/plan (draft) task posts nothing on Gitea
        # The reaction goes out beside the receipt, not before it: both are settled
        # before the turn starts, and neither waits for the other's round trip.
        reacting = asyncio.create_task(self.react(task, "eyes"))
        try:
            return await self._post_receipt(task, claimed=claimed)
        finally:
            await reacting

    async def _post_receipt(self, task: Task, *, claimed: bool) -> Receipt:
        position = None
        if not claimed:
            position = await self.store.read(partial(scheduling.queue_position, task=task))
        try:
            # A preparation waits for another poster's attempt to settle: the task's
            # turn must not answer before its receipt is out.
            posted = await self.replies.receipt(
                task, queue_position=position or None, wait_in_flight=claimed, defer=claimed
            )
        except GiteaError as exc:
            log.warning("outbox.receipt_failed", task_id=task.task_id, error=str(exc))
            failed = task_event(
                task,
                "comment.receipt_failed",
                error_code="gitea_unavailable",
                metadata={"error": str(exc)},
            )
            return Receipt(events=(failed,))
        return Receipt(posted.record)

    async def react(self, task: Task, content: str) -> None:
        """The mention's reaction, settled with its receipt (so before its turn). Gitea answers
        an existing reaction with 200, so a retry after a crash adds nothing; a Gitea
        that refuses it (403: not in its setting.UI.Reactions) costs one log line."""
        if self.gitea is None or task.delivery_key is None:
            return  # a pipeline's task answers no mention
        repo, number = task.resource.repo, task.resource.number
        try:
            await self.gitea.react(
                repo.owner, repo.name, content, comment_id=task.comment_id, index=number
            )
        except GiteaError as exc:
            log.info("outbox.reaction_refused", task_id=task.task_id, error=str(exc))

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
        if owed and not self.dispatcher.idle.is_set():
            # A burst of mentions: the first task's preparation goes first (its turn
            # waits for it; the queued tasks' receipts only say "received"), bounded.
            await self.dispatcher.first(_RECEIPTS_DEFER_SECONDS)
            owed = self._not_preparing(await self.store.read(outbox.receipts_owed))
        await self._receipts(owed)
        for row in found.command_replies:
            try:
                await self.replies.command_reply(row)
            except GiteaError as exc:
                log.warning("outbox.command_reply_failed", key=row.comment_key, error=str(exc))
        if self.gitea is not None:
            await self._command_reactions(self.gitea)  # after the answers, not before
        for task in found.results:
            await self._result(task)
        if self.tracker is not None:
            for task in found.tracking:
                await self.tracker.final(task)

    async def _command_reactions(self, gitea: GiteaClient) -> None:
        """The reaction that says a command was done. Gitea answers an existing reaction
        with 200, so sending it again after a crash adds nothing; a refusal (a 4xx: not
        in the instance's setting.UI.Reactions, or the comment is gone) costs one log
        line and is not tried again; an unreachable Gitea is tried next round."""
        for owed in await self.store.read(commands.reactions_owed):
            repo = owed.resource.repo
            try:
                await gitea.react(
                    repo.owner,
                    repo.name,
                    owed.content,
                    comment_id=owed.comment_id,
                    index=owed.resource.number,
                )
            except GiteaError as exc:
                refused = exc.status is not None and 400 <= exc.status < 500
                if not refused:
                    log.warning("outbox.reaction_failed", key=owed.key, error=str(exc))
                    continue
                log.info("outbox.reaction_refused", key=owed.key, error=str(exc))
                await self.store.write(partial(commands.reacted, reaction=owed, refused=True))
                continue
            await self.store.write(partial(commands.reacted, reaction=owed, refused=False))

    def _not_preparing(self, receipts: list[Task]) -> list[Task]:
        # A task this process prepares posts its own receipt, beside its workspace work.
        return [t for t in receipts if not self.dispatcher.preparing(t.task_id)]

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
            if task.state == TaskState.FAILED and await answered(self.replies, task):
                # The task failed after its answer landed (a crash between the agent's
                # post and our record): the user has an answer; no failure notice.
                await self.store.write(partial(outbox.skip_result, task=task))
                return
            await self.replies.result(task, outbox.result_text(task))
        except GiteaError as exc:
            log.warning("outbox.result_failed", task_id=task.task_id, error=str(exc))
