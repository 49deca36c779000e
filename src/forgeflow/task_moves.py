"""How a running task's steps write: state moves, audit rows, retry-or-fail (§5.3).

Shared by the preparing step (``preparing.py``) and the rest of the flow
(``execution.py``); every state change goes through the store's transition function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection

from forgeflow.domain.retry import RetryPolicy
from forgeflow.domain.states import ACTIVE_STATES, TaskState
from forgeflow.store import Store, Transition
from forgeflow.store import audit as audit_q
from forgeflow.store.audit import AuditEvent
from forgeflow.store.types import utcnow

S = TaskState


def task_event(task: dict[str, Any], action: str, **kw: Any) -> AuditEvent:
    """An audit row about ``task``, stamped now (it may be written a little later)."""
    return AuditEvent(
        action=action,
        task_id=task["task_id"],
        session_key=task["session_key"],
        repo_key=task["repo_key"],
        at=utcnow(),
        **kw,
    )


class TaskMoves:
    def __init__(self, store: Store, retry: RetryPolicy) -> None:
        self.store = store
        self.retry = retry

    async def move(
        self,
        task: dict[str, Any],
        to: TaskState,
        *,
        action: str,
        error_code: str | None = None,
        fields: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        before: Callable[[Connection], object] | None = None,
        events: Sequence[AuditEvent] = (),
    ) -> dict[str, Any]:
        release = None
        if to not in ACTIVE_STATES and task.get("lease_id"):
            release = (task["repo_key"], task["lease_id"])
            fields = {"lease_id": None, **(fields or {})}
        return await self.store.transition(
            Transition(
                task["task_id"],
                to,
                task["state_version"],
                action=action,
                error_code=error_code,
                fields=fields,
                metadata=metadata,
            ),
            release=release,
            before=before,
            events=events,
        )

    async def audit(self, task: dict[str, Any], action: str, **kw: Any) -> None:
        event = task_event(task, action, **kw)
        await self.store.write(lambda c: audit_q.append(c, event))

    async def retry_or_fail(
        self,
        task: dict[str, Any],
        code: str,
        detail: str,
        *,
        step: TaskState = S.PREPARING,
        events: Sequence[AuditEvent] = (),
    ) -> dict[str, Any]:
        attempt = int(task["attempt"]) + 1
        if attempt > self.retry.max_retries:
            return await self.move(
                task,
                S.FAILED,
                action="task.fail",
                error_code=code,
                fields={"execution_error": detail, "claimed_by": None},
                events=events,
            )
        return await self.move(
            task,
            S.RETRY_WAIT,
            action="task.retry",
            error_code=code,
            fields={
                "attempt": attempt,
                "retry_step": step.value,
                "claimed_by": None,
                "next_retry_at": utcnow() + self.retry.delay(attempt),
                "execution_error": detail,
            },
            metadata={"attempt": attempt},
            events=events,
        )
