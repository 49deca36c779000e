"""Queries of the ``comments`` table: intents and results of every bot comment."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, select, update

from forgeflow.domain.bookkeeping import Comment
from forgeflow.domain.records import Task
from forgeflow.store import audit, rows, sql
from forgeflow.store.bookkeeping_schema import comments
from forgeflow.store.schema import tasks
from forgeflow.store.sql import insert_ignore
from forgeflow.store.types import utcnow

PENDING = "pending"
SENT = "sent"
CONFIRMED = "confirmed"
FAILED = "failed"
SKIPPED = "skipped"  # a result comment that is not owed after all

# The agent's own comments through its Gitea tools (tasks/tool_comments.py): one row
# per text it posts in a task, one per text it sets on a comment it posted.
TOOL_POST = "tool_post"
TOOL_EDIT = "tool_edit"


def _digest(body: str) -> str:
    # 24 hex characters keep the key within its column with any task id (<= 64).
    return hashlib.sha256(body.encode()).hexdigest()[:24]


def tool_post_key(task_id: str, body: str) -> str:
    """A text the agent posts is posted once per task: a retried turn that posts it
    again finds this row (and, while it is pending, looks in Gitea first)."""
    return f"{task_id}:tool:{_digest(body)}"


def tool_edit_key(task_id: str, comment_id: int, body: str) -> str:
    return f"{task_id}:edit:{int(comment_id)}:{_digest(body)}"


def record_final(
    conn: Connection,
    task: Task,
    *,
    turn_key: str,
    turn_id: str | None,
    comment_id: int | None,
) -> None:
    """The agent's final comment, found by the verifier (it was posted through MCP)."""
    now = utcnow()
    insert_ignore(
        conn,
        comments,
        {
            "comment_key": f"{task.task_id}:final:{turn_key}",
            "task_id": task.task_id,
            "kind": "mcp_final",
            "resource_key": task.resource_key,
            "turn_key": turn_key,
            "turn_id": turn_id,
            "comment_id": comment_id,
            "status": CONFIRMED,
            "created_at": now,
            "updated_at": now,
        },
    )
    audit.append(
        conn,
        audit.AuditEvent(
            action="reply.found",
            task_id=task.task_id,
            turn_id=turn_id,
            comment_id=comment_id,
            metadata={"turnKey": turn_key},
        ),
    )


def take_over(conn: Connection, comment_key: str, *, stale_before: Any) -> bool:
    """Claim a pending intent whose poster went quiet; False when someone still has it."""
    result = conn.execute(
        update(comments)
        .where(comments.c.comment_key == comment_key)
        .where(comments.c.status == PENDING)
        .where(comments.c.updated_at < stale_before)
        .values(updated_at=utcnow())
    )
    return result.rowcount == 1


def record_intent(
    conn: Connection,
    *,
    comment_key: str,
    task_id: str,
    kind: str,
    resource_key: str,
    turn_key: str | None,
    body_hash: str,
    body: str | None = None,
    age: timedelta | None = None,
) -> tuple[bool, Comment]:
    """Write the intent once (audited); return whether this call wrote it, and the row.

    ``body`` keeps the text for an outbox to post later; ``age`` backdates the intent so
    the first poster may claim it at once.
    """
    now = utcnow() - (age or timedelta(0))
    inserted = insert_ignore(
        conn,
        comments,
        {
            "comment_key": comment_key,
            "task_id": task_id,
            "kind": kind,
            "resource_key": resource_key,
            "turn_key": turn_key,
            "body_hash": body_hash,
            "body": body,
            "status": PENDING,
            "created_at": now,
            "updated_at": now,
        },
    )
    if inserted:
        audit.append(
            conn,
            audit.AuditEvent(
                action="comment.intent",
                task_id=task_id,
                metadata={"commentKey": comment_key, "kind": kind},
            ),
        )
    row = get(conn, comment_key)
    assert row is not None
    return inserted, row


def record_result(
    conn: Connection,
    comment_key: str,
    *,
    status: str,
    comment_id: int | None,
    turn_id: str | None = None,
    error: str | None = None,
    how: str = "posted",
    age: timedelta | None = None,
    at: datetime | None = None,
) -> None:
    """``at``: when the result was known, if it is written later (else now)."""
    row = get(conn, comment_key)
    assert row is not None
    # ``age`` backdates the row so the next poster may take the intent over at once.
    sql.execute(
        conn,
        _SET_RESULT,
        {
            "b_key": comment_key,
            "status": status,
            "comment_id": comment_id,
            "turn_id": turn_id or row.turn_id,
            "updated_at": (at or utcnow()) - (age or timedelta(0)),
        },
    )
    audit.append(
        conn,
        audit.AuditEvent(
            action="comment.result",
            task_id=row.task_id,
            comment_id=comment_id,
            turn_id=turn_id,
            error_code=None if status != FAILED else "comment_failed",
            metadata={
                "commentKey": comment_key,
                "kind": row.kind,
                "status": status,
                "how": how,
                "error": error,
            },
            at=at,
        ),
    )


_GET = select(comments).where(comments.c.comment_key == bindparam("b_key"))
_SET_RESULT = update(comments).where(comments.c.comment_key == bindparam("b_key"))


def get(conn: Connection, comment_key: str) -> Comment | None:
    return rows.first(Comment, conn, _GET, {"b_key": comment_key})


_SESSION_POSTS = (
    select(comments)
    .join(tasks, tasks.c.task_id == comments.c.task_id)
    .where(tasks.c.session_key == bindparam("b_session"))
    .where(comments.c.kind == TOOL_POST)
)


def posted_in_session(conn: Connection, session_key: str, comment_id: int) -> bool:
    """Whether the agent posted comment ``comment_id`` through its tools in one of the
    session's tasks (edit_comment's rule)."""
    stmt = (
        _SESSION_POSTS.where(comments.c.comment_id == bindparam("b_id"))
        .where(comments.c.status == SENT)
        .limit(1)
    )
    found = rows.first(Comment, conn, stmt, {"b_session": session_key, "b_id": comment_id})
    return found is not None


def pending_posts_in_session(conn: Connection, session_key: str) -> list[Comment]:
    """The session's tool comments whose POST may or may not have landed."""
    stmt = _SESSION_POSTS.where(comments.c.status == PENDING).order_by(comments.c.created_at)
    return rows.every(Comment, conn, stmt, {"b_session": session_key})
