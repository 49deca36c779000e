"""Rows become typed records here, and only here.

A record's fields are named as its table's columns (a test holds the two together), so
a row of ``select(table)`` becomes its record by name; the few columns whose record
type is not the column's (a task's state, its refs) are converted here too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import Connection, RowMapping

from forgeflow.domain.bookkeeping import (
    AuditEntry,
    Comment,
    Control,
    ControlRequest,
    Lease,
    Push,
    StoredEvent,
    UiSession,
    Worker,
)
from forgeflow.domain.pipeline_records import (
    ArmedTrigger,
    HookCall,
    HookDelivery,
    PipelineRun,
    PipelineStep,
    PipelineTemplate,
    PipelineTrigger,
    PlannedStep,
)
from forgeflow.domain.records import (
    Delivery,
    Refs,
    Repository,
    Session,
    Task,
    TranscriptEntry,
    Turn,
)
from forgeflow.domain.review_record import BotReview, ReviewRecord, ReviewRecordError
from forgeflow.domain.states import TaskState

R = TypeVar(
    "R",
    Task,
    Repository,
    Session,
    Turn,
    Delivery,
    TranscriptEntry,
    AuditEntry,
    Comment,
    Push,
    Control,
    ControlRequest,
    Lease,
    Worker,
    UiSession,
    StoredEvent,
    PipelineTrigger,
    ArmedTrigger,
    PipelineTemplate,
    HookCall,
    HookDelivery,
)


def _task_values(row: Mapping[str, Any] | RowMapping) -> dict[str, Any]:
    values = dict(row)
    values["state"] = TaskState(values["state"])
    refs = values["refs"]
    if refs is not None and not isinstance(refs, Refs):
        values["refs"] = Refs.of_json(refs)
    return values


def record(kind: type[R], row: Mapping[str, Any] | RowMapping) -> R:
    if kind is Task:
        return kind(**_task_values(row))
    if kind is AuditEntry:
        return kind(**{**row, "metadata": row["metadata"] or {}})
    return kind(**row)


def first(kind: type[R], conn: Connection, stmt: Any, params: Mapping[str, Any]) -> R | None:
    """The first row of ``stmt`` as a record, or None."""
    row = conn.execute(stmt, dict(params)).mappings().first()
    return None if row is None else record(kind, row)


def every(kind: type[R], conn: Connection, stmt: Any, params: Mapping[str, Any]) -> list[R]:
    """Every row of ``stmt`` as a record."""
    return [record(kind, row) for row in conn.execute(stmt, dict(params)).mappings()]


# Runs and steps are built from a row's values in column order (their fields are; a
# test holds them together): a step is read several times per execution, and building
# it by name from the row's mapping cost more than the read.
def pipeline_run(values: Sequence[Any]) -> PipelineRun:
    return PipelineRun(*values)


def pipeline_step(values: Sequence[Any]) -> PipelineStep:
    return PipelineStep(*values)


def planned_step(values: Sequence[Any]) -> PlannedStep:
    return PlannedStep(*values)


def bot_review(row: Comment) -> BotReview:
    """A ``comments`` row of kind ``review`` as the review it records; a body that is
    not a record forgeflow wrote is kept as the error, not raised (a page still shows
    the row)."""
    record, error = None, None
    try:
        record = ReviewRecord.parse(row.body or "")
    except ReviewRecordError as exc:
        error = str(exc)
    return BotReview(
        task_id=row.task_id,
        resource_key=row.resource_key,
        status=row.status,
        review_id=row.comment_id,
        created_at=row.created_at,
        updated_at=row.updated_at,
        record=record,
        error=error,
    )
