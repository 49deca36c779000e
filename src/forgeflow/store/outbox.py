"""Comments owed to users: receipts of live tasks and results of ended ones."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Select, and_, or_, select, update

from forgeflow.domain.admission import ANSWERED
from forgeflow.domain.bookkeeping import Comment
from forgeflow.domain.environment import ENVIRONMENT_SETUP_FAILED
from forgeflow.domain.ids import sha256_ref
from forgeflow.domain.modes import DRAFT_MODES
from forgeflow.domain.records import Task
from forgeflow.domain.states import (
    LIVE_STATES,
    RESULT_STATES,
    TERMINAL_STATES,
    TaskState,
    values,
)
from forgeflow.store import comments as comment_q
from forgeflow.store import rows
from forgeflow.store.bookkeeping_schema import comments, pushes
from forgeflow.store.comments import CONFIRMED, PENDING, SENT, SKIPPED
from forgeflow.store.schema import tasks
from forgeflow.store.sql import insert_ignore
from forgeflow.store.types import utcnow


def _owed_query(suffix: str, states: tuple[str, ...], limit: int) -> Select[Any]:
    c = comments.alias("c")
    return (
        select(tasks)
        .outerjoin(c, c.c.comment_key == tasks.c.task_id + suffix)
        .where(tasks.c.state.in_(states))
        # Draft tasks (review/plan spaces) owe nobody a comment: they post nothing.
        .where(or_(tasks.c.mode.is_(None), tasks.c.mode.not_in(sorted(DRAFT_MODES))))
        .where(or_(c.c.comment_key.is_(None), and_(c.c.status.not_in((SENT, CONFIRMED, SKIPPED)))))
        .order_by(tasks.c.created_at)
        .limit(limit)
    )


# Built once: the outbox asks after every claim round, and building a join like these
# per call cost more CPU than SQLite spent answering it.
_RECEIPTS_OWED = _owed_query(":receipt", values(LIVE_STATES), 100)
_RESULTS_OWED = _owed_query(":result", values(RESULT_STATES | {TaskState.REJECTED}), 100)
_COMMAND_REPLIES_OWED = (
    select(comments)
    .where(comments.c.kind == "status")
    .where(comments.c.status.not_in((SENT, CONFIRMED)))
    .order_by(comments.c.created_at)
    .limit(100)
)


def receipts_owed(conn: Connection) -> list[Task]:
    return rows.every(Task, conn, _RECEIPTS_OWED, {})


def results_owed(conn: Connection) -> list[Task]:
    owed = rows.every(Task, conn, _RESULTS_OWED, {})
    # A rejected mention is answered only when a budget or its options refused it; an
    # unauthorised commenter gets no reply from the bot.
    return [t for t in owed if t.state != TaskState.REJECTED or t.error_code in ANSWERED]


def command_replies_owed(conn: Connection) -> list[Comment]:
    """Answers to ``@bot status`` that are written but not posted yet."""
    return rows.every(Comment, conn, _COMMAND_REPLIES_OWED, {})


@dataclass(frozen=True, slots=True)
class Owed:
    receipts: list[Task]
    command_replies: list[Comment]
    results: list[Task]
    tracking: list[Task]


def owed(conn: Connection) -> Owed:
    """Everything the outbox may have to post or edit, in one read."""
    return Owed(
        receipts_owed(conn), command_replies_owed(conn), results_owed(conn), tracking_owed(conn)
    )


def result_text(task: Task) -> str:
    state = task.state
    if state == TaskState.CANCELLED:
        return "任务已取消 / the task was cancelled by an operator."
    if state == TaskState.ABORTED:
        return "任务已中止 / the task was aborted by an operator."
    if state == TaskState.REJECTED:
        return f"任务被拒绝 / the task was not started: {task.execution_error}."
    if state == TaskState.FAILED_REPLY:
        return (
            "回复未能确认 / the answer could not be confirmed on Gitea "
            f"({task.error_code or 'reply_unknown'}); nothing was re-posted."
        )
    if task.error_code == "budget_exceeded" and task.execution_error:
        return f"任务失败 / the task was stopped: {task.execution_error}."
    if task.error_code == ENVIRONMENT_SETUP_FAILED and task.execution_error:
        # The build's or setup's log (redacted when kept), its tail, fenced: the output
        # is the repository's to choose, so the fence is longer than any run of tildes
        # in it (a line of as many would close it, and markdown after it would be the
        # bot's: mentions, links, images).
        body = task.execution_error
        fence = "~" * max(4, 1 + max((len(run) for run in re.findall(r"~+", body)), default=0))
        return (
            f"任务失败 / the task failed ({ENVIRONMENT_SETUP_FAILED}): the repository's "
            f"environment could not be made ready. The log's end:\n\n{fence}\n{body}\n{fence}"
        )
    return f"任务失败 / the task failed ({task.error_code or 'failed'})."


def skip_result(conn: Connection, task: Task) -> None:
    """Record that a task's result comment is not owed (its answer is on Gitea)."""
    key = f"{task.task_id}:result"
    comment_q.record_intent(
        conn,
        comment_key=key,
        task_id=task.task_id,
        kind="result",
        resource_key=task.resource_key,
        turn_key=None,
        body_hash="",
    )
    comment_q.record_result(
        conn, key, status=SKIPPED, comment_id=None, how="answer_already_on_gitea"
    )


