"""What happens to one node's rows inside a run's unit of work: its output reduced into
the state bag, its failure, the expansion of a forEach into items and its settling
once they are done, and the closing of rows still open when a run ends.

Every function runs in the caller's transaction, the run row already locked.
"""

from __future__ import annotations

from datetime import datetime
from typing import Unpack

from sqlalchemy import Connection

from forgeflow.domain.json import JsonObject, JsonValue
from forgeflow.domain.pipeline_records import (
    NewStep,
    PipelineRun,
    PipelineStep,
    PlannedStep,
    StepChange,
)
from forgeflow.pipelines import state as bag
from forgeflow.pipelines.definition import NodeSpec
from forgeflow.pipelines.kinds import NODE_ROW, Code, StepStatus
from forgeflow.pipelines.snapshots import definition_of
from forgeflow.redaction import redact
from forgeflow.store import pipelines as q
from forgeflow.store.pipelines import StepKey, StepRow
from forgeflow.store.types import utcnow

S = StepStatus


def pending_row(run_id: str, node: NodeSpec, item_index: int = NODE_ROW) -> NewStep:
    """A new step row, pending: a node's own row, or one item of a forEach."""
    return {
        "run_id": run_id,
        "step_id": node.id,
        "item_index": item_index,
        "kind": node.kind.value,
        "body_key": node.body,
        "status": S.PENDING.value,
    }


def finished(
    status: StepStatus, /, *, at: datetime | None = None, **values: Unpack[StepChange]
) -> StepChange:
    """The columns of a step row whose execution is over: its final status, when it
    ended, and neither a lease nor a retry time left to act on."""
    return {
        "status": status.value,
        "finished_at": at or utcnow(),
        "claimed_by": None,
        "lease_expires_at": None,
        "next_attempt_at": None,
        **values,
    }


def finish_step(
    conn: Connection,
    row: StepRow,
    status: StepStatus,
    /,
    *,
    at: datetime | None = None,
    **values: Unpack[StepChange],
) -> StepRow:
    """End a step row's execution (:func:`finished`)."""
    return q.update_step(conn, row, **finished(status, at=at, **values))


def write_output(run: PipelineRun, node: NodeSpec, value: JsonValue) -> JsonObject:
    """The run's state with a step's output reduced under its ``outputKey``."""
    state = run.state
    if node.outputKey is None or value is None:
        return state
    return bag.write(
        state, node.outputKey, redact(value), definition_of(run).reducer(node.outputKey)
    )


def fail_node(
    conn: Connection,
    run: PipelineRun,
    node: NodeSpec,
    row: StepRow,
    code: str,
    error: str,
) -> PipelineRun:
    """Mark a node failed; with ``continueOnFail`` its error goes to ``_stepErrors``."""
    error = redact(error)
    finish_step(conn, row, S.FAILED, error_code=code, error=error)
    if node.continueOnFail and row.item_index == NODE_ROW:
        run = q.update_run(conn, run, state=bag.record_error(run.state, node.id, error))
    return run


def expand(conn: Connection, run: PipelineRun, node: NodeSpec, row: PlannedStep) -> PipelineRun:
    """Give a runnable forEach one pending row per item of the list it iterates (an
    empty list succeeds at once with an empty output)."""
    key = str(node.extras["iterableKey"])
    items = bag.lookup(run.state, key)
    if not isinstance(items, list):
        got = "nothing" if items is bag.MISSING else type(items).__name__
        return fail_node(
            conn, run, node, row, Code.FOREACH_NOT_A_LIST, f"state key {key!r} is {got}, not a list"
        )
    now = utcnow()
    if not items:
        try:
            state = write_output(run, node, [])
        except bag.ReducerError as exc:
            return fail_node(conn, run, node, row, Code.REDUCER_ERROR, str(exc))
        q.update_step(
            conn, row, status=S.SUCCEEDED.value, output=[], started_at=now, finished_at=now
        )
        return q.update_run(conn, run, state=state)
    rows = [pending_row(run.run_id, node, i) for i in range(len(items))]
    for new, value in zip(rows, items, strict=True):
        new["item"] = value
    q.insert_steps(conn, rows)
    q.update_step(conn, row, status=S.RUNNING.value, started_at=now)
    return run


def settle_foreach(
    conn: Connection,
    run: PipelineRun,
    node: NodeSpec,
    row: PlannedStep,
    items: list[PipelineStep],
    ok: bool,
) -> PipelineRun:
    """End a forEach whose items are done: its output is theirs, in order; else it
    fails with the first failed item's error."""
    now = utcnow()
    if ok:
        outputs = [r.output for r in items]
        q.update_step(conn, row, status=S.SUCCEEDED.value, output=outputs, finished_at=now)
        try:
            return q.update_run(conn, run, state=write_output(run, node, outputs))
        except bag.ReducerError as exc:
            return fail_node(conn, run, node, row, Code.REDUCER_ERROR, str(exc))
    close_open(conn, items, now)
    bad = next((r for r in items if r.status == S.FAILED), None)
    code = (bad.error_code if bad else None) or Code.CANCELLED
    error = f"item {bad.item_index}: {bad.error}" if bad else "items did not finish"
    current = q.get_step(conn, StepKey.of(row))
    if current is None:
        return fail_node(conn, run, node, row, code, error)
    return fail_node(conn, run, node, current, code, error)


def close_open(conn: Connection, rows: list[PipelineStep], now: datetime) -> None:
    """Skip the rows that never started; cancel those running or suspended."""
    for r in rows:
        if r.status in (S.PENDING, S.RUNNABLE):
            q.update_step(conn, r, status=S.SKIPPED.value, finished_at=now, next_attempt_at=None)
        elif r.status in (S.RUNNING, S.SUSPENDED):
            finish_step(conn, r, S.CANCELLED, at=now, error_code=Code.RUN_ENDED)
