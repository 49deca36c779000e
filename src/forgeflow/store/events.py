"""Queries of ``domain_events`` (spec PIPELINES "Sự kiện miền"): record, claim, mark.

An event is written in the same transaction as the change it reports, with a dedupe
key, so a retried transaction or a redelivered webhook never records it twice. Writing
one asks for the dispatchers to be woken once the transaction commits: in this process
through the database's after-commit topics, in other processes by PostgreSQL
``NOTIFY`` (delivered at commit, so nobody wakes before the row is visible).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

from sqlalchemy import Connection, bindparam, select, text, update

from forgeflow.domain.bookkeeping import StoredEvent
from forgeflow.domain.events import KNOWN_EVENT_TYPES, DomainEvent
from forgeflow.domain.json import JsonObject
from forgeflow.store import rows, sql
from forgeflow.store.bookkeeping_schema import domain_events
from forgeflow.store.db import after_commit
from forgeflow.store.sql import insert_ignore, insert_rows
from forgeflow.store.types import utcnow

EVENT_TYPES = KNOWN_EVENT_TYPES
EVENTS_CHANNEL = "forgeflow_events"
TOPIC = "domain_events"


def emit(
    conn: Connection,
    event_type: str,
    *,
    dedupe_key: str,
    payload: JsonObject,
    repo_key: str | None = None,
) -> bool:
    """Record one event; False when its dedupe key was already recorded."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown domain event type {event_type!r}")
    inserted = insert_ignore(
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
    if inserted:
        _wake_dispatchers(conn)
    return inserted


def record(conn: Connection, found: Iterable[DomainEvent]) -> int:
    """Record events built by the domain core; returns how many were new."""
    return sum(
        emit(conn, e.event_type, dedupe_key=e.dedupe_key, payload=e.payload, repo_key=e.repo_key)
        for e in found
    )


def claim(conn: Connection, limit: int = 100) -> list[StoredEvent]:
    """The oldest undispatched events, held until the transaction ends.

    On PostgreSQL ``FOR UPDATE SKIP LOCKED``: dispatchers in several processes take
    disjoint batches instead of waiting for each other. SQLite has one writer, which
    serialises them anyway (the clause is not rendered there).
    """
    return rows.every(StoredEvent, conn, _CLAIM, {"limit": limit})


# Built once: the dispatcher claims after every commit that recorded events.
_CLAIM = (
    select(domain_events)
    .where(domain_events.c.dispatched_at.is_(None))
    .order_by(domain_events.c.seq)
    .limit(bindparam("limit"))
    .with_for_update(skip_locked=True)
)
_MARK = (
    update(domain_events)
    .where(domain_events.c.seq == bindparam("b_seq"))
    .values(dispatched_at=bindparam("b_at"))
)


def record_unique(
    conn: Connection, items: list[tuple[str, str]], *, payload: JsonObject, repo_key: str | None
) -> None:
    """Record events whose dedupe keys cannot exist yet (a task's ``taskId:stateVersion``
    after its compare-and-swap won): one plain multi-row INSERT, no conflict check."""
    now = utcnow()
    values = []
    for event_type, dedupe_key in items:
        if event_type not in EVENT_TYPES:
            raise ValueError(f"unknown domain event type {event_type!r}")
        values.append(
            {
                "event_type": event_type,
                "dedupe_key": f"{event_type}:{dedupe_key}",
                "repo_key": repo_key,
                "payload": payload,
                "created_at": now,
            }
        )
    insert_rows(conn, domain_events, values)
    _wake_dispatchers(conn)


def _wake_dispatchers(conn: Connection) -> None:
    if after_commit(conn, TOPIC) and conn.dialect.name == "postgresql":
        # Once per transaction; PostgreSQL folds repeated notifications anyway.
        conn.execute(text(f"NOTIFY {EVENTS_CHANNEL}"))


def pending(conn: Connection, limit: int = 100) -> list[StoredEvent]:
    stmt = (
        select(domain_events)
        .where(domain_events.c.dispatched_at.is_(None))
        .order_by(domain_events.c.seq)
        .limit(limit)
    )
    return rows.every(StoredEvent, conn, stmt, {})


def mark_dispatched(conn: Connection, seq: int | Iterable[int]) -> None:
    seqs = [seq] if isinstance(seq, int) else list(seq)
    if seqs:
        now = utcnow()
        sql.execute_many(conn, _MARK, [{"b_seq": n, "b_at": now} for n in seqs])


def all_of(conn: Connection, event_type: str | None = None) -> list[StoredEvent]:
    stmt = select(domain_events).order_by(domain_events.c.seq)
    if event_type is not None:
        stmt = stmt.where(domain_events.c.event_type == event_type)
    return rows.every(StoredEvent, conn, stmt, {})


R = TypeVar("R")


def after_delivery(conn: Connection, answer: R, found: Sequence[DomainEvent]) -> R:
    """Record a webhook delivery's events in its own transaction, unless the delivery
    is a repeat (``answer.duplicate``): a redelivery emits nothing. Returns ``answer``."""
    if found and not getattr(answer, "duplicate", False):
        record(conn, found)
    return answer
