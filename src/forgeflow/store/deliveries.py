"""Queries of ``webhook_deliveries``: a delivery's record, and what a repeat of it is
answered with. The acceptance of a mention is store/acceptance.py."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, func, select, update

from forgeflow.domain.ids import delivery_key as delivery_key_of
from forgeflow.domain.intake import ANSWERED_STATUSES, DeliveryRecord
from forgeflow.domain.records import Delivery
from forgeflow.store import audit, repos, rows, sql
from forgeflow.store.schema import tasks, webhook_deliveries
from forgeflow.store.sql import insert_ignore
from forgeflow.store.types import utcnow

# Statements of the webhook's hot path, built once (see store/sql.py).
_GET = select(webhook_deliveries).where(webhook_deliveries.c.delivery_key == bindparam("key"))
_TASK_STATE = select(tasks.c.state).where(tasks.c.task_id == bindparam("task_id"))


def get(conn: Connection, delivery_key: str) -> DeliveryRecord | None:
    row = rows.first(Delivery, conn, _GET, {"key": delivery_key})
    return _record(conn, row, duplicate=True) if row else None


def task_state(conn: Connection, task_id: str) -> str | None:
    state: str | None = sql.scalar(conn, _TASK_STATE, {"task_id": task_id})
    return state


def _record(conn: Connection, row: Delivery, *, duplicate: bool) -> DeliveryRecord:
    state = task_state(conn, row.task_id) if row.task_id else None
    return DeliveryRecord(
        delivery_id=row.delivery_id,
        status=row.status,
        response_code=row.response_code,
        task_id=row.task_id,
        task_state=state,
        reason=row.reason,
        duplicate=duplicate,
    )


def taken_comments(conn: Connection, repo_key: str, comment_ids: list[int]) -> set[int]:
    """Which of ``comment_ids`` a delivery to ``repo_key`` already answered (accepted
    or rejected): a comment another delivery of the same review took."""
    if not comment_ids:
        return set()
    found = conn.execute(
        select(webhook_deliveries.c.comment_id)
        .where(webhook_deliveries.c.repo_key == repo_key)
        .where(webhook_deliveries.c.comment_id.in_(comment_ids))
        .where(webhook_deliveries.c.status.in_(sorted(s.value for s in ANSWERED_STATUSES)))
    )
    return {int(row.comment_id) for row in found}


def insert(
    conn: Connection,
    *,
    delivery_key: str,
    delivery_id: str,
    event_type: str,
    payload_hash: str,
    retention: timedelta,
    normalized: bool,
    status: str,
    response_code: int,
    reason: str | None = None,
    repo_key: str | None = None,
    comment_id: int | None = None,
    task_id: str | None = None,
) -> bool:
    now = utcnow()
    return insert_ignore(
        conn,
        webhook_deliveries,
        {
            "delivery_key": delivery_key,
            "delivery_id": delivery_id,
            "event_type": event_type,
            "received_at": now,
            "signature_valid": True,
            "normalized": normalized,
            "status": status,
            "reason": reason,
            "repo_key": repo_key,
            "comment_id": comment_id,
            "task_id": task_id,
            "payload_hash": payload_hash,
            "response_code": response_code,
            "expires_at": now + retention,
        },
    )


def finish(conn: Connection, delivery_key: str, **values: Any) -> None:
    conn.execute(
        update(webhook_deliveries)
        .where(webhook_deliveries.c.delivery_key == delivery_key)
        .values(**values)
    )


def record_ignored(
    conn: Connection,
    *,
    delivery_key: str,
    delivery_id: str,
    event_type: str,
    payload_hash: str,
    retention: timedelta,
    reason: str,
    normalized: bool,
    repo_key: str | None = None,
) -> DeliveryRecord:
    """Record a verified delivery that starts nothing (``ignored``)."""
    inserted = insert(
        conn,
        delivery_key=delivery_key,
        delivery_id=delivery_id,
        event_type=event_type,
        payload_hash=payload_hash,
        retention=retention,
        normalized=normalized,
        status="ignored",
        response_code=200,
        reason=reason,
        repo_key=repo_key,
    )
    existing = get(conn, delivery_key)
    assert existing is not None
    if not inserted:
        return existing
    audit.append(
        conn,
        audit.AuditEvent(
            action="webhook.ignore",
            delivery_id=delivery_id,
            repo_key=repo_key,
            metadata={"reason": reason, "eventType": event_type},
        ),
    )
    return DeliveryRecord(delivery_id, "ignored", 200, reason=reason)


def record_refused(
    conn: Connection,
    *,
    delivery_id: str,
    event_type: str,
    payload_hash: str,
    retention: timedelta,
    code: str,
    response_code: int,
    repo_key: str | None = None,
) -> None:
    """Record a verified delivery that was refused (400 a payload forgeflow cannot read,
    503 Gitea could not say who commented), with its code and never its body.

    The row has a key of its own (the delivery's key and a random suffix): Gitea
    redelivers a refused delivery, and the redelivery must be handled afresh, not
    answered as a duplicate of the refusal. Without a comment id it is no earlier
    acceptance of a replayed comment either."""
    refused_key = f"{delivery_key_of(delivery_id)[:150]}#refused-{uuid.uuid4().hex[:12]}"
    insert(
        conn,
        delivery_key=refused_key,
        delivery_id=delivery_id,
        event_type=event_type,
        payload_hash=payload_hash,
        retention=retention,
        normalized=False,
        status="rejected",
        response_code=response_code,
        reason=code,
        repo_key=repo_key,
    )
    audit.append(
        conn,
        audit.AuditEvent(
            action="webhook.reject",
            delivery_id=delivery_id,
            repo_key=repo_key,
            error_code=code,
            metadata={"eventType": event_type, "responseCode": response_code},
        ),
    )


def repo_status(conn: Connection, repo_key: str) -> str | None:
    return repos.status(conn, repo_key)


def counts_by_status(conn: Connection) -> dict[str, int]:
    rows = conn.execute(
        select(webhook_deliveries.c.status, func.count()).group_by(webhook_deliveries.c.status)
    )
    return {status: int(n) for status, n in rows}


def list_page(
    conn: Connection, status: str | None, repo_key: str | None, limit: int, offset: int
) -> tuple[list[Delivery], int]:
    """Recorded deliveries, newest first, by status and repository."""
    conds = []
    if status is not None:
        conds.append(webhook_deliveries.c.status == status)
    if repo_key is not None:
        conds.append(webhook_deliveries.c.repo_key == repo_key)
    total = conn.execute(
        select(func.count()).select_from(webhook_deliveries).where(*conds)
    ).scalar_one()
    stmt = (
        select(webhook_deliveries)
        .where(*conds)
        .order_by(webhook_deliveries.c.received_at.desc(), webhook_deliveries.c.delivery_key)
        .limit(limit)
        .offset(offset)
    )
    return rows.every(Delivery, conn, stmt, {}), int(total)
