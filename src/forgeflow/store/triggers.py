"""Queries that fire ``pipeline_triggers`` rows (their definition side — create, sync,
list — is in ``store/pipelines.py``).

Each row is read together with its template's switch (``template_enabled``), because a
trigger of a disabled template must be seen — and its skip recorded — not silently
filtered out. A schedule moves on by compare-and-swap on ``next_fire_at``, so of
several processes that find it due exactly one fires it.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy import Connection, func, select, update

from forgeflow.domain.pipeline_records import ArmedTrigger
from forgeflow.store import rows
from forgeflow.store.pipeline_schema import pipeline_definitions as defs
from forgeflow.store.pipeline_schema import pipeline_triggers as triggers
from forgeflow.store.types import utcnow

_WITH_SWITCH = select(triggers, defs.c.is_enabled.label("template_enabled")).join(
    defs, defs.c.key == triggers.c.template_key
)


def event_triggers(conn: Connection, event_types: Collection[str]) -> list[ArmedTrigger]:
    """Enabled domain-event triggers listening to any of ``event_types``."""
    wanted = set(event_types)
    # All enabled event triggers (a handful), filtered here: one fixed statement.
    armed = rows.every(ArmedTrigger, conn, _EVENT_TRIGGERS, {})
    return [t for t in armed if t.event_type in wanted]


_EVENT_TRIGGERS = (
    _WITH_SWITCH.where(triggers.c.trigger_type == "event")
    .where(triggers.c.is_enabled.is_(True))
    .order_by(triggers.c.template_key)
)


def by_token(conn: Connection, token: str) -> ArmedTrigger | None:
    """The webhook trigger whose token this is."""
    stmt = _WITH_SWITCH.where(triggers.c.trigger_type == "webhook").where(
        triggers.c.webhook_token == token
    )
    return rows.first(ArmedTrigger, conn, stmt, {})


def get(conn: Connection, trigger_id: str) -> ArmedTrigger | None:
    stmt = _WITH_SWITCH.where(triggers.c.trigger_id == trigger_id)
    return rows.first(ArmedTrigger, conn, stmt, {})


def schedules(conn: Connection) -> list[ArmedTrigger]:
    """Every schedule trigger, enabled or not (the scheduler forgets a disabled one's
    next fire time, so enabling it again counts from then)."""
    stmt = _WITH_SWITCH.where(triggers.c.trigger_type == "schedule").order_by(triggers.c.trigger_id)
    return rows.every(ArmedTrigger, conn, stmt, {})


def next_schedule_due(conn: Connection) -> datetime | None:
    value: datetime | None = conn.execute(
        select(func.min(triggers.c.next_fire_at))
        .where(triggers.c.trigger_type == "schedule")
        .where(triggers.c.is_enabled.is_(True))
    ).scalar_one()
    return value


def move_schedule(
    conn: Connection,
    trigger_id: str,
    *,
    expected: datetime | None,
    next_at: datetime | None,
    fired_at: datetime | None = None,
) -> bool:
    """Compare-and-swap ``next_fire_at`` from ``expected``; True when this call moved it."""
    where = (
        triggers.c.next_fire_at.is_(None)
        if expected is None
        else triggers.c.next_fire_at == expected
    )
    stmt = (
        update(triggers)
        .where(triggers.c.trigger_id == trigger_id)
        .where(where)
        .values(next_fire_at=next_at)
    )
    if fired_at is not None:
        stmt = stmt.values(last_fired_at=fired_at)
    result = conn.execute(stmt)
    return result.rowcount == 1


def mark_fired(conn: Connection, trigger_id: str, at: datetime | None = None) -> None:
    conn.execute(
        update(triggers)
        .where(triggers.c.trigger_id == trigger_id)
        .values(last_fired_at=at or utcnow())
    )


def set_enabled(conn: Connection, trigger_id: str, enabled: bool) -> bool:
    """Switch one trigger; True when it changed. Disabling a schedule forgets its next
    fire time."""
    stmt = (
        update(triggers)
        .where(triggers.c.trigger_id == trigger_id)
        .where(triggers.c.is_enabled.is_(not enabled))
        .values(is_enabled=enabled, updated_at=utcnow())
    )
    if not enabled:
        stmt = stmt.values(next_fire_at=None)
    result = conn.execute(stmt)
    return result.rowcount == 1
