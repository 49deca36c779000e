"""Queries of the ``turns`` table and the session's thread binding."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, bindparam, func, select, update

from forgeflow.domain.records import Turn
from forgeflow.store import audit, rows, sql
from forgeflow.store.schema import sessions, tasks, turns
from forgeflow.store.sql import insert_row
from forgeflow.store.types import utcnow

# Built once: a turn's start and its events write these.
_TURN = turns.c.turn_key == bindparam("b_turn_key")
_COUNT_TURN = (
    update(tasks)
    .where(tasks.c.task_id == bindparam("b_task_id"))
    .values(turn_count=tasks.c.turn_count + 1)
)
_TURN_STARTED = update(turns).where(_TURN)
_THREAD_OF_TURN = select(turns.c.thread_id).where(_TURN)
_TASK_TURN = update(tasks).where(tasks.c.task_id == bindparam("b_task_id"))
_SESSION_TURN = update(sessions).where(sessions.c.session_key == bindparam("b_session_key"))
_EVENT_SEEN = (
    update(turns)
    .where(_TURN)
    .where(turns.c.event_seq < bindparam("b_seq"))
    .values(event_seq=bindparam("b_seq"))
)
_TURN_TOKENS = select((turns.c.input_tokens + turns.c.output_tokens).label("tokens")).where(_TURN)
_SET_TURN_TOKENS = update(turns).where(_TURN)
_TASK_TOKENS = select(
    func.coalesce(func.sum(turns.c.input_tokens), 0).label("input"),
    func.coalesce(func.sum(turns.c.output_tokens), 0).label("output"),
    func.coalesce(func.sum(turns.c.cached_input_tokens), 0).label("cached"),
).where(turns.c.task_id == bindparam("b_task_id"))
_SET_TASK_TOKENS = update(tasks).where(tasks.c.task_id == bindparam("b_task_id"))
_TURN_FINISHED = update(turns).where(_TURN)
_SESSION_THREAD = select(sessions.c.thread_id, sessions.c.version).where(
    sessions.c.session_key == bindparam("b_session_key")
)


def begin(conn: Connection, *, turn_key: str, task_id: str, thread_id: str, kind: str) -> None:
    """The intent of a turn, written before ``turn/start`` is sent."""
    insert_row(
        conn,
        turns,
        {
            "turn_key": turn_key,
            "task_id": task_id,
            "thread_id": thread_id,
            "kind": kind,
            "status": "starting",
            "event_seq": 0,
        },
    )
    sql.execute(conn, _COUNT_TURN, {"b_task_id": task_id})
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
    now = utcnow()
    sql.execute(
        conn,
        _TURN_STARTED,
        {"b_turn_key": turn_key, "turn_id": turn_id, "status": "started", "started_at": now},
    )
    thread_id = sql.scalar(conn, _THREAD_OF_TURN, {"b_turn_key": turn_key})
    sql.execute(
        conn, _TASK_TURN, {"b_task_id": task_id, "turn_id": turn_id, "thread_id": thread_id}
    )
    sql.execute(
        conn,
        _SESSION_TURN,
        {
            "b_session_key": session_key,
            "last_turn_id": turn_id,
            "last_task_id": task_id,
            "updated_at": now,
        },
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
    return sql.execute(conn, _EVENT_SEEN, {"b_turn_key": turn_key, "b_seq": seq}) == 1


def add_tokens(
    conn: Connection,
    turn_key: str,
    task_id: str,
    input_tokens: int,
    output_tokens: int,
    *,
    cached_input_tokens: int = 0,
) -> int:
    """Set the turn's running totals; returns how many tokens this call added (the
    cached input is a part of the input: it adds nothing to the budgets' count)."""
    before = sql.scalar(conn, _TURN_TOKENS, {"b_turn_key": turn_key})
    sql.execute(
        conn,
        _SET_TURN_TOKENS,
        {
            "b_turn_key": turn_key,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cached_input_tokens": cached_input_tokens,
        },
    )
    totals = sql.first(conn, _TASK_TOKENS, {"b_task_id": task_id})
    assert totals is not None
    sql.execute(
        conn,
        _SET_TASK_TOKENS,
        {
            "b_task_id": task_id,
            "input_tokens": int(totals["input"]),
            "output_tokens": int(totals["output"]),
            "cached_input_tokens": int(totals["cached"]),
        },
    )
    return input_tokens + output_tokens - int(before)


def finish(conn: Connection, turn_key: str, status: str, last_message: str | None) -> None:
    sql.execute(
        conn,
        _TURN_FINISHED,
        {
            "b_turn_key": turn_key,
            "status": status,
            "completed_at": utcnow(),
            "last_message": last_message,
        },
    )


def last_normal(conn: Connection, task_id: str) -> Turn | None:
    stmt = (
        select(turns)
        .where(turns.c.task_id == task_id)
        .where(turns.c.kind == "normal")
        .order_by(turns.c.turn_key.desc())
    )
    return rows.first(Turn, conn, stmt, {})


def of_task(conn: Connection, task_id: str) -> list[Turn]:
    """The turns of a task, in the order they started."""
    stmt = select(turns).where(turns.c.task_id == task_id).order_by(turns.c.turn_key)
    return rows.every(Turn, conn, stmt, {})


def bind_thread(
    conn: Connection,
    session_key: str,
    thread_id: str,
    *,
    task_id: str,
    resumed: bool,
    at: datetime | None = None,
) -> None:
    row = sql.first(conn, _SESSION_THREAD, {"b_session_key": session_key})
    if row is None:
        raise KeyError(session_key)
    if row["thread_id"] == thread_id:
        action = "session.thread_resume" if resumed else "session.thread_reuse"
    else:
        conn.execute(
            update(sessions)
            .where(sessions.c.session_key == session_key)
            .values(thread_id=thread_id, version=row["version"] + 1, updated_at=utcnow())
        )
        action = "session.thread_replace" if row["thread_id"] else "session.thread_start"
    audit.append(
        conn,
        audit.AuditEvent(
            action=action,
            task_id=task_id,
            session_key=session_key,
            metadata={"threadId": thread_id, "previousThreadId": row["thread_id"]},
            at=at,
        ),
    )
