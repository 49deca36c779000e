"""Queries of the append-only ``audit_events`` table: every state change
and side effect, with its actor; rows are never updated or deleted."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Connection, func, select

from forgeflow.domain.bookkeeping import AuditEntry
from forgeflow.domain.ids import new_event_id
from forgeflow.domain.json import JsonObject
from forgeflow.redaction import redact
from forgeflow.store import rows
from forgeflow.store.bookkeeping_schema import audit_events
from forgeflow.store.sql import insert_row
from forgeflow.store.types import utcnow


@dataclass(frozen=True, slots=True)
class AuditEvent:
    action: str
    actor: str = "system"
    task_id: str | None = None
    session_key: str | None = None
    repo_key: str | None = None
    from_state: str | None = None
    to_state: str | None = None
    state_version: int | None = None
    delivery_id: str | None = None
    turn_id: str | None = None
    comment_id: int | None = None
    error_code: str | None = None
    metadata: JsonObject = field(default_factory=dict)
    # When it happened, if not when it is appended: a step's row written later, in one
    # transaction with the next step's, keeps its own time.
    at: datetime | None = None


def append(conn: Connection, event: AuditEvent) -> str:
    """Append one event in the caller's transaction; returns its ``eventId``."""
    event_id = new_event_id()
    insert_row(
        conn,
        audit_events,
        {
            "event_id": event_id,
            "task_id": event.task_id,
            "session_key": event.session_key,
            "repo_key": event.repo_key,
            "actor": event.actor,
            "action": event.action,
            "from_state": event.from_state,
            "to_state": event.to_state,
            "state_version": event.state_version,
            "delivery_id": event.delivery_id,
            "turn_id": event.turn_id,
            "comment_id": event.comment_id,
            "error_code": event.error_code,
            "timestamp": event.at or utcnow(),
            "metadata": redact(event.metadata) if event.metadata else None,
        },
    )
    return event_id


@dataclass(frozen=True, slots=True)
class AuditQuery:
    task_id: str | None = None
    session_key: str | None = None
    repo_key: str | None = None
    action: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    after_seq: int | None = None
    limit: int = 200
    before_seq: int | None = None
    newest_first: bool = False


def query(conn: Connection, q: AuditQuery) -> list[AuditEntry]:
    order = audit_events.c.seq.desc() if q.newest_first else audit_events.c.seq
    stmt = select(audit_events).order_by(order).limit(q.limit)
    if q.task_id is not None:
        stmt = stmt.where(audit_events.c.task_id == q.task_id)
    if q.session_key is not None:
        stmt = stmt.where(audit_events.c.session_key == q.session_key)
    if q.repo_key is not None:
        stmt = stmt.where(audit_events.c.repo_key == q.repo_key)
    if q.action is not None:
        stmt = stmt.where(audit_events.c.action == q.action)
    if q.since is not None:
        stmt = stmt.where(audit_events.c.timestamp >= q.since)
    if q.until is not None:
        stmt = stmt.where(audit_events.c.timestamp < q.until)
    if q.after_seq is not None:
        stmt = stmt.where(audit_events.c.seq > q.after_seq)
    if q.before_seq is not None:
        stmt = stmt.where(audit_events.c.seq < q.before_seq)
    return rows.every(AuditEntry, conn, stmt, {})


def change_marker_of(conn: Connection, repo_keys: frozenset[str]) -> str:
    """:func:`change_marker` of these repositories' events only: a Gitea user's list
    pages must not move when a repository they cannot see changes."""
    mine = audit_events.c.repo_key.in_(sorted(repo_keys))
    top = conn.execute(
        select(func.coalesce(func.max(audit_events.c.seq), 0)).where(mine)
    ).scalar_one()
    recent = conn.execute(
        select(func.count()).select_from(audit_events).where(mine, audit_events.c.seq > top - 1000)
    ).scalar_one()
    return f"r{int(top)}.{int(recent)}"


def change_marker(conn: Connection) -> str:
    """A value that changes whenever an event is committed (live pages poll it).

    Every state change appends an event, so this is "has anything changed". The count
    of the newest events catches a PostgreSQL transaction that committed a lower
    ``seq`` after a higher one.
    """
    top = conn.execute(select(func.coalesce(func.max(audit_events.c.seq), 0))).scalar_one()
    recent = conn.execute(
        select(func.count()).select_from(audit_events).where(audit_events.c.seq > top - 1000)
    ).scalar_one()
    return f"{int(top)}.{int(recent)}"
