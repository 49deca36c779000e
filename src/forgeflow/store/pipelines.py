"""The SQL of pipeline runs and their steps (templates and their triggers are in
:mod:`forgeflow.store.pipeline_templates`).

Each function takes the caller's ``Connection`` so a unit of work composes several of
them into one transaction. Every change of a run or step row is a compare-and-swap on
its ``version``; :func:`lock_run` takes the run row first (``FOR UPDATE`` on
PostgreSQL — SQLite has one writer anyway), so whatever changes one run's steps and
state is serialised per run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TypeVar, Unpack

from sqlalchemy import Connection, and_, bindparam, func, insert, or_, select, update

from forgeflow.domain.json import JsonObject
from forgeflow.domain.pipeline_records import (
    NewRun,
    NewStep,
    PipelineRun,
    PipelineStep,
    PlannedStep,
    RunChange,
    StepChange,
)
from forgeflow.store.db import after_commit
from forgeflow.store.pipeline_schema import pipeline_runs as runs
from forgeflow.store.pipeline_schema import pipeline_steps as steps
from forgeflow.store.rows import pipeline_run, pipeline_step, planned_step
from forgeflow.store.sql import insert_ignore
from forgeflow.store.types import utcnow

# A step row as a compare-and-swap takes it: whole, or as the planner reads it.
StepRow = TypeVar("StepRow", PipelineStep, PlannedStep)


@dataclass(frozen=True, slots=True)
class StepKey:
    run_id: str
    step_id: str
    item_index: int

    @classmethod
    def of(cls, row: PipelineStep | PlannedStep) -> StepKey:
        return cls(row.run_id, row.step_id, row.item_index)


def where_step(key: StepKey) -> Any:
    return and_(
        steps.c.run_id == key.run_id,
        steps.c.step_id == key.step_id,
        steps.c.item_index == key.item_index,
    )


# The statements every step runs are built once, with their keys as bound parameters:
# building a Core statement (and its cache key) per call cost more CPU than SQLite
# spends running it. Parameter names of the WHERE clauses start with ``k_`` so they
# never clash with the columns a SET clause takes from the parameters.
_STEP_KEY = and_(
    steps.c.run_id == bindparam("k_run_id"),
    steps.c.step_id == bindparam("k_step_id"),
    steps.c.item_index == bindparam("k_item_index"),
)


def _key_params(row: PipelineStep | PlannedStep) -> dict[str, object]:
    return {"k_run_id": row.run_id, "k_step_id": row.step_id, "k_item_index": row.item_index}


# -- runs -----------------------------------------------------------------------------


def insert_run(conn: Connection, values: NewRun) -> bool:
    """Insert a run; False when its ``dedupe_key`` is already used."""
    now = utcnow()
    return insert_ignore(
        conn,
        runs,
        {"created_at": now, "updated_at": now, "version": 1, **values},
    )


_GET_RUN = select(runs).where(runs.c.run_id == bindparam("k_run_id"))


def get_run(conn: Connection, run_id: str) -> PipelineRun | None:
    row = conn.execute(_GET_RUN, {"k_run_id": run_id}).first()
    return pipeline_run(row) if row else None


# Built once (every step of a run whose row moved since its claim locks it again):
# with and without the definition snapshot.
_LOCK_RUN = {
    with_definition: select(*(c for c in runs.c if with_definition or c.name != "definition"))
    .where(runs.c.run_id == bindparam("run_id"))
    .with_for_update()
    for with_definition in (True, False)
}
_DEFINITION_AT = [c.name for c in runs.c].index("definition")


def lock_run(
    conn: Connection, run_id: str, *, definition: JsonObject | None = None
) -> PipelineRun | None:
    """Read a run row and hold it for the rest of the transaction. Given the run's
    ``definition`` snapshot (a caller that has it already: it never changes), the
    column is not read again and the record carries the one given."""
    row = conn.execute(_LOCK_RUN[definition is None], {"run_id": run_id}).first()
    if row is None:
        return None
    if definition is None:
        return pipeline_run(row)
    values = tuple(row)
    return pipeline_run((*values[:_DEFINITION_AT], definition, *values[_DEFINITION_AT:]))


# Announced by every transaction that ends a run (pipelines.runs.finish_run), once it
# has committed: ``store.db.subscribe(RUN_ENDED, fn)`` calls ``fn`` then, on the
# database thread, so whoever waits for runs to end (the step benchmark) need not poll.
RUN_ENDED = "pipelines.run_ended"


def announce_run_ended(conn: Connection) -> None:
    after_commit(conn, RUN_ENDED)


def run_by_dedupe(conn: Connection, dedupe_key: str) -> PipelineRun | None:
    row = conn.execute(select(runs).where(runs.c.dedupe_key == dedupe_key)).first()
    return pipeline_run(row) if row else None


# No ``values()``: the SET clause is the columns named in the execution's parameters.
_UPDATE_RUN = (
    update(runs)
    .where(runs.c.run_id == bindparam("k_run_id"))
    .where(runs.c.version == bindparam("k_version"))
)


def update_run(conn: Connection, run: PipelineRun, **values: Unpack[RunChange]) -> PipelineRun:
    """Compare-and-swap a run row; returns the new row (raises when it moved)."""
    now = utcnow()
    params: dict[str, object] = {"k_run_id": run.run_id, "k_version": run.version}
    params.update(values, version=run.version + 1, updated_at=now)
    result = conn.execute(_UPDATE_RUN, params)
    if result.rowcount != 1:
        raise StaleRow(f"run {run.run_id} changed under us")
    return replace(run, **values, version=run.version + 1, updated_at=now)


def list_runs(
    conn: Connection,
    *,
    template_key: str | None = None,
    status: str | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[PipelineRun], int]:
    conds = []
    if template_key is not None:
        conds.append(runs.c.template_key == template_key)
    if status is not None:
        conds.append(runs.c.status == status)
    total = conn.execute(select(func.count()).select_from(runs).where(*conds)).scalar_one()
    rows = conn.execute(
        select(runs)
        .where(*conds)
        .order_by(runs.c.created_at.desc(), runs.c.run_id)
        .limit(limit)
        .offset(offset)
    )
    return [pipeline_run(r) for r in rows], int(total)


def child_runs(conn: Connection, parent_run_id: str) -> list[PipelineRun]:
    rows = conn.execute(select(runs).where(runs.c.parent_run_id == parent_run_id))
    return [pipeline_run(r) for r in rows]


# -- steps ----------------------------------------------------------------------------


class StaleRow(Exception):
    """A compare-and-swap found the row moved on: the caller's view is out of date."""

    code = "stale_version"


