"""Queries of the ``session_threads`` table: each session's Codex thread as the last
turn left it, readable by every worker (issue #27)."""

from __future__ import annotations

from sqlalchemy import Connection, bindparam, delete, select

from forgeflow.domain.rollout import KEPT, NotKept, Rollout, check
from forgeflow.store import sql
from forgeflow.store.schema import session_threads as t
from forgeflow.store.types import utcnow

_ROW = select(t).where(t.c.session_key == bindparam("b_key"))
_SIZE = select(t.c.bytes).where(t.c.session_key == bindparam("b_key"))


def keep(
    conn: Connection, session_key: str, thread_id: str, turn_key: str, got: Rollout | NotKept
) -> None:
    """The thread's state after ``turn_key``: its rollout, or why there is none (then a
    worker without the thread rebuilds it instead of restoring an older rollout)."""
    values = {
        "session_key": session_key,
        "thread_id": thread_id,
        "turn_key": turn_key,
        "updated_at": utcnow(),
    }
    if isinstance(got, Rollout):
        values |= {"status": KEPT, "name": got.name, "body": got.body, "lines": got.lines,
                   "bytes": got.size, "detail": None}  # fmt: skip
    else:
        values |= {"status": got.reason, "name": None, "body": None, "lines": 0, "bytes": 0,
                   "detail": got.detail[:500]}  # fmt: skip
    # One row per session, replaced whole: delete and insert works the same on both
    # databases, inside the caller's transaction.
    conn.execute(delete(t).where(t.c.session_key == session_key))
    sql.insert_row(conn, t, values)


def rollout(conn: Connection, session_key: str, thread_id: str) -> Rollout | NotKept:
    """The kept rollout of ``thread_id``, or why there is none."""
    row = sql.first(conn, _ROW, {"b_key": session_key})
    if row is None:
        return NotKept("absent", "nothing kept for the session")
    if row["thread_id"] != thread_id:
        return NotKept("absent", "the kept rollout is of another thread")
    if row["status"] != KEPT or row["body"] is None or row["name"] is None:
        return NotKept(str(row["status"]), str(row["detail"] or ""))
    return check(Rollout(thread_id, str(row["name"]), str(row["body"]), int(row["lines"])))


def size(conn: Connection, session_key: str) -> int:
    """The bytes the session's kept thread holds (0 without one)."""
    return int(sql.scalar(conn, _SIZE, {"b_key": session_key}) or 0)
