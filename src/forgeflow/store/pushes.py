"""Queries of the ``pushes`` table: each push of a session branch, as an intent before
``git push`` and a result after, so a crash in between neither loses nor repeats it."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, select, update

from forgeflow.store.schema import pushes
from forgeflow.store.sql import insert_ignore
from forgeflow.store.types import utcnow

PENDING = "pending"
PUSHED = "pushed"
REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class Push:
    push_key: str
    task_id: str
    session_key: str
    target: str
    old_sha: str | None
    new_sha: str
    status: str
    error: str | None


def _push(row: object) -> Push:
    m = row._mapping  # type: ignore[attr-defined]
    return Push(
        m["push_key"],
        m["task_id"],
        m["session_key"],
        m["target"],
        m["old_sha"],
        m["new_sha"],
        m["status"],
        m["error"],
    )


def intend(
    conn: Connection,
    *,
    task_id: str,
    session_key: str,
    target: str,
    old_sha: str | None,
    new_sha: str,
) -> Push:
    """The intent, written before the push; the row already there when it was."""
    key = f"{session_key}@{new_sha}"
    now = utcnow()
    insert_ignore(
        conn,
        pushes,
        {
            "push_key": key,
            "task_id": task_id,
            "session_key": session_key,
            "target": target,
            "old_sha": old_sha,
            "new_sha": new_sha,
            "status": PENDING,
            "error": None,
            "created_at": now,
            "updated_at": now,
        },
    )
    row = conn.execute(select(pushes).where(pushes.c.push_key == key)).one()
    return _push(row)


def finish(conn: Connection, push_key: str, status: str, error: str | None = None) -> None:
    conn.execute(
        update(pushes)
        .where(pushes.c.push_key == push_key)
        .values(status=status, error=error, updated_at=utcnow())
    )


def pending(conn: Connection, task_id: str) -> list[Push]:
    rows = conn.execute(
        select(pushes).where(pushes.c.task_id == task_id, pushes.c.status == PENDING)
    )
    return [_push(r) for r in rows]


def last(conn: Connection, session_key: str) -> Push | None:
    """The session's latest push, for the next turn's prompt."""
    row = conn.execute(
        select(pushes)
        .where(pushes.c.session_key == session_key)
        .order_by(pushes.c.created_at.desc(), pushes.c.push_key.desc())
        .limit(1)
    ).first()
    return _push(row) if row is not None else None


def of_task(conn: Connection, task_id: str) -> list[Push]:
    rows = conn.execute(
        select(pushes).where(pushes.c.task_id == task_id).order_by(pushes.c.created_at)
    )
    return [_push(r) for r in rows]
