"""The acceptance of a mention: delivery, repository, session and task rows in one
transaction, the task queued or rejected as domain.admission decides."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial

from sqlalchemy import Connection, bindparam, select

from forgeflow.domain import options as opts
from forgeflow.domain.admission import admit
from forgeflow.domain.budgets import Budgets
from forgeflow.domain.ids import ResourceRef, task_id_for
from forgeflow.domain.intake import ANSWERED_STATUSES, DeliveryRecord
from forgeflow.domain.records import Refs, Repository
from forgeflow.domain.states import TaskState
from forgeflow.store import audit, deliveries, repos, sessions, sql
from forgeflow.store import tasks as task_q
from forgeflow.store.schema import webhook_deliveries
from forgeflow.store.sql import notify_tasks
from forgeflow.store.usage import exceeded, limits


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
    comment_id: int | None  # None: a review request (no comment started it)
    author: str
    instruction: str
    refs: Refs | None
    permitted: bool
    permission: str
    budgets: Budgets = field(default_factory=Budgets)
    mode: str | None = None  # domain/modes.PR_REVIEW for a pull request review task
    # No comment id (a review request): an earlier delivery of the same payload to the
    # same repository is this one replayed (Gitea's replay resends the stored bytes).
    replay_by_payload: bool = False
    # The mention's ``--`` options (None: none) and the models they may name.
    options: opts.Parsed | None = None
    allowed_models: tuple[str, ...] = ()


# Gitea's replay: the same comment under a new delivery id.
_EARLIER = (
    select(webhook_deliveries.c.delivery_key, webhook_deliveries.c.task_id)
    .where(webhook_deliveries.c.repo_key == bindparam("repo_key"))
    .where(webhook_deliveries.c.comment_id == bindparam("comment_id"))
    .where(webhook_deliveries.c.delivery_key != bindparam("key"))
    .where(webhook_deliveries.c.status.in_(sorted(s.value for s in ANSWERED_STATUSES)))
)
# The replay of a delivery without a comment (a review request): the same payload, of
# the same event type, to the same repository, under another delivery id.
_EARLIER_PAYLOAD = (
    select(webhook_deliveries.c.delivery_key, webhook_deliveries.c.task_id)
    .where(webhook_deliveries.c.repo_key == bindparam("repo_key"))
    .where(webhook_deliveries.c.comment_id.is_(None))
    .where(webhook_deliveries.c.event_type == bindparam("event_type"))
    .where(webhook_deliveries.c.payload_hash == bindparam("payload_hash"))
    .where(webhook_deliveries.c.delivery_key != bindparam("key"))
    .where(webhook_deliveries.c.status.in_(sorted(s.value for s in ANSWERED_STATUSES)))
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
    row = partial(
        deliveries.insert,
        conn,
        delivery_key=a.delivery_key,
        delivery_id=a.delivery_id,
        event_type=a.event_type,
        payload_hash=a.payload_hash,
        retention=a.retention,
        normalized=True,
        repo_key=repo.key,
        comment_id=a.comment_id,
    )
    if not row(status="accepted", response_code=response_code, task_id=task_id):
        existing = deliveries.get(conn, a.delivery_key)
        if existing is not None:
            return existing
        # Not this delivery's key but its unique payload (a review request, a review's
        # summary): its replay was accepted at the same instant
        # (ux_webhook_deliveries_by_payload).
        row(status="duplicate", response_code=200)
        replayed = _replayed(conn, a)
        assert replayed is not None, "a unique payload without its accepted delivery"
        return replayed
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
    deliveries.finish(
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
    """Gitea's replay of a comment (or of a review request's payload) accepted before
    under another delivery id: answered with the earlier delivery's task, or None when
    the comment or request is new."""
    repo_key = a.resource.repo.key
    if a.comment_id is not None:
        params = {"repo_key": repo_key, "comment_id": a.comment_id, "key": a.delivery_key}
        earlier = sql.first(conn, _EARLIER, params)
        reason = "comment_already_accepted"
    elif a.replay_by_payload:
        params = {
            "repo_key": repo_key,
            "event_type": a.event_type,
            "payload_hash": a.payload_hash,
            "key": a.delivery_key,
        }
        earlier = sql.first(conn, _EARLIER_PAYLOAD, params)
        reason = "request_already_accepted"
    else:
        return None  # a pipeline step's request: its delivery id alone identifies it
    if earlier is None:
        return None
    task_id = earlier["task_id"]
    state = deliveries.task_state(conn, task_id) if task_id else None
    deliveries.finish(
        conn,
        a.delivery_key,
        status="duplicate",
        reason=reason,
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
        reason,
        duplicate=True,
    )


def accept(conn: Connection, a: Accept) -> DeliveryRecord:
    """Register repository, session and task and queue it (or reject it, as
    domain.admission decides), all in one transaction."""
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
            "refs": None if a.refs is None else a.refs.json(),
            "mode": a.mode,
            "model": a.options.options.model if a.options else None,
            "max_tokens": a.options.options.max_tokens if a.options else None,
        },
    )
    admission = admit(
        permitted=a.permitted,
        over_budget=lambda: exceeded(conn, repo.key, a.budgets, opened),
        bad_options=lambda: _bad_options(conn, a, opened),
    )
    refusal = admission.refusal
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
            fields={"execution_error": admission.detail} if admission.detail else None,
            metadata={"eventType": a.event_type, "permission": a.permission},
            delivery_id=a.delivery_id,
            comment_id=a.comment_id,
            from_state=TaskState.RECEIVED,
        ),
    )
    if refusal is None:
        notify_tasks(conn)
        return DeliveryRecord(a.delivery_id, "accepted", 202, task_id, to_state.value)
    deliveries.finish(conn, a.delivery_key, status="rejected", reason=refusal, response_code=200)
    return DeliveryRecord(a.delivery_id, "rejected", 200, task_id, to_state.value, refusal)


def _bad_options(conn: Connection, a: Accept, repo: Repository) -> str | None:
    """What is wrong with the mention's options (domain/options.refusal), or None."""
    if a.options is None:
        return None
    budgets = limits(conn, repo.repo_key, a.budgets, repo)
    return opts.refusal(a.options, a.allowed_models, budgets)
