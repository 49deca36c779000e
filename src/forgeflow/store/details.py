"""Read-only views the API answers and the admin pages show alike: the overview and
a task's detail (its comments, turns, errors and audit trail)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select

from forgeflow.domain.bookkeeping import Comment
from forgeflow.domain.records import Task, Turn
from forgeflow.domain.states import (
    ACTIVE_STATES,
    CLAIMABLE_STATES,
    FAILED_STATES,
    TERMINAL_STATES,
    TaskState,
    values,
)
from forgeflow.store import audit, control, pushes, repos, scheduling, tasks, turns
from forgeflow.store import rows as rows_mod
from forgeflow.store.schema import comments
from forgeflow.store.schema import tasks as tasks_table
from forgeflow.store.types import iso, utcnow


def comments_of(conn: Connection, task_id: str) -> list[Comment]:
    stmt = select(comments).where(comments.c.task_id == task_id).order_by(comments.c.created_at)
    return rows_mod.every(Comment, conn, stmt, {})


def overview_snapshot(conn: Connection) -> dict[str, Any]:
    """What ``GET /overview`` answers; the admin pages show the same."""
    ctl = control.get(conn)
    counts = tasks.counts_by_state(conn)
    active = [
        r
        for state in values(ACTIVE_STATES)
        for r in tasks.list_page(conn, tasks.TaskFilter(state=state, limit=500))[0]
    ]
    failures = [
        r
        for state in values(FAILED_STATES)
        for r in tasks.list_page(conn, tasks.TaskFilter(state=state, limit=10))[0]
    ]
    failures.sort(key=lambda t: t.updated_at, reverse=True)
    oldest = tasks.oldest_queued_at(conn)
    repo_rows = repos.list_all(conn)
    return {
        **ctl.json(),
        "runningSlots": None,  # no global cap: only one active task per repository
        "running": [{"repoKey": t.repo_key, "taskId": t.task_id, "state": t.state} for t in active],
        "queue": {
            "length": counts.get(TaskState.QUEUED.value, 0),
            "oldestQueuedAt": iso(oldest),
            "oldestQueuedAgeSeconds": (utcnow() - oldest).total_seconds() if oldest else None,
        },
        "tasksByState": counts,
        "repositories": {
            "active": sum(1 for r in repo_rows if r.status == repos.ACTIVE),
            "disabled": sum(1 for r in repo_rows if r.status == repos.DISABLED),
        },
        "recentFailures": [t.json() for t in failures[:10]],
    }


def task_detail_snapshot(conn: Connection, task_id: str) -> dict[str, Any] | None:
    """What ``GET /tasks/{taskId}`` answers, or None for an unknown task."""
    row = tasks.get(conn, task_id)
    if row is None:
        return None
    return {
        "task": row.json(),
        "terminal": TaskState(row.state) in TERMINAL_STATES,
        # Tasks ahead of it on its repository (0 = next); only while it waits.
        "queuePosition": scheduling.queue_position(conn, row)
        if row.state in CLAIMABLE_STATES
        else None,
        "turns": [t.json() for t in turns.of_task(conn, task_id)],
        "comments": [c.json() for c in comments_of(conn, task_id)],
        "errors": {
            "errorCode": row.error_code,
            "executionError": row.execution_error,
            "replyError": row.reply_error,
        },
        "audit": [
            e.json() for e in audit.query(conn, audit.AuditQuery(task_id=task_id, limit=1000))
        ],
    }


@dataclass(frozen=True, slots=True)
class Exchange:
    """One mention of a session and what came of it, for the session page."""

    task: Task
    turns: list[Turn]
    comments: list[Comment]
    pushes: list[pushes.Push]


def conversation(conn: Connection, session_key: str, limit: int = 200) -> list[Exchange]:
    """A session's mentions, oldest first, each with its turns, the bot's comments and
    the pushes of its work."""
    rows = conn.execute(
        select(tasks_table)
        .where(tasks_table.c.session_key == session_key)
        .order_by(tasks_table.c.created_at)
        .limit(limit)
    ).mappings()
    return [
        Exchange(
            task,
            turns.of_task(conn, task.task_id),
            comments_of(conn, task.task_id),
            pushes.of_task(conn, task.task_id),
        )
        for task in (rows_mod.record(Task, row) for row in rows)
    ]
