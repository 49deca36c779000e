"""A claimed task's run: ``preparing`` → ``running`` → ``verifying_reply`` → terminal.

One :class:`Execution` drives one claimed task as far as it goes now: the preparing
step is ``prepare.py``'s, the turn ``turn.py``'s, and the verification of the answer is
here. Every state change goes through the store's transition function; every side
effect (clone, turn, comment) is recorded before and after it happens.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from functools import partial

import structlog

from forgeflow.domain.markers import MarkerKind, parse_marker
from forgeflow.domain.records import Repository, Session, Task, Turn
from forgeflow.domain.states import ACTIVE_STATES, TaskState
from forgeflow.gitea.client import GiteaError
from forgeflow.store import Store, leases
from forgeflow.store import comments as comment_q
from forgeflow.store import turns as turn_q
from forgeflow.store.types import utcnow
from forgeflow.tasks import drafts, egress
from forgeflow.tasks.dispatch import Preparing
from forgeflow.tasks.moves import TaskMoves
from forgeflow.tasks.prepare import Prepared, Preparer
from forgeflow.tasks.publish import Outcome, Publisher
from forgeflow.tasks.replies import Found, Replies, Verification
from forgeflow.tasks.turn import EndedTurn, TurnRunner

log = structlog.get_logger("forgeflow.tasks.run")

S = TaskState
# At most this long a finished turn's verification lets preparing tasks go first.
_VERIFY_DEFER_SECONDS = 1.0


class Execution:
    def __init__(
        self,
        store: Store,
        replies: Replies,
        moves: TaskMoves,
        preparer: Preparer,
        turns: TurnRunner,
        preparing: Preparing,
        publisher: Publisher | None = None,
        *,
        lease_ttl: timedelta,
    ) -> None:
        self.lease_ttl = lease_ttl
        self.store = store
        self.replies = replies
        self.moves = moves
        self.preparer = preparer
        self.turns = turns
        self.preparing = preparing
        self.publisher = publisher

    async def _heartbeat(self, repo_key: str, lease_id: str) -> None:
        """Renew the repository's lease while the run holds it: an expired lease lets
        another worker's recovery take the task over."""
        ttl = self.lease_ttl
        while True:
            await asyncio.sleep(ttl.total_seconds() / 3)
            if not await self.store.write(lambda c: leases.renew(c, repo_key, lease_id, ttl)):
                log.warning("lease.lost", repo_key=repo_key, lease_id=lease_id)
                return

    async def run(
        self,
        task: Task,
        *,
        repo: Repository | None = None,
        session: Session | None = None,
    ) -> Task:
        """Drive a just-claimed task as far as it goes now; return its last row.

        ``repo``, ``session``: its repository and session rows when the claim read them
        (else they are read here)."""
        beat = None
        if task.lease_id:
            beat = asyncio.create_task(self._heartbeat(task.repo_key, task.lease_id))
        prepared = Prepared(task)
        try:
            if task.state == S.PREPARING:
                prepared = await self.preparer.prepare(task, repo)
                task = prepared.task
            ended = None
            if task.state == S.RUNNING:
                task, ended = await self.turns.run(task, session, prepared)
            if beat is not None and task.state not in ACTIVE_STATES:
                # The move out of the active states gave the lease back: nothing to renew.
                beat.cancel()
            if task.state == S.VERIFYING_REPLY:
                published = await self._publish(task)
                # Let the tasks this process prepares go first (bounded): the next task
                # of the repository was claimed when this one gave its lease back, and
                # its turn waits for its preparation; this verification (a Gitea read
                # and a commit) only delays this task's own ``succeeded``.
                await self.preparing.first(_VERIFY_DEFER_SECONDS)
                task = await self._verify(task, ended, published)
            return task
        finally:
            if prepared.discussion is not None and not prepared.discussion.done():
                prepared.discussion.cancel()  # the turn did not get to read it
            if beat is not None:
                beat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beat

    async def _publish(self, task: Task) -> Outcome | None:
        """Push what the agent committed in this turn (recorded; a refusal fails no
        task, the next turn's prompt says so). Drafts publish nothing."""
        if self.publisher is None or drafts.is_draft(task):
            return None
        return await self.publisher.publish(task)

    # -- verifying_reply ------------------------------------------------------------

    async def _verify(
        self,
        task: Task,
        ended: EndedTurn | None = None,
        published: Outcome | None = None,
    ) -> Task:
        """Look for the turn's answer on Gitea: found, the task succeeded; missing, one
        turn asks the agent to post it again, then the answer is posted by the bot
        itself (the fallback); unknown (Gitea cannot say), the task fails and nothing is
        posted twice. ``ended``: the turn that just ended in this run, as its row would
        say; ``published``: what publishing did after it, for the answer's note."""
        if drafts.is_draft(task):
            return await drafts.confirm(self.store, self.moves, task)
        turn: Turn | EndedTurn | None = ended or await self.store.read(
            lambda c: turn_q.last_normal(c, task.task_id)
        )
        if turn is None:
            return await self.moves.move(
                task,
                S.FAILED_REPLY,
                action="reply.fail",
                error_code="no_turn",
                fields={"reply_error": "no turn"},
            )
        result = await self.replies.verify(task, turn.turn_key)
        if result.result is Found.FOUND:
            await self._note_answer(task, result, published)
            return await self.moves.move(
                task,
                S.SUCCEEDED,
                action="reply.confirm",
                metadata={"commentId": result.comment_id},
                before=partial(
                    comment_q.record_final,
                    task=task,
                    turn_key=turn.turn_key,
                    turn_id=turn.turn_id,
                    comment_id=result.comment_id,
                ),
            )
        if result.result is Found.UNKNOWN:
            return await self.moves.move(
                task,
                S.FAILED_REPLY,
                action="reply.fail",
                error_code="reply_unknown",
                fields={"reply_error": result.detail},
            )
        return await self._missing(task, turn)

    async def _missing(self, task: Task, turn: Turn | EndedTurn) -> Task:
        """No answer on Gitea: one more turn asks the agent to post it, after that the
        bot posts the turn's last message itself."""
        if int(task.reply_attempt) == 0:
            return await self.moves.move(
                task,
                S.RETRY_WAIT,
                action="reply.retry",
                error_code="mcp_reply_missing",
                fields={
                    "reply_attempt": 1,
                    "retry_step": S.RUNNING.value,
                    "next_retry_at": utcnow(),
                    "reply_error": "mcp_reply_missing",
                },
            )
        return await self._fallback(task, turn)

    async def _note_answer(self, task: Task, found: Verification, outcome: Outcome | None) -> None:
        """The agent's answer says what happened to the work (pushed where, or refused
        why) and, with a public URL, links to the task's page."""
        blocked = egress.note(await self.store.read(lambda c: egress.refused(c, task.task_id)))
        lines = [outcome.note() if outcome is not None else None, blocked, self.replies.link(task)]
        note = "\n".join(line for line in lines if line)
        marker = parse_marker(found.body or "")
        if not note or marker is None or marker.kind is not MarkerKind.FINAL:
            return
        if await self.replies.add_note(task, found, note):
            await self.moves.audit(task, "reply.publish_note", comment_id=found.comment_id)
        else:
            await self.moves.audit(task, "reply.publish_note_failed", comment_id=found.comment_id)

    async def _fallback(self, task: Task, turn: Turn | EndedTurn) -> Task:
        text = turn.last_message or "(the agent finished without an answer text)"
        try:
            await self.replies.fallback(task, turn.turn_key, text)
        except GiteaError as exc:
            return await self.moves.move(
                task,
                S.FAILED_REPLY,
                action="reply.fail",
                error_code="rest_fallback_failed",
                fields={"reply_error": f"mcp_reply_missing; fallback: {exc}"},
            )
        check = await self.replies.verify(task, turn.turn_key)
        if check.result is not Found.FOUND:
            return await self.moves.move(
                task,
                S.FAILED_REPLY,
                action="reply.fail",
                error_code="rest_fallback_unconfirmed",
                fields={
                    "reply_error": "mcp_reply_missing; fallback posted but not found",
                },
            )
        return await self.moves.move(
            task,
            S.SUCCEEDED_WITH_REST_FALLBACK,
            action="reply.fallback",
            error_code="mcp_reply_missing",
            fields={"reply_error": "mcp_reply_missing"},
            metadata={"commentId": check.comment_id},
        )
