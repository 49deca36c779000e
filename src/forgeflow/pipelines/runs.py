"""The life of a run as units of work: create, advance, finish, cancel.

Each function takes the caller's ``Connection`` and runs inside its transaction; the
run row is locked first (:func:`store.pipelines.lock_run`), so everything that moves
one run — a step's completion, its state write, the planning that follows — is atomic
and serialised per run. :func:`advance` is the one place that applies the planner.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from forgeflow.pipelines import state as bag
from forgeflow.pipelines.definition import NodeSpec, PipelineDefinition
from forgeflow.pipelines.kinds import (
    NODE_ROW,
    TERMINAL_RUN_STATUSES,
    Code,
    RunStatus,
    StepKind,
    StepStatus,
)
from forgeflow.pipelines.planner import NodeState, plan, start_node
from forgeflow.redaction import redact
from forgeflow.store import audit
from forgeflow.store import pipelines as q
from forgeflow.store.pipelines import Row, StepKey
from forgeflow.store.types import utcnow

S = StepStatus


class PipelineError(Exception):
    """A refused pipeline operation: a stable ``code`` and the HTTP status it maps to."""

    def __init__(self, code: str, message: str, *, status: int = 409, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.message = message
        self.extra = extra


@dataclass(frozen=True, slots=True)
class Started:
    run: Row
    created: bool


@dataclass(frozen=True, slots=True)
class Parent:
    run_id: str
    step_id: str
    item_index: int


# A run's definition is a snapshot taken at its start and never changes: parse it once.
# Units of work run on several database threads, hence the lock.
_DEFINITIONS: OrderedDict[str, PipelineDefinition] = OrderedDict()
_DEFINITIONS_LOCK = threading.Lock()


# Where :func:`lock` puts the parsed snapshot on a run row read without its definition.
_SNAPSHOT = "_definition"


def lock(conn: Connection, run_id: str) -> Row | None:
    """:func:`store.pipelines.lock_run`, without fetching and decoding the definition
    snapshot again when it is parsed already (it is the largest column of the row and
    it never changes)."""
    with _DEFINITIONS_LOCK:
        cached = _DEFINITIONS.get(run_id)
    run = q.lock_run(conn, run_id, definition=cached is None)
    if run is not None and cached is not None:
        run[_SNAPSHOT] = cached
    return run


def definition_of(run: Row) -> PipelineDefinition:
    """The run's own snapshot of its definition."""
    snapshot = run.get(_SNAPSHOT)
    if isinstance(snapshot, PipelineDefinition):
        return snapshot
    with _DEFINITIONS_LOCK:
        cached = _DEFINITIONS.get(run["run_id"])
    if cached is None:
        cached = PipelineDefinition.model_validate(run["definition"])
        with _DEFINITIONS_LOCK:
            _DEFINITIONS[run["run_id"]] = cached
            if len(_DEFINITIONS) > 1024:
                _DEFINITIONS.popitem(last=False)
    return cached


def definition_for(conn: Connection, run_id: str) -> PipelineDefinition | None:
    """A run's definition, reading the run row only when it is not cached yet."""
    with _DEFINITIONS_LOCK:
        cached = _DEFINITIONS.get(run_id)
    if cached is not None:
        return cached
    run = q.get_run(conn, run_id)
    return None if run is None else definition_of(run)


def audit_run(conn: Connection, action: str, run: Row, actor: str = "system", **meta: Any) -> None:
    audit.append(
        conn,
        audit.AuditEvent(
            action=action,
            actor=actor,
            to_state=run["status"],
            error_code=run.get("error_code"),
            metadata={"runId": run["run_id"], "templateKey": run["template_key"], **meta},
        ),
    )


