"""The SQL of ``pipeline_hook_deliveries``: the log of a pipeline webhook trigger's calls.

Each function takes the caller's ``Connection``, so an accepted call's row commits with
the run it started.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, func, insert, select

from forgeflow.domain.pipeline_records import HookCall, HookDelivery
from forgeflow.store import rows
from forgeflow.store.pipeline_schema import pipeline_hook_deliveries as log
from forgeflow.store.types import utcnow

# Rows dropped per call at most: pruning rides on each call and stays cheap.
PRUNE_BATCH = 500


def insert_delivery(conn: Connection, values: Mapping[str, Any], *, expires_at: datetime) -> str:
    """Record one call; returns its delivery id."""
    delivery_id = f"dlv-{uuid.uuid4().hex}"
    conn.execute(
        insert(log).values(
            delivery_id=delivery_id, received_at=utcnow(), expires_at=expires_at, **values
        )
    )
    return delivery_id


def prune(conn: Connection, now: datetime) -> int:
    """Delete up to :data:`PRUNE_BATCH` rows whose retention ran out."""
    expired = select(log.c.delivery_id).where(log.c.expires_at <= now).limit(PRUNE_BATCH)
    ids = [r[0] for r in conn.execute(expired)]
    if not ids:
        return 0
    conn.execute(delete(log).where(log.c.delivery_id.in_(ids)))
    return len(ids)


def accepted_with_digest(
    conn: Connection, trigger_id: str, digest: str, since: datetime
) -> str | None:
    """The run of the latest accepted call of ``trigger_id`` with this body digest since
    ``since`` (None: no such call, or it started none)."""
    row = conn.execute(
        select(log.c.run_id)
        .where(
            log.c.trigger_id == trigger_id,
            log.c.body_digest == digest,
            log.c.status == "accepted",
            log.c.received_at >= since,
        )
        .order_by(log.c.received_at.desc())
        .limit(1)
    ).first()
    return None if row is None else row.run_id


_SUMMARY = [c for c in log.c if c.name not in ("body", "body_digest")]


def page(
    conn: Connection, trigger_id: str, status: str | None, limit: int, offset: int
) -> tuple[list[HookCall], int]:
    """A trigger's deliveries, newest first, without their bodies."""
    conds = [log.c.trigger_id == trigger_id]
    if status is not None:
        conds.append(log.c.status == status)
    total = conn.execute(select(func.count()).select_from(log).where(*conds)).scalar_one()
    stmt = (
        select(*_SUMMARY)
        .where(*conds)
        .order_by(log.c.received_at.desc(), log.c.delivery_id)
        .limit(limit)
        .offset(offset)
    )
    return rows.every(HookCall, conn, stmt, {}), int(total)


def get(conn: Connection, trigger_id: str, delivery_id: str) -> HookDelivery | None:
    stmt = select(log).where(log.c.trigger_id == trigger_id).where(log.c.delivery_id == delivery_id)
    return rows.first(HookDelivery, conn, stmt, {})
