"""Queries of the ``transcript_entries`` table: each turn's items, in the order they
finished."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, func, select

from forgeflow.domain.transcript import LEFT_OUT, TURN_LIMIT, Entry, EntryKind
from forgeflow.store.schema import transcript_entries as t
from forgeflow.store.sql import insert_ignore
from forgeflow.store.types import utcnow


@dataclass(frozen=True, slots=True)
class Recorded:
    """An entry as stored: where it belongs and when it was recorded."""

    seq: int
    task_id: str
    turn_id: str
    entry: Entry
    created_at: datetime


def record(conn: Connection, *, task_id: str, turn_id: str, item_id: str, entry: Entry) -> bool:
    """Keep one entry of a turn, once per item; past the turn's bound only a closing
    "left out" entry is written. True when a row went in."""
    kept = conn.execute(select(func.count()).where(t.c.turn_id == turn_id)).scalar_one()
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


def of_task(conn: Connection, task_id: str, *, after: int = 0) -> list[Recorded]:
    """A task's entries after ``after`` (a ``seq``), oldest first: a page polls for more."""
    rows = conn.execute(
        select(t).where(t.c.task_id == task_id, t.c.seq > after).order_by(t.c.seq)
    ).mappings()
    return [
        Recorded(
            r["seq"],
            r["task_id"],
            r["turn_id"],
            Entry(
                EntryKind(r["kind"]),
                r["title"],
                r["body"],
                r["status"],
                r["exit_code"],
                bool(r["truncated"]),
            ),
            r["created_at"],
        )
        for r in rows
    ]