def insert_steps(conn: Connection, rows: list[NewStep]) -> None:
    if not rows:
        return
    now = utcnow()
    conn.execute(
        insert(steps),
        [{"attempt": 0, "created_at": now, "updated_at": now, "version": 1, **r} for r in rows],
    )


def steps_of(conn: Connection, run_id: str) -> list[PipelineStep]:
    rows = conn.execute(
        select(steps)
        .where(steps.c.run_id == run_id)
        .order_by(steps.c.created_at, steps.c.step_id, steps.c.item_index)
    )
    return [pipeline_step(r) for r in rows]


# What the planner reads of a run's steps: keys, status, routes and the version a
# compare-and-swap needs — not the inputs and outputs, whose decoding made planning
# cost grow with the length of the run.
_PLAN_ROWS = (
    select(
        steps.c.run_id,
        steps.c.step_id,
        steps.c.item_index,
        steps.c.status,
        steps.c.routes,
        steps.c.version,
    )
    .where(steps.c.run_id == bindparam("k_run_id"))
    .order_by(steps.c.created_at, steps.c.step_id, steps.c.item_index)
)


def plan_rows(conn: Connection, run_id: str) -> list[PlannedStep]:
    """What the planner reads of a run's steps (every row, in creation order)."""
    return [planned_step(r) for r in conn.execute(_PLAN_ROWS, {"k_run_id": run_id}).all()]


def items_of(conn: Connection, run_id: str, step_id: str) -> list[PipelineStep]:
    """The forEach items of a node, in input order."""
    rows = conn.execute(
        select(steps)
        .where(steps.c.run_id == run_id)
        .where(steps.c.step_id == step_id)
        .where(steps.c.item_index >= 0)
        .order_by(steps.c.item_index)
    )
    return [pipeline_step(r) for r in rows]


_GET_STEP = select(steps).where(_STEP_KEY)


def get_step(conn: Connection, key: StepKey) -> PipelineStep | None:
    params = {"k_run_id": key.run_id, "k_step_id": key.step_id, "k_item_index": key.item_index}
    row = conn.execute(_GET_STEP, params).first()
    return pipeline_step(row) if row else None


