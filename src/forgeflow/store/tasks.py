"""Queries of the ``tasks`` table, and :func:`transition`: the one writer of task state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict

from sqlalchemy import Connection, bindparam, select, update

from forgeflow.domain.ids import ResourceRef
from forgeflow.domain.json import JsonObject
from forgeflow.domain.records import Refs, Repository, Task
from forgeflow.domain.states import IN_WORK_STATES, IllegalTransition, TaskState, is_allowed
from forgeflow.store import audit, events, repos, rows, sessions
from forgeflow.store.schema import tasks
from forgeflow.store.sql import insert_row
from forgeflow.store.types import utcnow

__all__ = ["IllegalTransition", "StaleStateVersion", "TaskNotFound", "Transition", "transition"]


class TaskFields(TypedDict, total=False):
    """Columns a transition may set beside the state, typed as the record's; anything
    else is not a transition's business (and the state itself can only be set through
    ``to_state``)."""

    attempt: int
    reply_attempt: int
    thread_id: str | None
    turn_id: str | None
    lease_id: str | None
    next_retry_at: datetime | None
    execution_error: str | None
    reply_error: str | None
    refs: Refs | None
    retry_step: str | None
    turn_count: int
    claimed_by: str | None


_TRANSITION_FIELDS = frozenset(TaskFields.__annotations__)


class StaleStateVersion(Exception):
    """Another writer moved the task first: the caller's view is out of date."""

    code = "stale_state_version"

    def __init__(self, task_id: str, expected: int, actual: int | None) -> None:
        super().__init__(f"task {task_id}: expected stateVersion {expected}, found {actual}")
        self.task_id = task_id
        self.expected = expected
        self.actual = actual


class TaskNotFound(Exception):
    code = "task_not_found"


@dataclass(frozen=True, slots=True)
class Transition:
    """A requested move of one task, with what the audit event should say."""

    task_id: str
    to_state: TaskState
    expected_version: int
    actor: str = "system"
    action: str = "task.transition"
    error_code: str | None = None
    fields: TaskFields | None = None
    metadata: JsonObject | None = None
    delivery_id: str | None = None
    comment_id: int | None = None
    # The state the caller saw; with it the move is one UPDATE … RETURNING.
    from_state: TaskState | None = None


def transition(conn: Connection, t: Transition) -> Task:
    """Move a task along the transition table, with compare-and-swap and audit.

    Illegal moves and stale versions write an alert event and raise; the alert is
    part of the caller's transaction, so callers that want the alert kept commit
    before re-raising (see ``Store.transition``).
    """
    # Column values, handed to SQLAlchemy as they are (hence ``object``).
    fields: dict[str, object] = dict(t.fields or {})
    refs = fields.get("refs")
    if isinstance(refs, Refs):
        fields["refs"] = refs.json()  # the column keeps the record's JSON
    unknown = set(fields) - _TRANSITION_FIELDS
    if unknown:
        raise ValueError(f"transition cannot set {sorted(unknown)}")
    if t.to_state not in IN_WORK_STATES:
        # Out of work, the task is no worker's: the move itself gives its claim back,
        # so no caller writes that by hand (or forgets to).
        fields["claimed_by"] = None
    updated = None
    if t.from_state is not None and is_allowed(t.from_state.value, t.to_state.value):
        # The caller knows the state it moves from: the compare-and-swap alone decides,
        # and the row is read back only when it refused (to say why).
        from_state = t.from_state.value
        updated = _swap(conn, t, from_state, fields)
    if updated is None:
        current = get(conn, t.task_id)
        if current is None:
            raise TaskNotFound(t.task_id)
        if not is_allowed(current.state, t.to_state.value):
            _refuse(conn, t, current, "illegal_transition", {"requestedBy": t.action})
            raise IllegalTransition(t.task_id, current.state, t.to_state.value)
        from_state = current.state
        updated = _swap(conn, t, from_state, fields)
        if updated is None:
            metadata: JsonObject = {"requestedBy": t.action, "expectedVersion": t.expected_version}
            _refuse(conn, t, current, "stale_state_version", metadata)
            raise StaleStateVersion(t.task_id, t.expected_version, current.state_version)
    row_now = updated
    audit.append(
        conn,
        audit.AuditEvent(
            action=t.action,
            state_version=row_now.state_version,
            error_code=t.error_code,
            metadata=t.metadata or {},
            turn_id=row_now.turn_id,
            task_id=t.task_id,
            session_key=row_now.session_key,
            repo_key=row_now.repo_key,
            actor=t.actor,
            from_state=from_state,
            to_state=t.to_state.value,
            delivery_id=t.delivery_id,
            comment_id=t.comment_id,
        ),
    )
    _emit_events(conn, row_now, from_state)
    return row_now


# Built once: the SET columns come from the parameters of each call, and a statement
# built per call cost more CPU than SQLite spends on the update.
_SWAP = (
    update(tasks)
    .where(tasks.c.task_id == bindparam("b_task_id"))
    .where(tasks.c.state_version == bindparam("b_version"))
    .where(tasks.c.state == bindparam("b_from"))
    .returning(*tasks.c)
)


def _swap(
    conn: Connection, t: Transition, from_state: str, fields: Mapping[str, object]
) -> Task | None:
    """The compare-and-swap itself; the row after it, or None when it did not apply."""
    values = {
        **fields,
        "state": t.to_state.value,
        "state_version": t.expected_version + 1,
        "updated_at": utcnow(),
        "error_code": t.error_code,
        "b_task_id": t.task_id,
        "b_version": t.expected_version,
        "b_from": from_state,
    }
    return rows.first(Task, conn, _SWAP, values)


