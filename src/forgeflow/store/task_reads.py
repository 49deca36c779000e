"""Reads of the ``tasks`` table for the dashboard, the control API and ops: a filtered
page of tasks, counts by state, the oldest queued task, tokens used. None of them
writes; ``tasks.py`` keeps the task's own queries and its one writer of state."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, func, select
from sqlalchemy.sql.elements import ColumnElement

from forgeflow.domain.records import Task
from forgeflow.domain.states import TaskState
from forgeflow.store import rows
from forgeflow.store.schema import tasks


@dataclass(frozen=True, slots=True)
class TaskFilter:
    repo_key: str | None = None
    resource_key: str | None = None
    state: str | None = None
    limit: int = 50
    offset: int = 0
    # Only these repositories (a Gitea user's readable ones); None: every repository.
    repo_keys: frozenset[str] | None = None


def list_page(conn: Connection, f: TaskFilter) -> tuple[list[Task], int]:
    conds: list[ColumnElement[bool]] = []
    if f.repo_keys is not None:
        conds.append(tasks.c.repo_key.in_(sorted(f.repo_keys)))
    if f.repo_key is not None:
        conds.append(tasks.c.repo_key == f.repo_key)
    if f.resource_key is not None:
        conds.append(tasks.c.resource_key == f.resource_key)
    if f.state is not None:
        conds.append(tasks.c.state == f.state)
    total = conn.execute(select(func.count()).select_from(tasks).where(*conds)).scalar_one()
    stmt = (
        select(tasks)
        .where(*conds)
        .order_by(tasks.c.created_at.desc(), tasks.c.task_id)
        .limit(f.limit)
        .offset(f.offset)
    )
    return rows.every(Task, conn, stmt, {}), int(total)


def counts_by_state(conn: Connection) -> dict[str, int]:
    rows = conn.execute(select(tasks.c.state, func.count()).group_by(tasks.c.state))
    return {state: int(n) for state, n in rows}


def oldest_queued_at(conn: Connection) -> datetime | None:
    value: datetime | None = conn.execute(
        select(func.min(tasks.c.created_at)).where(tasks.c.state == TaskState.QUEUED.value)
    ).scalar_one()
    return value


def tokens_since(conn: Connection, since: datetime) -> int:
    """Input plus output tokens of the tasks updated at or after ``since``."""
    value = conn.execute(
        select(func.coalesce(func.sum(tasks.c.input_tokens + tasks.c.output_tokens), 0)).where(
            tasks.c.updated_at >= since
        )
    ).scalar_one()
    return int(value)