# As _UPDATE_RUN: the SET clause is the columns named in the execution's parameters.
_UPDATE_STEP = update(steps).where(_STEP_KEY).where(steps.c.version == bindparam("k_version"))
_UPDATE_STEP_IF = _UPDATE_STEP.where(steps.c.status == bindparam("k_status"))


def update_step(conn: Connection, row: StepRow, **values: Unpack[StepChange]) -> StepRow:
    """Compare-and-swap a step row on its version; returns the new row."""
    new = update_step_if(conn, row, values)
    if new is None:
        raise StaleRow(f"step {row.run_id}/{row.step_id}#{row.item_index} changed")
    return new


def update_step_if(
    conn: Connection, row: StepRow, values: StepChange, *, was: str | None = None
) -> StepRow | None:
    """:func:`update_step` that answers None instead of raising when the row moved on
    (another version, or — given ``was`` — another status)."""
    now = utcnow()
    params = _key_params(row)
    params.update(values, k_version=row.version, version=row.version + 1, updated_at=now)
    if was is not None:
        params["k_status"] = was
    result = conn.execute(_UPDATE_STEP if was is None else _UPDATE_STEP_IF, params)
    if result.rowcount != 1:
        return None
    if isinstance(row, PipelineStep):
        return replace(row, **values, version=row.version + 1, updated_at=now)
    status, routes = values.get("status", row.status), values.get("routes", row.routes)
    return PlannedStep(row.run_id, row.step_id, row.item_index, status, routes, row.version + 1)


def wake_at(conn: Connection, key: StepKey, at: datetime) -> None:
    """Ask for a step to be called again by ``at`` (no version bump: a running body's
    own result must still find its row as it claimed it)."""
    conn.execute(update(steps).where(where_step(key)).values(next_attempt_at=at))


def due_steps(conn: Connection, now: datetime, limit: int = 200) -> list[PipelineStep]:
    """Steps to start now: runnable ones whose time came, and suspended ones whose body
    asked to be called again by now — of running runs, oldest first."""
    stmt = (
        select(steps)
        .join(runs, runs.c.run_id == steps.c.run_id)
        .where(runs.c.status == "running")
        .where(
            or_(
                and_(
                    steps.c.status == "runnable",
                    or_(steps.c.next_attempt_at.is_(None), steps.c.next_attempt_at <= now),
                ),
                and_(steps.c.status == "suspended", steps.c.next_attempt_at <= now),
            )
        )
        .order_by(steps.c.updated_at, steps.c.run_id, steps.c.step_id, steps.c.item_index)
        .limit(limit)
    )
    return [pipeline_step(r) for r in conn.execute(stmt)]


_RUNNABLE = (
    select(steps)
    .where(steps.c.run_id == bindparam("k_run_id"))
    .where(steps.c.status == "runnable")
    .where(or_(steps.c.next_attempt_at.is_(None), steps.c.next_attempt_at <= bindparam("k_now")))
    .order_by(steps.c.updated_at, steps.c.step_id, steps.c.item_index)
)


def runnable_steps(conn: Connection, run_id: str, now: datetime) -> list[PipelineStep]:
    """The run's runnable steps whose time came, oldest first (as :func:`due_steps`)."""
    rows = conn.execute(_RUNNABLE, {"k_run_id": run_id, "k_now": now})
    return [pipeline_step(r) for r in rows]


def next_due(conn: Connection) -> datetime | None:
    value: datetime | None = conn.execute(
        select(func.min(steps.c.next_attempt_at))
        .join(runs, runs.c.run_id == steps.c.run_id)
        .where(runs.c.status == "running")
        .where(steps.c.status.in_(("runnable", "suspended")))
    ).scalar_one()
    return value


_RUN_COUNTS = select(
    func.count().filter(and_(steps.c.status == "running", steps.c.claimed_by.is_not(None))),
    func.coalesce(func.sum(steps.c.attempt), 0),
).where(steps.c.run_id == bindparam("k_run_id"))


def run_counts(conn: Connection, run_id: str) -> tuple[int, int]:
    """(steps of the run whose body is executing now — claimed rows —, executions
    started so far in the run: every attempt of every step and item), in one statement."""
    row = conn.execute(_RUN_COUNTS, {"k_run_id": run_id}).one()
    return int(row[0]), int(row[1])
