"""How a running task's steps write: state moves, audit rows, retry-or-fail.

Shared by the steps of a task's run (``prepare.py``, ``turn.py``, ``verify.py``);
every state change goes through the store's transition function, so a move is
recorded (with its audit row) in the same transaction that makes it, and a move out of
work gives the task's claim back there too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from sqlalchemy import Connection

from forgeflow.domain.json import JsonObject
from forgeflow.domain.records import Task
from forgeflow.domain.retry import RetryPolicy
from forgeflow.domain.states import ACTIVE_STATES, TaskState
from forgeflow.store import Store, Transition
from forgeflow.store import audit as audit_q
from forgeflow.store.audit import AuditEvent
from forgeflow.store.scheduling import Claim
from forgeflow.store.tasks import TaskFields
from forgeflow.store.types import utcnow

S = TaskState


def task_event(task: Task, action: str, **kw: Any) -> AuditEvent:
    """An audit row about ``task``, stamped now (it may be written a little later)."""
    return AuditEvent(
        action=action,
        task_id=task.task_id,
        session_key=task.session_key,
        repo_key=task.repo_key,
        at=utcnow(),
        **kw,
    )


class Handoff(Protocol):
    """Who takes a repository over when a task gives its lease back (``dispatch.Dispatcher``).

    The next task is claimed in the transaction that releases the lease: the repository
    never waits for a scheduler round between two of its tasks, and the database's
    one-lease-per-repository rule still decides.
    """

    def claimer(
        self, repo_key: str, released_by: str
    ) -> Callable[[Connection], list[Claim]] | None:
        """The unit that claims the repository's next task (None: do not claim now);
        built on the event loop, run on the writer thread inside the releasing
        transaction."""
        ...

    def started(self, claims: list[Claim]) -> None:
        """Run what that unit claimed (on the event loop, after the commit)."""
        ...


class TaskMoves:
    def __init__(self, store: Store, retry: RetryPolicy, handoff: Handoff | None = None) -> None:
        self.store = store
        self.retry = retry
        self.handoff = handoff

    async def move(
        self,
        task: Task,
        to: TaskState,
        *,
        action: str,
        error_code: str | None = None,
        fields: TaskFields | None = None,
        metadata: JsonObject | None = None,
        before: Callable[[Connection], object] | None = None,
        events: Sequence[AuditEvent] = (),
        unless_moved: bool = False,
    ) -> Task:
        """Move ``task`` to ``to``; leaving the active states gives the repository's
        lease back and claims its next task in the same transaction. ``unless_moved``:
        see :meth:`Store.transition`."""
        release = None
        claim_next = None
        if to not in ACTIVE_STATES and task.lease_id:
            release = (task.repo_key, task.lease_id)
            fields = {"lease_id": None, **(fields or {})}
            if self.handoff is not None:
                claim_next = self.handoff.claimer(task.repo_key, task.task_id)
        claimed: list[Claim] = []
        after = None
        if claim_next is not None:
            unit = claim_next

            def after(c: Connection) -> None:
                claimed.extend(unit(c))

        row = await self.store.transition(
            Transition(
                task.task_id,
                to,
                task.state_version,
                action=action,
                error_code=error_code,
                fields=fields,
                metadata=metadata,
            ),
            release=release,
            before=before,
            events=events,
            after=after,
            unless_moved=unless_moved,
        )
        if claimed and self.handoff is not None:
            self.handoff.started(claimed)
        return row

    async def audit(self, task: Task, action: str, **kw: Any) -> None:
        event = task_event(task, action, **kw)
        await self.store.write(lambda c: audit_q.append(c, event))

    async def retry_or_fail(
        self,
        task: Task,
        code: str,
        detail: str,
        *,
        step: TaskState = S.PREPARING,
        events: Sequence[AuditEvent] = (),
        before: Callable[[Connection], object] | None = None,
    ) -> Task:
        retry = self.retry.next_try(task.attempt, utcnow())
        if retry is None:
            return await self.move(
                task,
                S.FAILED,
                action="task.fail",
                error_code=code,
                fields={"execution_error": detail},
                events=events,
                before=before,
            )
        return await self.move(
            task,
            S.RETRY_WAIT,
            action="task.retry",
            error_code=code,
            fields={
                "attempt": retry.attempt,
                "retry_step": step.value,
                "next_retry_at": retry.at,
                "execution_error": detail,
            },
            metadata={"attempt": retry.attempt},
            events=events,
            before=before,
        )
