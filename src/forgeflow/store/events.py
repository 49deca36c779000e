"""Domain events (PIPELINES "Sự kiện miền"): the closed set pipelines can listen to.

An event is written in the same transaction as the change it reports, with a dedupe
key, so a retried transaction or a redelivered webhook never fires a trigger twice.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select, update

from forgeflow.store.schema import domain_events
from forgeflow.store.sql import insert_ignore
from forgeflow.store.types import utcnow

EVENT_TYPES = frozenset(
    {
        "ExternalPrDetected",
        "PullRequestPublished",
        "PullRequestStatusChanged",
        "PrMerged",
        "CommentCreated",
        "IssueOpened",
        "IssueAssigned",
        "TaskCreated",
        "TaskCompleted",
        "TaskFailed",
        "TaskCancelled",
        "TaskStatusChanged",
        "BudgetThresholdCrossed",
        "RepoAdded",
        "ReleasePublished",
        "SessionClosed",
    }
)


def emit(
    conn: Connection,
    event_type: str,
    *,
    dedupe_key: str,
    payload: dict[str, Any],
    repo_key: str | None = None,
) -> bool:
    """Record one event; False when its dedupe key was already recorded."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown domain event type {event_type!r}")
    return insert_ignore(
        conn,
        domain_events,
        {
            "event_type": event_type,
            "dedupe_key": f"{event_type}:{dedupe_key}",
            "repo_key": repo_key,
            "payload": payload,
            "created_at": utcnow(),
        },
    )


def pending(conn: Connection, limit: int = 100) -> list[dict[str, Any]]:
    rows = conn.execute(
        select(domain_events)
        .where(domain_events.c.dispatched_at.is_(None))
        .order_by(domain_events.c.seq)
        .limit(limit)
    )
    return [dict(r._mapping) for r in rows]


def mark_dispatched(conn: Connection, seq: int) -> None:
    conn.execute(
        update(domain_events).where(domain_events.c.seq == seq).values(dispatched_at=utcnow())
    )


def all_of(conn: Connection, event_type: str | None = None) -> list[dict[str, Any]]:
    stmt = select(domain_events).order_by(domain_events.c.seq)
    if event_type is not None:
        stmt = stmt.where(domain_events.c.event_type == event_type)
    return [dict(r._mapping) for r in conn.execute(stmt)]