def create_run(
    conn: Connection,
    definition: PipelineDefinition,
    *,
    trigger_type: str,
    event_type: str | None = None,
    inputs: dict[str, Any] | None = None,
    event: dict[str, Any] | None = None,
    dedupe_key: str | None = None,
    actor: str = "system",
    parent: Parent | None = None,
) -> Started:
    """Record a run, its pending steps and its start node; a used ``dedupe_key`` returns
    the run that already has it."""
    if dedupe_key is not None:
        existing = q.run_by_dedupe(conn, dedupe_key)
        if existing is not None:
            return Started(existing, False)
    start = start_node(definition, trigger_type, event_type)
    if start is None:
        raise PipelineError(
            "no_start_node",
            f"template {definition.key} has no trigger node for a {trigger_type} "
            f"run{f' of {event_type}' if event_type else ''}",
        )
    run_id = f"run-{uuid.uuid4().hex}"
    values = {
        "run_id": run_id,
        "template_key": definition.key,
        "definition_version": definition.version,
        "definition": definition.to_json(),
        "status": RunStatus.RUNNING.value,
        "trigger_type": trigger_type,
        "event_type": event_type,
        "dedupe_key": dedupe_key,
        "start_step_id": start,
        "inputs": redact(inputs or {}),
        "state": redact({"inputs": inputs or {}, "event": event or {}}),
        "created_by": actor,
        "parent_run_id": parent.run_id if parent else None,
        "parent_step_id": parent.step_id if parent else None,
        "parent_item_index": parent.item_index if parent else None,
    }
    if not q.insert_run(conn, values):
        existing = q.run_by_dedupe(conn, dedupe_key or "")
        assert existing is not None
        return Started(existing, False)
    q.insert_steps(
        conn,
        [
            {
                "run_id": run_id,
                "step_id": n.id,
                "item_index": NODE_ROW,
                "kind": n.kind.value,
                "body_key": n.body,
                "status": S.PENDING.value,
            }
            for n in definition.nodes
        ],
    )
    run = q.get_run(conn, run_id)
    assert run is not None
    audit_run(
        conn, "pipeline.run.start", run, actor, triggerType=trigger_type, eventType=event_type
    )
    run = advance(conn, run_id) or run
    return Started(run, True)


def _node_states(d: PipelineDefinition, rows: list[Row]) -> dict[str, NodeState]:
    items: dict[str, list[StepStatus]] = {}
    for r in rows:
        if r["item_index"] != NODE_ROW:
            items.setdefault(r["step_id"], []).append(StepStatus(r["status"]))
    foreach = {n.id for n in d.nodes if n.kind is StepKind.FOREACH}
    states = {}
    for r in rows:
        if r["item_index"] != NODE_ROW:
            continue
        status = StepStatus(r["status"])
        expanded = r["step_id"] in foreach and status is S.RUNNING
        states[r["step_id"]] = NodeState(
            status,
            frozenset(r["routes"] or ()),
            tuple(items.get(r["step_id"], ())) if expanded else None,
        )
    return states


def advance(conn: Connection, run_id: str, *, locked: Row | None = None) -> Row | None:
    """Apply the planner until it has nothing more to say; returns the run row.

    ``locked``: the run row as this transaction holds it (locked and current), so it
    is not read again.
    """
    run = locked if locked is not None else lock(conn, run_id)
    if run is None or run["status"] != RunStatus.RUNNING:
        return run
    d = definition_of(run)
    for _ in range(4 * len(d.nodes) + 8):
        rows = q.plan_rows(conn, run_id)
        nodes = {r["step_id"]: r for r in rows if r["item_index"] == NODE_ROW}
        p = plan(d, run["start_step_id"], _node_states(d, rows))
        now = utcnow()
        for sid in p.skip:
            q.update_step(conn, nodes[sid], status=S.SKIPPED.value, finished_at=now)
        for sid in p.reached:
            q.update_step(
                conn, nodes[sid], status=S.SUCCEEDED.value, started_at=now, finished_at=now
            )
        if p.outcome is not None:
            return finish_run(conn, run, p.outcome, failed=p.failed)
        if p.empty:
            break
        # The planner already took skips to their fixpoint, so marking steps runnable
        # (or items) cannot change its next answer; only expanding or settling a
        # forEach can. Planning again otherwise would only re-read the run's steps.
        again = bool(p.foreach_done)
        for sid in p.ready:
            node = d.node(sid)
            if node.kind is StepKind.FOREACH:
                run = _expand(conn, run, node, nodes[sid])
                again = True
            else:
                q.update_step(conn, nodes[sid], status=S.RUNNABLE.value, next_attempt_at=None)
        by_key = {(r["step_id"], r["item_index"]): r for r in rows}
        for sid, index in p.items_ready:
            q.update_step(conn, by_key[(sid, index)], status=S.RUNNABLE.value)
        for sid, ok in p.foreach_done:
            items = q.items_of(conn, run_id, sid)
            run = _settle_foreach(conn, run, d.node(sid), nodes[sid], items, ok)
        if not again:
            break
    return run


def write_output(run: Row, node: NodeSpec, value: Any) -> dict[str, Any]:
    """The run's state with a step's output reduced under its ``outputKey``."""
    state: dict[str, Any] = run["state"]
    if node.outputKey is None or value is None:
        return state
    return bag.write(
        state, node.outputKey, redact(value), definition_of(run).reducer(node.outputKey)
    )


def fail_node(conn: Connection, run: Row, node: NodeSpec, row: Row, code: str, error: str) -> Row:
    """Mark a node failed; with ``continueOnFail`` its error goes to ``_stepErrors``."""
    error = redact(error)
    q.update_step(
        conn,
        row,
        status=S.FAILED.value,
        error_code=code,
        error=error,
        finished_at=utcnow(),
        claimed_by=None,
        lease_expires_at=None,
        next_attempt_at=None,
    )
    if node.continueOnFail and row["item_index"] == NODE_ROW:
        run = q.update_run(conn, run, state=bag.record_error(run["state"], node.id, error))
    return run


