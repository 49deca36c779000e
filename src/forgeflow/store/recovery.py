"""Restart recovery: work whose worker is gone is moved on (its lease expired,
or a new incarnation of the same worker id started).

Interrupted work gets one more try after backoff, then fails (the retry rule of
``domain/retry.py``); an abort in flight ends as aborted; a reply check is redone.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Connection, select

from forgeflow.domain.json import JsonObject
from forgeflow.domain.records import Task
from forgeflow.domain.retry import RetryPolicy
from forgeflow.domain.states import IN_WORK_STATES, TaskState, values
from forgeflow.store import leases, rows
from forgeflow.store import tasks as task_q
from forgeflow.store import workers as worker_q
from forgeflow.store.schema import tasks
from forgeflow.store.tasks import StaleStateVersion, TaskFields, Transition
from forgeflow.store.types import utcnow


def recover(
    conn: Connection,
    *,
    owner: str,
    node_prefix: str,
    retry: RetryPolicy,
    ttl: timedelta | None = None,
) -> list[Task]:
    """Release dead leases and move interrupted work on.

    Work is interrupted when its lease expired or was left by a dead incarnation of
    this same worker node; work that holds no lease (``verifying_reply``) when its
    worker's heartbeat is older than ``ttl``. Safe to run at any time and from several
    workers at once: a task another worker moved first is left to it. Returns the tasks
    that changed.
    """
    now = utcnow()
    for held in leases.stale(conn, now=now, dead_owner_prefix=node_prefix, live_owner=owner):
        leases.expire(conn, held, reason="expired" if held.expires_at <= now else "owner_restarted")
    changed = []
    stmt = select(tasks).where(tasks.c.state.in_(values(IN_WORK_STATES)))
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    for task in rows.every(Task, conn, stmt, {}):
        lease = leases.get(conn, task.repo_key)
        if lease is not None and lease.task_id == task.task_id:
            continue  # a live worker still holds it
        if task.state == TaskState.VERIFYING_REPLY and not _verifier_gone(
            conn, task.claimed_by or "", owner=owner, node_prefix=node_prefix, ttl=ttl
        ):
            continue
        try:
            changed.append(interrupt(conn, task, retry, error_code="interrupted_by_restart"))
        except StaleStateVersion:
            continue  # another worker recovered it first
    return changed


def abandon(conn: Connection, task_id: str, *, owner: str, retry: RetryPolicy) -> bool:
    """The execution of a task crashed in this worker: give its lease back and move it
    on as an interruption, instead of leaving it until the lease expires."""
    task = task_q.get(conn, task_id)
    if task is None or task.claimed_by != owner:
        return False
    if task.state not in IN_WORK_STATES:
        return False
    if task.lease_id:
        leases.release(conn, task.repo_key, task.lease_id)
    interrupt(conn, task, retry, error_code="internal_error")
    return True


def _verifier_gone(
    conn: Connection, claimed_by: str, *, owner: str, node_prefix: str, ttl: timedelta | None
) -> bool:
    """Whether the worker verifying a reply is gone (no lease tells us for this state)."""
    if not claimed_by or claimed_by == owner:
        return False
    if claimed_by.startswith(node_prefix):
        return True  # this node's dead predecessor
    if ttl is None:
        return False
    holder = worker_q.get(conn, claimed_by.split("/", 1)[0])
    return holder is None or holder.heartbeat_at < utcnow() - ttl


def interrupt(conn: Connection, task: Task, retry: RetryPolicy, *, error_code: str) -> Task:
    """Interrupted work: tried again after backoff while the retry rule allows, else
    ``failed``. The task no longer holds a lease or a worker either way."""
    freed: TaskFields = {"lease_id": None}  # and its claim, by the move itself
    state = TaskState(task.state)
    if state is TaskState.ABORTING:
        return _recover(conn, task, TaskState.ABORTED, error_code, freed)
    if state is TaskState.VERIFYING_REPLY:
        # Verification only reads Gitea; redoing it costs no attempt.
        fields = freed | {"retry_step": state.value, "next_retry_at": utcnow()}
        return _recover(conn, task, TaskState.RETRY_WAIT, error_code, fields)
    again = retry.next_try(task.attempt, utcnow())
    if again is None:
        failed = freed | {"execution_error": f"{error_code} after {task.attempt} retries"}
        return _recover(conn, task, TaskState.FAILED, error_code, failed)
    fields = freed | {
        "attempt": again.attempt,
        "retry_step": TaskState.PREPARING.value,
        "next_retry_at": again.at,
    }
    return _recover(
        conn, task, TaskState.RETRY_WAIT, error_code, fields, {"attempt": again.attempt}
    )


def _recover(
    conn: Connection,
    task: Task,
    to: TaskState,
    error_code: str,
    fields: TaskFields,
    metadata: JsonObject | None = None,
) -> Task:
    return task_q.transition(
        conn,
        Transition(
            task_id=task.task_id,
            to_state=to,
            expected_version=task.state_version,
            actor="system",
            action="task.recover",
            error_code=error_code,
            fields=fields,
            metadata=metadata,
        ),
    )
