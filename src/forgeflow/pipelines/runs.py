"""The life of a run as units of work: create, advance, finish, cancel.

Each function takes the caller's ``Connection`` and runs inside its transaction; the
run row is locked first (:func:`store.pipelines.lock_run`), so everything that moves
one run — a step's completion, its state write, the planning that follows — is atomic
and serialised per run. :func:`advance` is the one place that applies the planner.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from forgeflow.domain.json import JsonObject
from forgeflow.domain.pipeline_records import NewRun, PipelineRun, PlannedStep
from forgeflow.pipelines import nodes, snapshots
from forgeflow.pipelines.definition import PipelineDefinition
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
from forgeflow.store.pipelines import StepKey
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
    run: PipelineRun
    created: bool


@dataclass(frozen=True, slots=True)
class Parent:
    run_id: str
    step_id: str
    item_index: int


def audit_run(
    conn: Connection, action: str, run: PipelineRun, actor: str = "system", **meta: Any
) -> None:
    audit.append(
        conn,
        audit.AuditEvent(
            action=action,
            actor=actor,
            to_state=run.status,
            error_code=run.error_code,
            metadata={"runId": run.run_id, "templateKey": run.template_key, **meta},
        ),
    )


def create_run(
    conn: Connection,
    definition: PipelineDefinition,
    *,
    trigger_type: str,
    event_type: str | None = None,
    inputs: JsonObject | None = None,
    event: JsonObject | None = None,
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
    values = _run_row(
        definition,
        _start_of(definition, trigger_type, event_type),
        trigger_type=trigger_type,
        event_type=event_type,
        inputs=inputs or {},
        event=event or {},
        dedupe_key=dedupe_key,
        actor=actor,
        parent=parent,
    )
    if not q.insert_run(conn, values):
        # Another transaction used the dedupe key between the look-up and the insert.
        existing = q.run_by_dedupe(conn, dedupe_key or "")
        assert existing is not None
        return Started(existing, False)
    run_id = values["run_id"]
    q.insert_steps(conn, [nodes.pending_row(run_id, n) for n in definition.nodes])
    run = q.get_run(conn, run_id)
    assert run is not None
    audit_run(
        conn, "pipeline.run.start", run, actor, triggerType=trigger_type, eventType=event_type
    )
    return Started(advance(conn, run_id) or run, True)


def _start_of(definition: PipelineDefinition, trigger_type: str, event_type: str | None) -> str:
    start = start_node(definition, trigger_type, event_type)
    if start is None:
        raise PipelineError(
            "no_start_node",
            f"template {definition.key} has no trigger node for a {trigger_type} "
            f"run{f' of {event_type}' if event_type else ''}",
        )
    return start


def _run_row(
    definition: PipelineDefinition,
    start: str,
    *,
    trigger_type: str,
    event_type: str | None,
    inputs: JsonObject,
    event: JsonObject,
    dedupe_key: str | None,
    actor: str,
    parent: Parent | None,
) -> NewRun:
    """A new run's row: the definition's snapshot, and a state bag holding the inputs
    and the event that started it (secrets redacted before they are stored)."""
    return {
        "run_id": f"run-{uuid.uuid4().hex}",
        "template_key": definition.key,
        "definition_version": definition.version,
        "definition": definition.to_json(),
        "status": RunStatus.RUNNING.value,
        "trigger_type": trigger_type,
        "event_type": event_type,
        "dedupe_key": dedupe_key,
        "start_step_id": start,
        "inputs": redact(inputs),
        "state": redact({"inputs": inputs, "event": event}),
        "created_by": actor,
        "parent_run_id": parent.run_id if parent else None,
        "parent_step_id": parent.step_id if parent else None,
        "parent_item_index": parent.item_index if parent else None,
    }


# The state of a node with no routes and no items, shared (NodeState is frozen): most
# rows of a run are that, and planning reads every row of the run at each step.
_PLAIN = {status.value: NodeState(status) for status in StepStatus}


def _node_states(d: PipelineDefinition, rows: list[PlannedStep]) -> dict[str, NodeState]:
    items: dict[str, list[StepStatus]] = {}
    for r in rows:
        if r.item_index != NODE_ROW:
            items.setdefault(r.step_id, []).append(StepStatus(r.status))
    states = {}
    for r in rows:
        if r.item_index != NODE_ROW:
            continue
        sid = r.step_id
        expanded = r.status == S.RUNNING and d.by_id[sid].kind is StepKind.FOREACH
        if not r.routes and not expanded:
            states[sid] = _PLAIN[r.status]
            continue
        states[sid] = NodeState(
            StepStatus(r.status),
            frozenset(r.routes or ()),
            tuple(items.get(sid, ())) if expanded else None,
        )
    return states


def advance(
    conn: Connection, run_id: str, *, locked: PipelineRun | None = None
) -> PipelineRun | None:
    """Apply the planner until it has nothing more to say; returns the run row.

    ``locked``: the run row as this transaction holds it (locked and current), so it
    is not read again.
    """
    run = locked if locked is not None else snapshots.lock(conn, run_id)
    if run is None or run.status != RunStatus.RUNNING:
        return run
    d = snapshots.definition_of(run)
    for _ in range(4 * len(d.nodes) + 8):
        rows = q.plan_rows(conn, run_id)
        # Each node's own row (not its forEach items), by step id.
        own = {r.step_id: r for r in rows if r.item_index == NODE_ROW}
        p = plan(d, run.start_step_id, _node_states(d, rows))
        now = utcnow()
        for sid in p.skip:
            q.update_step(conn, own[sid], status=S.SKIPPED.value, finished_at=now)
        for sid in p.reached:
            q.update_step(conn, own[sid], status=S.SUCCEEDED.value, started_at=now, finished_at=now)
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
                run = nodes.expand(conn, run, node, own[sid])
                again = True
            else:
                q.update_step(conn, own[sid], status=S.RUNNABLE.value, next_attempt_at=None)
        by_key = {(r.step_id, r.item_index): r for r in rows}
        for sid, index in p.items_ready:
            q.update_step(conn, by_key[(sid, index)], status=S.RUNNABLE.value)
        for sid, ok in p.foreach_done:
            items = q.items_of(conn, run_id, sid)
            run = nodes.settle_foreach(conn, run, d.node(sid), own[sid], items, ok)
        if not again:
            break
    return run


def finish_run(
    conn: Connection,
    run: PipelineRun,
    outcome: RunStatus,
    *,
    failed: tuple[str, ...] = (),
    error_code: str | None = None,
    error: str | None = None,
    actor: str = "system",
) -> PipelineRun:
    """End a run: open steps are skipped or cancelled, a waiting parent is woken."""
    now = utcnow()
    rows = q.steps_of(conn, run.run_id)
    if failed and error_code is None:
        first = next(r for r in rows if r.step_id == failed[0] and r.item_index == NODE_ROW)
        error_code = first.error_code or Code.UPSTREAM_FAILED
        error = f"step {failed[0]} failed: {first.error}"
    nodes.close_open(conn, rows, now)
    run = q.update_run(
        conn,
        run,
        status=outcome.value,
        finished_at=now,
        error_code=error_code,
        error=redact(error) if error else None,
    )
    audit_run(conn, "pipeline.run.finish", run, actor)
    q.announce_run_ended(conn)
    return run


def wake_parent(conn: Connection, child: PipelineRun) -> None:
    """Call a ``flow.callPipeline`` step waiting for ``child`` again now.

    Its own transaction, after the child's: locks go parent run first, then its steps,
    as everywhere else.
    """
    step_id, index = child.parent_step_id, child.parent_item_index
    if not child.parent_run_id or step_id is None or index is None:
        return
    parent_run = q.lock_run(conn, child.parent_run_id)
    if parent_run is None or parent_run.status != RunStatus.RUNNING:
        return
    key = StepKey(child.parent_run_id, step_id, index)
    parent = q.get_step(conn, key)
    if parent is not None and parent.status in (S.SUSPENDED, S.RUNNING):
        # Still running: the child ended before the body that started it suspended;
        # the suspension then takes this earlier time (see steps.suspend).
        q.wake_at(conn, key, utcnow())


def cancel_run(conn: Connection, run_id: str, *, actor: str, reason: str | None) -> PipelineRun:
    """Cancel a run and its child runs; pending steps are skipped, the rest cancelled."""
    run = q.lock_run(conn, run_id)
    if run is None:
        raise PipelineError("run_not_found", f"no run {run_id}", status=404)
    if RunStatus(run.status) in TERMINAL_RUN_STATUSES:
        return run
    for child in q.child_runs(conn, run_id):
        if child.status == RunStatus.RUNNING:
            cancel_run(conn, child.run_id, actor=actor, reason="parent run cancelled")
    return finish_run(
        conn,
        run,
        RunStatus.CANCELLED,
        error_code=Code.CANCELLED,
        error=reason or "cancelled",
        actor=actor,
    )
