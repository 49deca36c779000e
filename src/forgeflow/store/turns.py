"""Queries of the ``turns`` table and the session's thread binding."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert, select, update

from forgeflow.store import audit
from forgeflow.store.schema import sessions, tasks, turns
from forgeflow.store.types import utcnow


def begin(conn: Connection, *, turn_key: str, task_id: str, thread_id: str, kind: str) -> None:
    """The intent of a turn, written before ``turn/start`` is sent."""
    conn.execute(
        insert(turns).values(
            turn_key=turn_key,
            task_id=task_id,
            thread_id=thread_id,
            kind=kind,
            status="starting",
            event_seq=0,
        )
    )
    conn.execute(
        update(tasks).where(tasks.c.task_id == task_id).values(turn_count=tasks.c.turn_count + 1)
    )
    audit.append(
        conn,
        audit.AuditEvent(
            action="turn.intent",
            task_id=task_id,
            metadata={"turnKey": turn_key, "kind": kind, "threadId": thread_id},
        ),
    )


def started(
    conn: Connection, *, turn_key: str, turn_id: str, task_id: str, session_key: str
) -> None:
    conn.execute(
        update(turns)
        .where(turns.c.turn_key == turn_key)
        .values(turn_id=turn_id, status="started", started_at=utcnow())
    )
    thread_id = conn.execute(
        select(turns.c.thread_id).where(turns.c.turn_key == turn_key)
    ).scalar_one()
    conn.execute(
        update(tasks).where(tasks.c.task_id == task_id).values(turn_id=turn_id, thread_id=thread_id)
    )
    conn.execute(
        update(sessions)
        .where(sessions.c.session_key == session_key)
        .values(last_turn_id=turn_id, last_task_id=task_id, updated_at=utcnow())
    )
    audit.append(
        conn,
        audit.AuditEvent(
            action="turn.start",
            task_id=task_id,
            session_key=session_key,
            turn_id=turn_id,
            metadata={"turnKey": turn_key},
        ),
    )


def event_seen(conn: Connection, turn_key: str, seq: int) -> bool:
    """Advance ``eventSeq``; False when ``seq`` was already handled (a duplicate)."""
    result = conn.execute(
        update(turns)
        .where(turns.c.turn_key == turn_key)
        .where(turns.c.event_seq < seq)
        .values(event_seq=seq)
    )
    return result.rowcount == 1


def add_tokens(
    conn: Connection, turn_key: str, task_id: str, input_tokens: int, output_tokens: int
) -> int:
    """Set the turn's running totals; returns how many tokens this call added."""
    before = conn.execute(
        select(turns.c.input_tokens + turns.c.output_tokens).where(turns.c.turn_key == turn_key)
    ).scalar_one()
    conn.execute(
        update(turns)
        .where(turns.c.turn_key == turn_key)
        .values(input_tokens=input_tokens, output_tokens=output_tokens)
    )
    total_in, total_out = _totals(conn, task_id)
    conn.execute(
        update(tasks)
        .where(tasks.c.task_id == task_id)
        .values(input_tokens=total_in, output_tokens=total_out)
    )
    return input_tokens + output_tokens - int(before)


def _totals(conn: Connection, task_id: str) -> tuple[int, int]:
    from sqlalchemy import func

    row = conn.execute(
        select(
            func.coalesce(func.sum(turns.c.input_tokens), 0),
            func.coalesce(func.sum(turns.c.output_tokens), 0),
        ).where(turns.c.task_id == task_id)
    ).one()
    return int(row[0]), int(row[1])


def finish(conn: Connection, turn_key: str, status: str, last_message: str | None) -> None:
    conn.execute(
        update(turns)
        .where(turns.c.turn_key == turn_key)
        .values(status=status, completed_at=utcnow(), last_message=last_message)
    )


def last_normal(conn: Connection, task_id: str) -> dict[str, Any] | None:
    row = conn.execute(
        select(turns)
        .where(turns.c.task_id == task_id)
        .where(turns.c.kind == "normal")
        .order_by(turns.c.turn_key.desc())
    ).first()
    return dict(row._mapping) if row else None


def bind_thread(
    conn: Connection,
    session_key: str,
    thread_id: str,
    *,
    task_id: str,
    resumed: bool,
    at: datetime | None = None,
) -> None:
    row = conn.execute(
        select(sessions.c.thread_id, sessions.c.version).where(
            sessions.c.session_key == session_key
        )
    ).one()
    if row.thread_id == thread_id:
        action = "session.thread_resume" if resumed else "session.thread_reuse"
    else:
        conn.execute(
            update(sessions)
            .where(sessions.c.session_key == session_key)
            .values(thread_id=thread_id, version=row.version + 1, updated_at=utcnow())
        )
        action = "session.thread_replace" if row.thread_id else "session.thread_start"
    audit.append(
        conn,
        audit.AuditEvent(
            action=action,
            task_id=task_id,
            session_key=session_key,
            metadata={"threadId": thread_id, "previousThreadId": row.thread_id},
            at=at,
        ),
    )