def _refuse(
    conn: Connection, t: Transition, current: Task, code: str, metadata: JsonObject
) -> None:
    audit.append(
        conn,
        audit.AuditEvent(
            action="task.transition_refused",
            error_code=code,
            state_version=current.state_version,
            metadata=metadata,
            task_id=t.task_id,
            session_key=current.session_key,
            repo_key=current.repo_key,
            actor=t.actor,
            from_state=current.state,
            to_state=t.to_state.value,
            delivery_id=t.delivery_id,
            comment_id=t.comment_id,
        ),
    )


_EVENT_OF_STATE = {
    TaskState.QUEUED: "TaskCreated",
    TaskState.SUCCEEDED: "TaskCompleted",
    TaskState.SUCCEEDED_WITH_REST_FALLBACK: "TaskCompleted",
    TaskState.FAILED: "TaskFailed",
    TaskState.FAILED_REPLY: "TaskFailed",
    TaskState.CANCELLED: "TaskCancelled",
    TaskState.ABORTED: "TaskCancelled",
}


def _emit_events(conn: Connection, task: Task, from_state: str) -> None:
    """Domain events of a state change, in the same transaction as the change."""
    payload: JsonObject = {
        "taskId": task.task_id,
        "repoKey": task.repo_key,
        "resourceKey": task.resource_key,
        "fromState": from_state,
        "toState": task.state,
        "errorCode": task.error_code,
        "author": task.author,
    }
    key = f"{task.task_id}:{task.state_version}"
    items = [("TaskStatusChanged", key)]
    specific = _EVENT_OF_STATE.get(TaskState(task.state))
    if specific == "TaskCreated" and from_state != TaskState.RECEIVED:
        specific = None  # back in the queue (released, retried), not a new task
    if specific is not None:
        items.append((specific, key))
    events.record_unique(conn, items, payload=payload, repo_key=task.repo_key)


def insert_received(conn: Connection, values: Mapping[str, object]) -> None:
    """Create a task in ``received``; the caller moves it on with :func:`transition`."""
    now = utcnow()
    insert_row(
        conn,
        tasks,
        {
            "state": TaskState.RECEIVED.value,
            "attempt": 0,
            "reply_attempt": 0,
            "created_at": now,
            "updated_at": now,
            "state_version": 1,
            **values,
        },
    )


class RepositoryDisabled(Exception):
    code = "repository_disabled"


def create_pipeline_task(
    conn: Connection,
    *,
    task_id: str,
    resource: ResourceRef,
    instruction: str,
    run_id: str,
    clone_url: str | None = None,
    default_branch: str | None = None,
    workspace_path: str | None = None,
    session_key: str | None = None,
    mode: str | None = None,
) -> Task:
    """An agent task asked for by a pipeline step, queued in the caller's transaction.

    It has no delivery and no comment (``delivery_key`` and ``comment_id`` NULL); its
    author is ``pipeline:<runId>``. It is created in ``received`` and queued through
    :func:`transition` like every other task. Idempotent on ``task_id``. The repository
    is registered when it is not yet (then ``clone_url``/``default_branch``/
    ``workspace_path`` are needed); a disabled repository refuses.
    """
    existing = get(conn, task_id)
    if existing is not None:
        return existing
    repo = _registered(conn, resource, clone_url, default_branch, workspace_path)
    if repo.status == repos.DISABLED:
        raise RepositoryDisabled(f"repository {resource.repo.key} is disabled")
    if session_key is None:
        session_key = sessions.ensure(conn, resource).session_key
    actor = f"pipeline:{run_id}"
    insert_received(
        conn,
        {
            "task_id": task_id,
            "delivery_key": None,
            "repo_key": resource.repo.key,
            "resource_key": resource.key,
            "session_key": session_key,
            "comment_id": None,
            "author": actor,
            "instruction": instruction,
            "refs": None,
            "mode": mode,
        },
    )
    return transition(
        conn,
        Transition(
            task_id=task_id,
            to_state=TaskState.QUEUED,
            expected_version=1,
            actor=actor,
            action="pipeline.task.create",
            metadata={"runId": run_id, "mode": mode, "sessionKey": session_key},
        ),
    )


def _registered(
    conn: Connection,
    resource: ResourceRef,
    clone_url: str | None,
    default_branch: str | None,
    workspace_path: str | None,
) -> Repository:
    """The repository of a pipeline's task, registered now when it is not yet."""
    known = repos.get(conn, resource.repo.key)
    if known is not None:
        return known
    if clone_url is None or default_branch is None or workspace_path is None:
        raise ValueError(f"repository {resource.repo.key} is not registered")
    return repos.register(
        conn,
        repo=resource.repo,
        clone_url=clone_url,
        default_branch=default_branch,
        workspace_path=workspace_path,
    )


_GET = select(tasks).where(tasks.c.task_id == bindparam("task_id"))


def get(conn: Connection, task_id: str) -> Task | None:
    return rows.first(Task, conn, _GET, {"task_id": task_id})


def running_in_session(conn: Connection, session_key: str) -> Task | None:
    """The task whose turn runs in a session now, if any."""
    return rows.first(
        Task,
        conn,
        select(tasks).where(
            tasks.c.session_key == session_key, tasks.c.state == TaskState.RUNNING.value
        ),
        {},
    )


def aborting_among(conn: Connection, task_ids: list[str]) -> set[str]:
    """Which of ``task_ids`` are in ``aborting`` (one poll for all running turns)."""
    found = conn.execute(
        select(tasks.c.task_id)
        .where(tasks.c.task_id.in_(task_ids))
        .where(tasks.c.state == TaskState.ABORTING.value)
    )
    return {r[0] for r in found}
