"""Queries of the ``sessions`` table: one row (and one Codex thread) per resource."""

from __future__ import annotations

import hashlib
from datetime import datetime

from sqlalchemy import Connection, bindparam, func, select, update

from forgeflow.domain.ids import ResourceRef
from forgeflow.domain.json import JsonObject
from forgeflow.domain.records import Session
from forgeflow.store import audit, events, rows
from forgeflow.store.schema import sessions, tasks
from forgeflow.store.sql import insert_ignore
from forgeflow.store.types import utcnow

RUNTIME = {"app": "codexapp", "mode": "yolo"}
MCP = {"server": "gitea", "transport": "stdio", "hostRef": "gitea-main"}
# A draft space's thread: read-only sandbox, no MCP server (docs/codex-app-server.md).
DRAFT_RUNTIME = {"app": "codexapp", "mode": "read-only"}
NO_MCP: JsonObject = {"server": None}


def space_key(resource: ResourceRef, run_id: str) -> str:
    """The session of a pipeline run's draft space on ``resource``: its own row and
    thread, so the resource's mention session keeps its thread and its full access."""
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:12]
    return f"{resource.session_key}:space-{digest}"


def open_space(conn: Connection, resource: ResourceRef, *, mode: str, run_id: str) -> Session:
    """The draft space (``plan``/``review``) of ``run_id`` on ``resource``, created on
    first use. Its mode is recorded once: a second opening in the same run returns the
    row as it is (the caller compares the modes)."""
    key = space_key(resource, run_id)
    row = get(conn, key)
    if row is None:
        _create(conn, resource, key=key, mode=mode)
        row = get(conn, key)
        assert row is not None
    return row


def ensure(conn: Connection, resource: ResourceRef, *, reopen: bool = False) -> Session:
    """The session of ``resource``, created on first use; the thread comes later.

    ``reopen``: a closed session (``@bot new session``) becomes active again, without a
    thread, so the next turn starts a fresh one.
    """
    row = get(conn, resource.session_key)
    if row is None:
        _create(conn, resource)
        row = get(conn, resource.session_key)
        assert row is not None
    if reopen and row.status == "closed":
        conn.execute(
            update(sessions)
            .where(sessions.c.session_key == resource.session_key)
            .values(status="active", updated_at=utcnow(), version=row.version + 1)
        )
        row = get(conn, resource.session_key)
        assert row is not None
    return row


def _create(
    conn: Connection, resource: ResourceRef, *, key: str | None = None, mode: str | None = None
) -> None:
    # insert-or-ignore: a concurrent first mention on PostgreSQL may win the race.
    now = utcnow()
    insert_ignore(
        conn,
        sessions,
        {
            "session_key": key or resource.session_key,
            "resource_key": resource.key,
            "repo_key": resource.repo.key,
            "kind": resource.kind.value,
            "number": resource.number,
            "runtime": RUNTIME if mode is None else DRAFT_RUNTIME,
            "mcp": MCP if mode is None else NO_MCP,
            "mode": mode,
            "status": "active",
            "created_at": now,
            "updated_at": now,
            "version": 1,
        },
    )


def close(conn: Connection, session_key: str, *, actor: str) -> Session | None:
    """Close the session and forget its thread; the next task starts a new thread."""
    row = get(conn, session_key)
    if row is None:
        return None
    conn.execute(
        update(sessions)
        .where(sessions.c.session_key == session_key)
        .values(status="closed", thread_id=None, updated_at=utcnow(), version=row.version + 1)
    )
    audit.append(
        conn,
        audit.AuditEvent(
            action="session.close",
            actor=actor,
            session_key=session_key,
            repo_key=row.repo_key,
            metadata={"threadId": row.thread_id},
        ),
    )
    events.emit(
        conn,
        "SessionClosed",
        dedupe_key=f"{session_key}:{row.version + 1}",
        payload={"sessionKey": session_key, "threadId": row.thread_id, "actor": actor},
        repo_key=row.repo_key,
    )
    return get(conn, session_key)


# Built once: every accepted mention reads its session row (see store/sql.py).
_GET = select(sessions).where(sessions.c.session_key == bindparam("key"))


def get(conn: Connection, session_key: str) -> Session | None:
    return rows.first(Session, conn, _GET, {"key": session_key})


def list_page(
    conn: Connection,
    repo_key: str | None,
    limit: int,
    offset: int,
    repo_keys: frozenset[str] | None = None,
) -> tuple[list[Session], int]:
    """Sessions, most recently active first, optionally of one repository, and only of
    ``repo_keys`` when given (a Gitea user's readable repositories)."""
    conds = [sessions.c.repo_key == repo_key] if repo_key is not None else []
    if repo_keys is not None:
        conds.append(sessions.c.repo_key.in_(sorted(repo_keys)))
    total = conn.execute(select(func.count()).select_from(sessions).where(*conds)).scalar_one()
    stmt = (
        select(sessions)
        .where(*conds)
        .order_by(sessions.c.updated_at.desc(), sessions.c.session_key)
        .limit(limit)
        .offset(offset)
    )
    return rows.every(Session, conn, stmt, {}), int(total)


def conversation_seen_at(conn: Connection, session_key: str, task_id: str) -> datetime | None:
    """When the session's thread last saw the conversation: the creation of its newest
    earlier task that ran a turn, while the session has a thread; None for a thread
    yet to start (it sees everything). What was attached before that was sent to the
    thread with that task's turn (tasks/images.py)."""
    found = conn.execute(
        select(func.max(tasks.c.created_at))
        .select_from(tasks.join(sessions, sessions.c.session_key == tasks.c.session_key))
        .where(tasks.c.session_key == session_key)
        .where(sessions.c.thread_id.is_not(None))
        .where(tasks.c.turn_count > 0)
        .where(tasks.c.task_id != task_id)
        .where(
            tasks.c.created_at
            < select(tasks.c.created_at).where(tasks.c.task_id == task_id).scalar_subquery()
        )
    ).scalar()
    return found if isinstance(found, datetime) else None