# -- the receipt as a tracking comment ------------------------------------------------
# One row per task, ``<task>:tracking`` (kind "tracking"): the receipt's comment id, the
# last body sent (an edit is a PATCH of the whole body, so "last sent" is the record and
# a crash before it just sends the same or a later body again), ``turn_key`` the task
# state that body described, and status PENDING until the final edit, CONFIRMED after
# it: nothing is sent once the final is recorded.
TRACKING = "tracking"
_TRACKED_STATES = values(TERMINAL_STATES | {TaskState.WAITING_USER})


def tracking(conn: Connection, task_id: str) -> Comment | None:
    return comment_q.get(conn, f"{task_id}:tracking")


def receipt_id(conn: Connection, task_id: str) -> int | None:
    """The receipt's comment id once it is posted (None before)."""
    row = comment_q.get(conn, f"{task_id}:receipt")
    return row.comment_id if row is not None and row.status in (SENT, CONFIRMED) else None


def note_tracking(
    conn: Connection, task: Task, *, comment_id: int, body: str, state: str, final: bool
) -> bool:
    """Record an edit sent; False (and nothing written) when the final one already was."""
    key = f"{task.task_id}:tracking"
    now = utcnow()
    insert_ignore(
        conn,
        comments,
        {
            "comment_key": key,
            "task_id": task.task_id,
            "kind": TRACKING,
            "resource_key": task.resource_key,
            "comment_id": comment_id,
            "status": PENDING,
            "created_at": now,
            "updated_at": now,
        },
    )
    done = conn.execute(
        update(comments)
        .where(comments.c.comment_key == key)
        .where(comments.c.status == PENDING)
        .values(
            body=body,
            body_hash=sha256_ref(body.encode()),
            turn_key=state,
            status=CONFIRMED if final else PENDING,
            updated_at=now,
        )
    )
    return done.rowcount == 1


_TRACKING_OWED = (
    select(tasks)
    .join(comments, comments.c.comment_key == tasks.c.task_id + ":tracking")
    .where(comments.c.status == PENDING)
    .where(tasks.c.state.in_(_TRACKED_STATES))
    .where(or_(comments.c.turn_key.is_(None), comments.c.turn_key != tasks.c.state))
    .order_by(tasks.c.updated_at)
    .limit(100)
)


def tracking_owed(conn: Connection) -> list[Task]:
    """Tasks whose receipt still shows a state they left: an ended task's final edit,
    a waiting task's "waiting for you" (only for receipts that were tracked)."""
    return rows.every(Task, conn, _TRACKING_OWED, {})


def pushed_branches(conn: Connection, task_id: str) -> list[str]:
    stmt = (
        select(pushes.c.target)
        .where(pushes.c.task_id == task_id)
        .where(pushes.c.status == "pushed")
        .distinct()
    )
    return [str(r[0]) for r in conn.execute(stmt)][:5]
