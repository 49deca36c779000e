"""Queries of ``webhook_deliveries`` and the acceptance of a delivery:
delivery, repository, session and task rows in one transaction."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, func, or_, select, update

from forgeflow.domain.ids import ResourceRef, task_id_for
from forgeflow.domain.ids import delivery_key as delivery_key_of
from forgeflow.domain.records import Delivery, Repository
from forgeflow.domain.states import TaskState
from forgeflow.store import audit, repos, rows, sessions, sql
from forgeflow.store import tasks as task_q
from forgeflow.store.schema import tasks, webhook_deliveries
from forgeflow.store.sql import insert_ignore, notify_tasks
from forgeflow.store.types import utcnow
from forgeflow.store.usage import Budgets, exceeded


@dataclass(frozen=True, slots=True)
class DeliveryRecord:
    """What happened to a delivery: enough to answer a repeat with the original result."""

    delivery_id: str
    status: str
    response_code: int
    task_id: str | None = None
    task_state: str | None = None
    reason: str | None = None
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class Accept:
    """Everything the acceptance transaction needs, decided before it starts."""

    delivery_key: str
    delivery_id: str
    event_type: str
    payload_hash: str
    retention: timedelta
    resource: ResourceRef
    clone_url: str
    default_branch: str
    workspace_path: str
    comment_id: int
    author: str
    instruction: str
    refs: dict[str, Any] | None
    permitted: bool
    permission: str
    budgets: Budgets = field(default_factory=Budgets)


# Statements of the webhook's hot path, built once (see store/sql.py).
_GET = select(webhook_deliveries).where(webhook_deliveries.c.delivery_key == bindparam("key"))
_TASK_STATE = select(tasks.c.state).where(tasks.c.task_id == bindparam("task_id"))
# Gitea's replay: the same comment under a new delivery id.
_EARLIER = (
    select(webhook_deliveries.c.delivery_key, webhook_deliveries.c.task_id)
    .where(webhook_deliveries.c.repo_key == bindparam("repo_key"))
    .where(webhook_deliveries.c.comment_id == bindparam("comment_id"))
    .where(webhook_deliveries.c.delivery_key != bindparam("key"))
    .where(
        or_(webhook_deliveries.c.status == "accepted", webhook_deliveries.c.status == "rejected")
    )
)


def get(conn: Connection, delivery_key: str) -> DeliveryRecord | None:
    row = rows.first(Delivery, conn, _GET, {"key": delivery_key})
    return _record(conn, row, duplicate=True) if row else None


def _task_state(conn: Connection, task_id: str) -> str | None:
    state: str | None = sql.scalar(conn, _TASK_STATE, {"task_id": task_id})
    return state


def _record(conn: Connection, row: Delivery, *, duplicate: bool) -> DeliveryRecord:
    state = _task_state(conn, row.task_id) if row.task_id else None
    return DeliveryRecord(
        delivery_id=row.delivery_id,
        status=row.status,
        response_code=row.response_code,
        task_id=row.task_id,
        task_state=state,
        reason=row.reason,
        duplicate=duplicate,
    )


def _insert(
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
    inserted = _insert(
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
    _insert(
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


def open_delivery(
    conn: Connection, a: Accept, *, response_code: int, task_id: str | None = None
) -> DeliveryRecord | Repository:
    """The common start of an accepted mention: record the delivery, register the
    repository, refuse a disabled one and recognise Gitea's replay of a comment.

    Returns the answer when the delivery ends here, else the repository and the
    caller goes on. ``task_id``: the task the caller will create in this transaction,
    recorded with the delivery up front (every way out below clears it).
    """
    repo = a.resource.repo
    if not _insert(
        conn,
        delivery_key=a.delivery_key,
        delivery_id=a.delivery_id,
        event_type=a.event_type,
        payload_hash=a.payload_hash,
        retention=a.retention,
        normalized=True,
        status="accepted",
        response_code=response_code,
        repo_key=repo.key,
        comment_id=a.comment_id,
        task_id=task_id,
    ):
        existing = get(conn, a.delivery_key)
        assert existing is not None
        return existing
    registered = repos.register(
        conn,
        repo=repo,
        clone_url=a.clone_url,
        default_branch=a.default_branch,
        workspace_path=a.workspace_path,
        delivery_id=a.delivery_id,
    )
    if registered.status == repos.DISABLED:
        return _reject_disabled(conn, a)
    return _replayed(conn, a) or registered


def _reject_disabled(conn: Connection, a: Accept) -> DeliveryRecord:
    """A mention in a disabled repository: recorded and refused (409)."""
    finish(
        conn,
        a.delivery_key,
        status="rejected",
        reason="repository_disabled",
        response_code=409,
        task_id=None,
    )
    audit.append(
        conn,
        audit.AuditEvent(
            action="webhook.reject",
            delivery_id=a.delivery_id,
            repo_key=a.resource.repo.key,
            error_code="repository_disabled",
        ),
    )
    return DeliveryRecord(a.delivery_id, "rejected", 409, reason="repository_disabled")


def _replayed(conn: Connection, a: Accept) -> DeliveryRecord | None:
    """Gitea's replay of a comment accepted before under another delivery id: answered
    with the earlier delivery's task, or None when the comment is new."""
    repo_key = a.resource.repo.key
    earlier = sql.first(
        conn, _EARLIER, {"repo_key": repo_key, "comment_id": a.comment_id, "key": a.delivery_key}
    )
    if earlier is None:
        return None
    task_id = earlier["task_id"]
    state = _task_state(conn, task_id) if task_id else None
    finish(
        conn,
        a.delivery_key,
        status="duplicate",
        reason="comment_already_accepted",
        response_code=200,
        task_id=task_id,
    )
    audit.append(
        conn,
        audit.AuditEvent(
            action="webhook.duplicate",
            task_id=task_id,
            delivery_id=a.delivery_id,
            repo_key=repo_key,
            comment_id=a.comment_id,
            error_code="duplicate_delivery",
        ),
    )
    return DeliveryRecord(
        a.delivery_id,
        "duplicate",
        200,
        task_id,
        state,
        "comment_already_accepted",
        duplicate=True,
    )


