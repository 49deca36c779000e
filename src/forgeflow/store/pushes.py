"""Queries of the ``pushes`` table: each push of a session branch, as an intent before
``git push`` and a result after, so a crash in between neither loses nor repeats it."""

from __future__ import annotations

from sqlalchemy import Connection, bindparam, select, update

from forgeflow.domain.bookkeeping import (
    Push as Push,  # re-exported: the store's callers name it here
)
from forgeflow.store import rows
from forgeflow.store.bookkeeping_schema import pushes
from forgeflow.store.sql import insert_ignore
from forgeflow.store.types import utcnow

PENDING = "pending"
PUSHED = "pushed"
REFUSED = "refused"


_BY_KEY = select(pushes).where(pushes.c.push_key == bindparam("key"))


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
    found = rows.first(Push, conn, _BY_KEY, {"key": key})
    assert found is not None  # written just now, or already there
    return found


def finish(conn: Connection, push_key: str, status: str, error: str | None = None) -> None:
    conn.execute(
        update(pushes)
        .where(pushes.c.push_key == push_key)
        .values(status=status, error=error, updated_at=utcnow())
    )


def pending(conn: Connection, task_id: str) -> list[Push]:
    stmt = select(pushes).where(pushes.c.task_id == task_id, pushes.c.status == PENDING)
    return rows.every(Push, conn, stmt, {})


def last(conn: Connection, session_key: str) -> Push | None:
    """The session's latest push, for the next turn's prompt."""
    stmt = (
        select(pushes)
        .where(pushes.c.session_key == session_key)
        .order_by(pushes.c.created_at.desc(), pushes.c.push_key.desc())
        .limit(1)
    )
    return rows.first(Push, conn, stmt, {})


def of_task(conn: Connection, task_id: str) -> list[Push]:
    stmt = select(pushes).where(pushes.c.task_id == task_id).order_by(pushes.c.created_at)
    return rows.every(Push, conn, stmt, {})
