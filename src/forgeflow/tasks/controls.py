"""Operator controls as units of work: pause and resume the system, enable or disable
a repository, set its budget, and cancel, abort or release a task.

Each control runs in one transaction together with its ``requestId`` record, so a
repeated request returns the first answer and does nothing again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection

from forgeflow.domain.json import JsonObject
from forgeflow.domain.states import CANCELLABLE_STATES, TaskState
from forgeflow.store import audit, control, repos, tasks, usage
from forgeflow.store.sql import notify_tasks
from forgeflow.store.tasks import Transition

# A control's status and its JSON answer (stored, so a repeat gets the same).
Outcome = tuple[int, JsonObject]


@dataclass(frozen=True, slots=True)
class ControlRequest:
    request_id: str
    operator: str
    reason: str | None
    # "admin" for the admin token; "gitea" for a user signed in with Gitea.
    kind: str = "admin"

    @property
    def actor(self) -> str:
        return f"{self.kind}:{self.operator}"


Control = Callable[[Connection, "ControlRequest"], Outcome]


def run(
    conn: Connection,
    req: ControlRequest,
    action: str,
    target: str,
    fn: Callable[[Connection, ControlRequest], Outcome],
) -> Outcome:
    """Run ``fn`` once per ``requestId``; a repeat returns the stored answer."""
    earlier = control.find_request(conn, req.request_id)
    if earlier is not None:
        if earlier.action != action or earlier.target != target:
            # The ids are one namespace for the API and the pages: what someone else's
            # id was used for is told to the admin token only (a Gitea user would learn
            # a task or a repository they may not read).
            named = req.kind == "admin" or earlier.operator == req.actor
            used = f" for {earlier.action} on {earlier.target}" if named else " by another"
            return 409, {
                "error": "request_id_conflict",
                "message": f"requestId was already used{used}",
            }
        return earlier.status_code, {**earlier.response, "replayed": True}
    status, body = fn(conn, req)
    body = {**body, "operator": req.actor, "requestId": req.request_id}
    control.save_request(
        conn,
        request_id=req.request_id,
        action=action,
        target=target,
        operator=req.actor,
        status_code=status,
        response=body,
    )
    return status, body


def pause(conn: Connection, req: ControlRequest) -> Outcome:
    return 200, control.set_paused(conn, True, req.actor, req.reason).json()


def resume(conn: Connection, req: ControlRequest) -> Outcome:
    notify_tasks(conn)
    return 200, control.set_paused(conn, False, req.actor, req.reason).json()


def set_repo_status(
    new_status: str, repo_key: str
) -> Callable[[Connection, ControlRequest], Outcome]:
    def _apply(conn: Connection, req: ControlRequest) -> Outcome:
        notify_tasks(conn)
        if repos.get(conn, repo_key) is None:
            return 404, {"error": "repository_not_found", "message": f"no repository {repo_key}"}
        repos.set_status(conn, repo_key, new_status, req.actor, req.reason or "")
        row = repos.get(conn, repo_key)
        assert row is not None
        return 200, row.json()

    return _apply


def set_budget(
    repo_key: str, daily: int | None, monthly: int | None
) -> Callable[[Connection, ControlRequest], Outcome]:
    def _apply(conn: Connection, req: ControlRequest) -> Outcome:
        if repos.get(conn, repo_key) is None:
            return 404, {"error": "repository_not_found", "message": f"no repository {repo_key}"}
        usage.set_budget(conn, repo_key, daily, monthly)
        audit.append(
            conn,
            audit.AuditEvent(
                action="repository.budget",
                actor=req.actor,
                repo_key=repo_key,
                metadata={"dailyTokens": daily, "monthlyTokens": monthly, "reason": req.reason},
            ),
        )
        return 200, {"repoKey": repo_key, "dailyTokens": daily, "monthlyTokens": monthly}

    return _apply


def _task_control(
    task_id: str,
    *,
    action: str,
    allowed_from: frozenset[TaskState],
    to_state: TaskState,
    done: frozenset[TaskState],
    hint: str,
) -> Callable[[Connection, ControlRequest], Outcome]:
    def _apply(conn: Connection, req: ControlRequest) -> Outcome:
        row = tasks.get(conn, task_id)
        if row is None:
            return 404, {"error": "task_not_found", "message": f"no task {task_id}"}
        state = TaskState(row.state)
        if state in done:
            return 200, {"taskId": task_id, "state": state.value, "changed": False}
        if state not in allowed_from:
            return 409, {
                "error": "invalid_state",
                "taskId": task_id,
                "state": state.value,
                "message": hint,
            }
        updated = tasks.transition(
            conn,
            Transition(
                task_id=task_id,
                to_state=to_state,
                expected_version=row.state_version,
                actor=req.actor,
                action=action,
                metadata={"reason": req.reason, "requestId": req.request_id},
            ),
        )
        if to_state is TaskState.QUEUED:
            notify_tasks(conn)
        return 200, {"taskId": task_id, "state": updated.state, "changed": True}

    return _apply


def cancel(task_id: str) -> Callable[[Connection, ControlRequest], Outcome]:
    return _task_control(
        task_id,
        action="task.cancel",
        allowed_from=CANCELLABLE_STATES,
        to_state=TaskState.CANCELLED,
        done=frozenset({TaskState.CANCELLED}),
        hint="only a queued, waiting_user or blocked_workspace task can be cancelled; "
        "abort a running one",
    )


def abort(task_id: str) -> Callable[[Connection, ControlRequest], Outcome]:
    return _task_control(
        task_id,
        action="task.abort",
        allowed_from=frozenset({TaskState.RUNNING}),
        to_state=TaskState.ABORTING,
        done=frozenset({TaskState.ABORTING, TaskState.ABORTED}),
        hint="only a running task can be aborted; cancel a queued one",
    )


def release(task_id: str) -> Callable[[Connection, ControlRequest], Outcome]:
    return _task_control(
        task_id,
        action="task.release",
        allowed_from=frozenset({TaskState.BLOCKED_WORKSPACE}),
        to_state=TaskState.QUEUED,
        done=frozenset(),
        hint="only a blocked_workspace task can be released",
    )
