"""Read-only views the API answers and the admin pages show alike: the overview and
a task's detail (its comments, turns, errors and audit trail)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, select

from forgeflow.domain.bookkeeping import AuditEntry, Comment, Control
from forgeflow.domain.json import JsonObject
from forgeflow.domain.records import Repository, Task, Turn
from forgeflow.domain.states import (
    ACTIVE_STATES,
    CLAIMABLE_STATES,
    FAILED_STATES,
    TERMINAL_STATES,
    TaskState,
    values,
)
from forgeflow.store import audit, control, pushes, repos, scheduling, task_reads, tasks, turns
from forgeflow.store import rows as rows_mod
from forgeflow.store.bookkeeping_schema import comments
from forgeflow.store.schema import tasks as tasks_table
from forgeflow.store.types import iso, utcnow


def comments_of(conn: Connection, task_id: str) -> list[Comment]:
    stmt = select(comments).where(comments.c.task_id == task_id).order_by(comments.c.created_at)
    return rows_mod.every(Comment, conn, stmt, {})


@dataclass(frozen=True, slots=True)
class Overview:
    """The system at a glance: the control switch, active work, the queue, failures."""

    control: Control
    active: list[Task]
    counts: dict[str, int]
    oldest_queued: datetime | None
    repositories: list[Repository]
    failures: list[Task]  # the newest ten, newest first

    def json(self) -> JsonObject:
        """What ``GET /overview`` answers; the overview page shows the same."""
        oldest = self.oldest_queued
        return {
            **self.control.json(),
            "runningSlots": None,  # no global cap: only one active task per repository
            "running": [running_json(t) for t in self.active],
            "queue": {
                "length": self.counts.get(TaskState.QUEUED.value, 0),
                "oldestQueuedAt": iso(oldest),
                "oldestQueuedAgeSeconds": (utcnow() - oldest).total_seconds() if oldest else None,
            },
            "tasksByState": dict(self.counts),
            "repositories": {
                "active": sum(1 for r in self.repositories if r.status == repos.ACTIVE),
                "disabled": sum(1 for r in self.repositories if r.status == repos.DISABLED),
            },
            "recentFailures": [t.json() for t in self.failures],
        }


def running_json(t: Task) -> JsonObject:
    return {"repoKey": t.repo_key, "taskId": t.task_id, "state": t.state}


def overview(conn: Connection) -> Overview:
    active = [
        r
        for state in values(ACTIVE_STATES)
        for r in task_reads.list_page(conn, task_reads.TaskFilter(state=state, limit=500))[0]
    ]
    failures = [
        r
        for state in values(FAILED_STATES)
        for r in task_reads.list_page(conn, task_reads.TaskFilter(state=state, limit=10))[0]
    ]
    failures.sort(key=lambda t: t.updated_at, reverse=True)
    return Overview(
        control=control.get(conn),
        active=active,
        counts=task_reads.counts_by_state(conn),
        oldest_queued=task_reads.oldest_queued_at(conn),
        repositories=repos.list_all(conn),
        failures=failures[:10],
    )


def overview_snapshot(conn: Connection) -> JsonObject:
    """What ``GET /overview`` answers."""
    return overview(conn).json()


@dataclass(frozen=True, slots=True)
class TaskDetail:
    """A task with what came of it: its turns, comments and audit trail."""

    task: Task
    queue_position: int | None  # tasks ahead of it on its repository; only while it waits
    turns: list[Turn]
    comments: list[Comment]
    audit: list[AuditEntry]

    def json(self) -> JsonObject:
        """What ``GET /tasks/{taskId}`` answers; the task page shows the same."""
        row = self.task
        return {
            "task": row.json(),
            "terminal": TaskState(row.state) in TERMINAL_STATES,
            "queuePosition": self.queue_position,
            "turns": [t.json() for t in self.turns],
            "comments": [c.json() for c in self.comments],
            "errors": self.errors(),
            "audit": [e.json() for e in self.audit],
        }

    def errors(self) -> JsonObject:
        row = self.task
        return {
            "errorCode": row.error_code,
            "executionError": row.execution_error,
            "replyError": row.reply_error,
        }


def task_detail(conn: Connection, task_id: str) -> TaskDetail | None:
    row = tasks.get(conn, task_id)
    if row is None:
        return None
    waiting = row.state in CLAIMABLE_STATES
    return TaskDetail(
        task=row,
        queue_position=scheduling.queue_position(conn, row) if waiting else None,
        turns=turns.of_task(conn, task_id),
        comments=comments_of(conn, task_id),
        audit=audit.query(conn, audit.AuditQuery(task_id=task_id, limit=1000)),
    )


def task_detail_snapshot(conn: Connection, task_id: str) -> JsonObject | None:
    """What ``GET /tasks/{taskId}`` answers, or None for an unknown task."""
    detail = task_detail(conn, task_id)
    return detail.json() if detail is not None else None


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
