"""The statements of a pipeline step's straight path, built once.

A no-op step costs little more than its SQL, and building a Core statement per call
(``update(...).where(...).values(...)``, its cache key) costs more CPU than SQLite
spends running it. So the statements every step runs — record the run's new state,
record the step's success, find which upstream nodes are still open, release the
nodes that became runnable — are built here once with ``bindparam`` and executed with
plain dicts. Each is a compare-and-swap or a guarded move, as in
:mod:`forgeflow.store.pipelines`, whose rules (run row first, version on every change)
they follow.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Update, and_, bindparam, func, select, update

from forgeflow.store.pipeline_schema import pipeline_runs as runs
from forgeflow.store.pipeline_schema import pipeline_steps as steps

Row = dict[str, Any]

_OPEN = ("pending", "runnable", "running", "suspended")
_NODE_ROW = -1  # kinds.NODE_ROW; the store does not import the engine's vocabulary

# Typed so the columns' own conversions apply (UTC datetimes, JSON as text).
_NOW = steps.c.updated_at.type

_run_key = and_(
    runs.c.run_id == bindparam("k_run_id"),
    runs.c.version == bindparam("k_version"),
    runs.c.status == "running",
)


def _bump_run(with_state: bool) -> Update:
    values: dict[str, Any] = {
        "version": bindparam("new_version"),
        "updated_at": bindparam("now", type_=_NOW),
        "input_tokens": bindparam("input_tokens"),
        "output_tokens": bindparam("output_tokens"),
        "cost": bindparam("cost"),
    }
    if with_state:
        values["state"] = bindparam("state", type_=runs.c.state.type)
    return update(runs).where(_run_key).values(values)


# Writing the state only when the step changed it spares encoding the whole bag.
_BUMP_RUN = {True: _bump_run(True), False: _bump_run(False)}


def bump_run(conn: Connection, run: Row, *, now: datetime, **changes: Any) -> Row | None:
    """Compare-and-swap a running run on the version the caller knows (which also takes
    its row lock, first, as every move of a run does); ``changes`` may hold ``state``
    and the token and cost totals. The new row, or None when the run moved on."""
    new = {**run, **changes, "version": run["version"] + 1}
    params = {
        "k_run_id": run["run_id"],
        "k_version": run["version"],
        "new_version": new["version"],
        "now": now,
        "input_tokens": new["input_tokens"],
        "output_tokens": new["output_tokens"],
        "cost": new["cost"],
    }
    with_state = "state" in changes
    if with_state:
        params["state"] = new["state"]
    if conn.execute(_BUMP_RUN[with_state], params).rowcount != 1:
        return None
    return new


_step_key = and_(
    steps.c.run_id == bindparam("k_run_id"),
    steps.c.step_id == bindparam("k_step_id"),
    steps.c.item_index == bindparam("k_item_index"),
)


def _succeed_step(with_input: bool) -> Update:
    values: dict[str, Any] = {
        "status": "succeeded",
        "output": bindparam("output", type_=steps.c.output.type),
        "routes": bindparam("routes", type_=steps.c.routes.type),
        "finished_at": bindparam("now", type_=_NOW),
        "updated_at": bindparam("now", type_=_NOW),
        "claimed_by": None,
        "lease_expires_at": None,
        "next_attempt_at": None,
        "error_code": None,
        "error": None,
        "version": steps.c.version + 1,
    }
    if with_input:
        values["input"] = bindparam("input", type_=steps.c.input.type)
    return (
        update(steps)
        .where(_step_key, steps.c.version == bindparam("k_version"), steps.c.status == "running")
        .values(values)
    )


_SUCCEED_STEP = {True: _succeed_step(True), False: _succeed_step(False)}


def succeed_step(
    conn: Connection, row: Row, *, output: Any, routes: list[str] | None, input: Any, now: datetime
) -> bool:
    """Compare-and-swap a running step to succeeded; False when it moved on."""
    params = {
        "k_run_id": row["run_id"],
        "k_step_id": row["step_id"],
        "k_item_index": row["item_index"],
        "k_version": row["version"],
        "output": output,
        "routes": routes,
        "now": now,
    }
    if input is not None:
        params["input"] = input
    return conn.execute(_SUCCEED_STEP[input is not None], params).rowcount == 1


_OPEN_NODES = select(steps.c.step_id).where(
    steps.c.run_id == bindparam("k_run_id"),
    steps.c.item_index == _NODE_ROW,
    steps.c.status.in_(_OPEN),
)


def open_nodes(conn: Connection, run_id: str) -> set[str]:
    """The run's nodes that are not settled yet (only their ids: no JSON decoded)."""
    return {r[0] for r in conn.execute(_OPEN_NODES, {"k_run_id": run_id})}


# A claim of a node that just became runnable, within the run's limits — the same
# counts as runs' claim (steps executing now, executions started so far), taken in the
# statement itself so the straight path needs no read of them.
_executing = (
    select(func.count())
    .select_from(steps)
    .where(
        steps.c.run_id == bindparam("k_run_id"),
        steps.c.status == "running",
        steps.c.claimed_by.is_not(None),
    )
    .scalar_subquery()
)
_executed = (
    select(func.coalesce(func.sum(steps.c.attempt), 0))
    .where(steps.c.run_id == bindparam("k_run_id"))
    .scalar_subquery()
)
_CLAIM_PENDING = (
    update(steps)
    .where(
        _step_key,
        steps.c.status == "pending",
        _executing < bindparam("max_concurrent"),
        _executed < bindparam("max_steps"),
    )
    .values(
        status="running",
        claimed_by=bindparam("owner"),
        lease_expires_at=bindparam("lease", type_=_NOW),
        attempt=steps.c.attempt + 1,
        started_at=func.coalesce(steps.c.started_at, bindparam("now", type_=_NOW)),
        next_attempt_at=None,
        updated_at=bindparam("now", type_=_NOW),
        version=steps.c.version + 1,
    )
    .returning(*steps.c)
)
_RUNNABLE_PENDING = (
    update(steps)
    .where(_step_key, steps.c.status == "pending")
    .values(
        status="runnable",
        next_attempt_at=None,
        updated_at=bindparam("now", type_=_NOW),
        version=steps.c.version + 1,
    )
)


def claim_pending(
    conn: Connection,
    run_id: str,
    step_id: str,
    *,
    owner: str,
    lease: datetime,
    now: datetime,
    max_concurrent: int,
    max_steps: int,
) -> Row | None:
    """Move a pending node straight to running for ``owner`` if the run's limits allow;
    the claimed row, or None (not pending, or a limit reached)."""
    row = conn.execute(
        _CLAIM_PENDING,
        {
            "k_run_id": run_id,
            "k_step_id": step_id,
            "k_item_index": _NODE_ROW,
            "owner": owner,
            "lease": lease,
            "now": now,
            "max_concurrent": max_concurrent,
            "max_steps": max_steps,
        },
    ).first()
    return dict(row._mapping) if row is not None else None


def mark_runnable(conn: Connection, run_id: str, step_id: str, *, now: datetime) -> bool:
    """A pending node becomes runnable (for a claim round); False when not pending."""
    params = {"k_run_id": run_id, "k_step_id": step_id, "k_item_index": _NODE_ROW, "now": now}
    return conn.execute(_RUNNABLE_PENDING, params).rowcount == 1
