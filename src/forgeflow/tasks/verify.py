"""The ``verifying_reply`` step of a task, and the rule for a missing reply.

A turn's answer is a comment the agent posts, ending with the turn's marker.
Verification looks in Gitea for exactly one comment of the bot carrying it: found, the
task succeeded (and the answer gets forgeflow's note: where the work went); unknown
(Gitea cannot say, or two comments carry it), the task fails and nothing is posted
twice; missing, the missing-reply rule: one more turn (a reply retry) asks the agent
to post the answer it gave, and when it is missing after that, the bot posts the turn's
last message itself (the REST fallback). The same look tells whether an interrupted
turn's answer reached Gitea before the interruption (then it is the answer: no second
turn). A draft (review/plan) task posts nothing: its answer is its turn's last message.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import partial

from forgeflow.domain.ids import turn_key
from forgeflow.domain.markers import MarkerKind, parse_marker
from forgeflow.domain.records import Task, Turn
from forgeflow.domain.states import TaskState
from forgeflow.gitea.client import GiteaError
from forgeflow.store import Store
from forgeflow.store import comments as comment_q
from forgeflow.store import turns as turn_q
from forgeflow.store.types import utcnow
from forgeflow.tasks import drafts, egress, lost
from forgeflow.tasks.moves import TaskMoves
from forgeflow.tasks.publish import Outcome
from forgeflow.tasks.replies import Replies
from forgeflow.tasks.reviews import PullReviews, is_review

S = TaskState
_ANSWERS = frozenset({MarkerKind.FINAL, MarkerKind.FALLBACK})


class Found(StrEnum):
    FOUND = "found"
    MISSING = "missing"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Verification:
    result: Found
    comment_id: int | None = None
    detail: str | None = None
    body: str | None = None


@dataclass(frozen=True, slots=True)
class EndedTurn:
    """A normal turn that just ended in this run, as far as verification needs it."""

    turn_key: str
    turn_id: str | None
    last_message: str | None


async def look(replies: Replies, task: Task, turn: str) -> Verification:
    """Look for the final (or fallback) comment of ``turn``: exactly one must carry
    its marker for the task to succeed."""
    try:
        found = await replies.marked(task, _ANSWERS, turn)
    except GiteaError as exc:
        return Verification(Found.UNKNOWN, detail=f"comment query failed: {exc}")
    if len(found) == 1:
        return Verification(Found.FOUND, found[0].id, body=found[0].body)
    if len(found) > 1:
        return Verification(
            Found.UNKNOWN, detail=f"{len(found)} comments carry the marker of {turn}"
        )
    return Verification(Found.MISSING)


async def answered(replies: Replies, task: Task) -> bool:
    """Whether any answer of the task (a final or fallback of any turn) is on Gitea."""
    return bool(await replies.marked(task, _ANSWERS, None))


def is_reply_retry(task: Task) -> bool:
    """The missing-reply rule's one more turn: the task resumes at its turn after a
    verification found no answer."""
    return task.retry_step == S.RUNNING and int(task.reply_attempt) > 0


class Verifier:
    def __init__(
        self, store: Store, replies: Replies, moves: TaskMoves, reviews: PullReviews | None = None
    ) -> None:
        self.reviews = reviews  # a pull request review task's one review (tasks/reviews.py)
        self.store = store
        self.replies = replies
        self.moves = moves

    async def verify(
        self, task: Task, ended: EndedTurn | None = None, published: Outcome | None = None
    ) -> Task:
        """Move a ``verifying_reply`` task on by what Gitea has of its answer.
        ``ended``: the turn that just ended in this run, as its row would say (else it
        is read); ``published``: what publishing did after it, for the answer's note."""
        if drafts.is_draft(task):
            return await self._draft(task)
        if self.reviews is not None and is_review(task):
            last = await self._last_normal(task)
            return await self.reviews.verify(task, self.moves, last.last_message if last else None)
        turn: Turn | EndedTurn | None = ended or await self._last_normal(task)
        if turn is None:
            return await self._fail(task, "no_turn", "no turn")
        result = await look(self.replies, task, turn.turn_key)
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
            return await self._fail(task, "reply_unknown", result.detail)
        return await self._missing(task, turn)

    # -- the missing-reply rule -------------------------------------------------------

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

    async def answer_of(self, task: Task) -> str | None:
        """For a reply retry, the turn whose answer the agent is asked to post (the
        last normal turn; its marker names that turn); None for a normal turn."""
        if not is_reply_retry(task):
            return None
        normal = await self._last_normal(task)
        return normal.turn_key if normal else turn_key(task.task_id, int(task.turn_count) + 1)

    async def answered_before(self, task: Task) -> Task | None:
        """A turn of this task ran before and was interrupted: if its answer reached
        Gitea before the interruption, it is the answer (the task moves to verification,
        no second turn); None: run the turn."""
        if drafts.is_draft(task) or is_reply_retry(task) or int(task.turn_count) == 0:
            return None
        if is_review(task):
            return await self._reviewed_before(task)
        last = await self._last_normal(task)
        if last is None:
            return None
        found = await look(self.replies, task, last.turn_key)
        if found.result is not Found.FOUND:
            return None
        await self.moves.audit(
            task,
            "turn.skipped_answer_exists",
            comment_id=found.comment_id,
            metadata={"turnKey": last.turn_key},
        )
        return await self.moves.move(
            task,
            S.VERIFYING_REPLY,
            action="task.verify",
            fields={"turn_id": last.turn_id, "retry_step": None},
        )

    async def _reviewed_before(self, task: Task) -> Task | None:
        """A review task's earlier turn submitted its review (it may have reached Gitea
        just before a crash): that is the answer, no second turn."""
        if self.reviews is None:
            return None
        try:
            review_id = await self.reviews.posted(task)
        except GiteaError:
            return None  # the turn runs; its submit_review settles the intent again
        if review_id is None:
            return None
        await self.moves.audit(task, "turn.skipped_answer_exists", metadata={"reviewId": review_id})
        return await self.moves.move(task, S.VERIFYING_REPLY, action="task.verify")

    async def _fail(self, task: Task, code: str, why: str | None) -> Task:
        """The answer cannot be verified: ``failed_reply`` with its code and reason."""
        return await self.moves.move(
            task, S.FAILED_REPLY, action="reply.fail", error_code=code, fields={"reply_error": why}
        )

    async def _fallback(self, task: Task, turn: Turn | EndedTurn) -> Task:
        text = turn.last_message or "(the agent finished without an answer text)"
        try:
            await self.replies.fallback(task, turn.turn_key, text)
        except GiteaError as exc:
            return await self._fail(
                task, "rest_fallback_failed", f"mcp_reply_missing; fallback: {exc}"
            )
        check = await look(self.replies, task, turn.turn_key)
        if check.result is not Found.FOUND:
            return await self._fail(
                task,
                "rest_fallback_unconfirmed",
                "mcp_reply_missing; fallback posted but not found",
            )
        return await self.moves.move(
            task,
            S.SUCCEEDED_WITH_REST_FALLBACK,
            action="reply.fallback",
            error_code="mcp_reply_missing",
            fields={"reply_error": "mcp_reply_missing"},
            metadata={"commentId": check.comment_id},
        )

    # -- what the answer says ---------------------------------------------------------

    async def _note_answer(self, task: Task, found: Verification, outcome: Outcome | None) -> None:
        """The agent's answer says what happened to the work (pushed where, or refused
        why) and, with a public URL, links to the task's page."""
        blocked = egress.note(await self.store.read(lambda c: egress.refused(c, task.task_id)))
        gone = await self.store.read(lambda c: lost.note(c, task.task_id))
        said = outcome.note() if outcome is not None else None
        lines = [gone, said, blocked, self.replies.link(task)]
        note = "\n".join(line for line in lines if line)
        marker = parse_marker(found.body or "")
        if not note or marker is None or marker.kind is not MarkerKind.FINAL:
            return
        if await self.replies.add_note(task, found.comment_id, found.body or "", note):
            await self.moves.audit(task, "reply.publish_note", comment_id=found.comment_id)
        else:
            await self.moves.audit(task, "reply.publish_note_failed", comment_id=found.comment_id)

    async def _draft(self, task: Task) -> Task:
        """A draft's verification: the last turn's final message is the answer."""
        turn = await self._last_normal(task)
        text = (turn.last_message if turn else None) or ""
        if not text.strip():
            return await self.moves.move(
                task,
                S.FAILED_REPLY,
                action="draft.fail",
                error_code="draft_empty",
                fields={"reply_error": "the turn ended without a final message"},
            )
        assert turn is not None
        return await self.moves.move(
            task,
            S.SUCCEEDED,
            action="draft.record",
            metadata={"mode": task.mode, "turnKey": turn.turn_key, "chars": len(text)},
        )

    async def _last_normal(self, task: Task) -> Turn | None:
        return await self.store.read(lambda c: turn_q.last_normal(c, task.task_id))