def accept(conn: Connection, a: Accept) -> DeliveryRecord:
    """Register repository, session and task and queue it, all in one transaction."""
    repo = a.resource.repo
    task_id = task_id_for(a.delivery_key)
    opened = open_delivery(conn, a, response_code=202, task_id=task_id)
    if isinstance(opened, DeliveryRecord):
        return opened
    sessions.ensure(conn, a.resource, reopen=True)
    task_q.insert_received(
        conn,
        {
            "task_id": task_id,
            "delivery_key": a.delivery_key,
            "repo_key": repo.key,
            "resource_key": a.resource.key,
            "session_key": a.resource.session_key,
            "comment_id": a.comment_id,
            "author": a.author,
            "instruction": a.instruction,
            "refs": a.refs,
        },
    )
    over = exceeded(conn, repo.key, a.budgets, opened) if a.permitted else None
    refusal = (
        "insufficient_permission" if not a.permitted else ("budget_exceeded" if over else None)
    )
    to_state = TaskState.QUEUED if refusal is None else TaskState.REJECTED
    task_q.transition(
        conn,
        task_q.Transition(
            task_id=task_id,
            to_state=to_state,
            expected_version=1,
            actor=f"gitea:user:{a.author}",
            action="webhook.accept" if refusal is None else "webhook.reject",
            error_code=refusal,
            fields={"execution_error": f"over {over}"} if over else None,
            metadata={"eventType": a.event_type, "permission": a.permission},
            delivery_id=a.delivery_id,
            comment_id=a.comment_id,
            from_state=TaskState.RECEIVED,
        ),
    )
    if refusal is None:
        notify_tasks(conn)
        return DeliveryRecord(a.delivery_id, "accepted", 202, task_id, to_state.value)
    finish(conn, a.delivery_key, status="rejected", reason=refusal, response_code=200)
    return DeliveryRecord(a.delivery_id, "rejected", 200, task_id, to_state.value, refusal)


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
