"""Queries of the ``transcript_entries`` table: each turn's items, in the order they
finished."""

from __future__ import annotations

from sqlalchemy import Connection, bindparam, func, select

from forgeflow.domain.records import TranscriptEntry
from forgeflow.domain.transcript import LEFT_OUT, TURN_LIMIT, Entry
from forgeflow.store import rows
from forgeflow.store.schema import transcript_entries as t
from forgeflow.store.sql import insert_ignore
from forgeflow.store.types import utcnow

_KEPT = select(func.count()).where(t.c.turn_id == bindparam("turn_id"))
_OF_TASK = (
    select(t)
    .where(t.c.task_id == bindparam("task_id"), t.c.seq > bindparam("after"))
    .order_by(t.c.seq)
    .limit(bindparam("limit"))
)
_LAST = select(func.max(t.c.seq)).where(t.c.task_id == bindparam("task_id"))


def record(conn: Connection, *, task_id: str, turn_id: str, item_id: str, entry: Entry) -> bool:
    """Keep one entry of a turn, once per item; past the turn's bound only a closing
    "left out" entry is written. True when a row went in."""
    kept = conn.execute(_KEPT, {"turn_id": turn_id}).scalar_one()
    if kept > TURN_LIMIT:
        return False
    if kept == TURN_LIMIT:
        entry, item_id = LEFT_OUT, "left-out"
    return insert_ignore(
        conn,
        t,
        {
            "task_id": task_id,
            "turn_id": turn_id,
            "item_id": item_id,
            "kind": entry.kind.value,
            "title": entry.title,
            "body": entry.body,
            "status": entry.status,
            "exit_code": entry.exit_code,
            "truncated": entry.truncated,
            "created_at": utcnow(),
        },
    )


def of_task(
    conn: Connection, task_id: str, *, after: int = 0, limit: int = 1000
) -> list[TranscriptEntry]:
    """A task's entries after ``after`` (a ``seq``), oldest first: a page asks for more."""
    params = {"task_id": task_id, "after": after, "limit": limit}
    return rows.every(TranscriptEntry, conn, _OF_TASK, params)


def last_seq(conn: Connection, task_id: str) -> int:
    """The newest entry's ``seq`` (0 without any): the task page's live marker adds it."""
    return int(conn.execute(_LAST, {"task_id": task_id}).scalar() or 0)