def _expand(conn: Connection, run: Row, node: NodeSpec, row: Row) -> Row:
    key = str(node.extras["iterableKey"])
    items = bag.lookup(run["state"], key)
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
    q.insert_steps(
        conn,
        [
            {
                "run_id": run["run_id"],
                "step_id": node.id,
                "item_index": i,
                "kind": node.kind.value,
                "body_key": node.body,
                "status": S.PENDING.value,
                "item": value,
            }
            for i, value in enumerate(items)
        ],
    )
    q.update_step(conn, row, status=S.RUNNING.value, started_at=now)
    return run


def _settle_foreach(
    conn: Connection, run: Row, node: NodeSpec, row: Row, items: list[Row], ok: bool
) -> Row:
    now = utcnow()
    if ok:
        outputs = [r["output"] for r in items]
        q.update_step(conn, row, status=S.SUCCEEDED.value, output=outputs, finished_at=now)
        try:
            return q.update_run(conn, run, state=write_output(run, node, outputs))
        except bag.ReducerError as exc:
            return fail_node(conn, run, node, row, Code.REDUCER_ERROR, str(exc))
    _close_open(conn, items, now)
    bad = next((r for r in items if r["status"] == S.FAILED), None)
    code = bad["error_code"] if bad else Code.CANCELLED
    error = f"item {bad['item_index']}: {bad['error']}" if bad else "items did not finish"
    return fail_node(conn, run, node, q.get_step(conn, StepKey.of(row)) or row, code, error)


def _close_open(conn: Connection, rows: list[Row], now: Any) -> None:
    for r in rows:
        if r["status"] in (S.PENDING, S.RUNNABLE):
            q.update_step(conn, r, status=S.SKIPPED.value, finished_at=now, next_attempt_at=None)
        elif r["status"] in (S.RUNNING, S.SUSPENDED):
            q.update_step(
                conn,
                r,
                status=S.CANCELLED.value,
                error_code=Code.RUN_ENDED,
                finished_at=now,
                claimed_by=None,
                lease_expires_at=None,
                next_attempt_at=None,
            )


def finish_run(
    conn: Connection,
    run: Row,
    outcome: RunStatus,
    *,
    failed: tuple[str, ...] = (),
    error_code: str | None = None,
    error: str | None = None,
    actor: str = "system",
) -> Row:
    """End a run: open steps are skipped or cancelled, a waiting parent is woken."""
    now = utcnow()
    rows = q.steps_of(conn, run["run_id"])
    if failed and error_code is None:
        first = next(r for r in rows if r["step_id"] == failed[0] and r["item_index"] == NODE_ROW)
        error_code = first["error_code"] or Code.UPSTREAM_FAILED
        error = f"step {failed[0]} failed: {first['error']}"
    _close_open(conn, rows, now)
    run = q.update_run(
        conn,
        run,
        status=outcome.value,
        finished_at=now,
        error_code=error_code,
        error=redact(error) if error else None,
    )
    audit_run(conn, "pipeline.run.finish", run, actor)
    return run


def wake_parent(conn: Connection, child: Row) -> None:
    """Call a ``flow.callPipeline`` step waiting for ``child`` again now.

    Its own transaction, after the child's: locks go parent run first, then its steps,
    as everywhere else.
    """
    if not child["parent_run_id"]:
        return
    parent_run = q.lock_run(conn, child["parent_run_id"])
    if parent_run is None or parent_run["status"] != RunStatus.RUNNING:
        return
    key = StepKey(child["parent_run_id"], child["parent_step_id"], child["parent_item_index"])
    parent = q.get_step(conn, key)
    if parent is not None and parent["status"] in (S.SUSPENDED, S.RUNNING):
        # Still running: the child ended before the body that started it suspended;
        # the suspension then takes this earlier time (see steps.suspend).
        q.wake_at(conn, key, utcnow())


def cancel_run(conn: Connection, run_id: str, *, actor: str, reason: str | None) -> Row:
    """Cancel a run and its child runs; pending steps are skipped, the rest cancelled."""
    run = q.lock_run(conn, run_id)
    if run is None:
        raise PipelineError("run_not_found", f"no run {run_id}", status=404)
    if RunStatus(run["status"]) in TERMINAL_RUN_STATUSES:
        return run
    for child in q.child_runs(conn, run_id):
        if child["status"] == RunStatus.RUNNING:
            cancel_run(conn, child["run_id"], actor=actor, reason="parent run cancelled")
    return finish_run(
        conn,
        run,
        RunStatus.CANCELLED,
        error_code=Code.CANCELLED,
        error=reason or "cancelled",
        actor=actor,
    )
