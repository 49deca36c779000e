"""The Workflow Store: every table behind one async facade.

Query modules (``tasks``, ``deliveries``, ``repos``, …) hold the SQL of one table each
and take a ``Connection``; this facade runs them as units of work on the database's
threads. Callers never see a driver.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TypeVar

from sqlalchemy import Connection, text

from forgeflow.domain.records import Task
from forgeflow.domain.states import TaskState
from forgeflow.store import (
    audit,
    control,
    deliveries,
    details,
    leases,
    migrate,
    repos,
    sessions,
    tasks,
)
from forgeflow.store.db import Database, StoreUnavailable
from forgeflow.store.tasks import StaleStateVersion, TaskNotFound, Transition

T = TypeVar("T")

__all__ = [
    "Database",
    "StaleStateVersion",
    "Store",
    "StoreUnavailable",
    "TaskNotFound",
    "Transition",
    "audit",
    "control",
    "deliveries",
    "details",
    "repos",
    "sessions",
    "tasks",
]


class Store:
    def __init__(self, url: str) -> None:
        self.db = Database(url)

    @property
    def dialect(self) -> str:
        return self.db.dialect

    def libpq_url(self) -> str:
        """The database URL for a plain libpq connection (LISTEN/NOTIFY)."""
        from sqlalchemy.engine import make_url

        url = make_url(self.db.url).set(drivername="postgresql")
        return url.render_as_string(hide_password=False)

    def migrate(self) -> None:
        migrate.upgrade(self.db.writer)

    def is_current(self) -> bool:
        return migrate.is_current(self.db.reader)

    def close(self) -> None:
        self.db.dispose()

    async def write(self, fn: Callable[[Connection], T]) -> T:
        return await self.db.write(fn)

    async def read(self, fn: Callable[[Connection], T]) -> T:
        return await self.db.read(fn)

    async def ping(self) -> bool:
        def _ping(conn: Connection) -> bool:
            return bool(conn.execute(text("SELECT 1")).scalar_one() == 1)

        return await self.db.read(_ping)

    async def transition(
        self,
        t: Transition,
        *,
        release: tuple[str, str] | None = None,
        before: Callable[[Connection], object] | None = None,
        events: Sequence[audit.AuditEvent] = (),
        after: Callable[[Connection], object] | None = None,
        unless_moved: bool = False,
    ) -> Task:
        """Apply one transition; a refused one keeps its audit alert and re-raises.

        ``release`` = (repoKey, leaseId) gives the lease back in the same transaction,
        so a task never leaves its active state while still holding the repository.
        ``before`` and ``events`` (audit rows of the steps that led here) are written
        first, in the same transaction: one commit instead of several. ``after`` runs
        last, only when the move applied (e.g. the claim of the repository's next task
        in the transaction that gives its lease back). ``unless_moved``: when another
        writer moved the task since ``t.expected_version`` (an operator's abort), nothing
        but ``before`` is applied and the task's current row is returned instead of
        raising (the caller tells by its state version).
        """
        refused: list[Exception] = []

        def _apply(conn: Connection) -> Task | None:
            if before is not None:
                before(conn)
            for event in events:
                audit.append(conn, event)
            move = t
            if unless_moved:
                current = tasks.get(conn, t.task_id)
                if current is None or current.state_version != t.expected_version:
                    return current
                move = dataclasses.replace(t, from_state=TaskState(current.state))
            try:
                row = tasks.transition(conn, move)
            except (StaleStateVersion, tasks.IllegalTransition) as exc:
                refused.append(exc)
                return None
            if release is not None:
                leases.release(conn, *release)
            if after is not None:
                after(conn)
            return row

        row = await self.db.write(_apply)
        if refused:
            raise refused[0]
        if row is None:
            raise TaskNotFound(t.task_id)
        return row
