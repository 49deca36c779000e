"""A step's moves as units of work: claim, succeed, suspend, fail, gate decisions (the
safety catches for dead executors and long suspensions are in :mod:`.recovery`).

Every move takes the run row lock first, then compare-and-swaps the step row on its
version: a result for a row that moved on (cancelled, recovered, decided) is dropped.
A step's completion, its state-bag write and the planning that follows commit together.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection

from forgeflow.domain.json import JsonObject
from forgeflow.domain.pipeline_records import PipelineRun, PipelineStep, RunChange, StepChange
from forgeflow.pipelines import nodes, runs, snapshots
from forgeflow.pipelines import state as bag
from forgeflow.pipelines.definition import NodeSpec
from forgeflow.pipelines.kinds import NODE_ROW, Code, RunStatus, StepKind, StepStatus
from forgeflow.pipelines.planner import has_slot, over_budget
from forgeflow.pipelines.registry import Done, Suspend
from forgeflow.redaction import redact
from forgeflow.store import pipelines as q
from forgeflow.store.pipelines import StepKey
from forgeflow.store.types import utcnow

S = StepStatus
APPROVAL = "awaiting_approval"


@dataclass(frozen=True, slots=True)
class Claimed:
    step: PipelineStep
    run: PipelineRun


def current_rows(conn: Connection, seen: PipelineStep) -> tuple[PipelineRun, PipelineStep] | None:
    """The run (locked) and the step row, if the step is still as the caller saw it."""
    run = snapshots.lock(conn, seen.run_id)
    if run is None or run.status != RunStatus.RUNNING:
        return None
    row = q.get_step(conn, StepKey.of(seen))
    if row is None or row.version != seen.version:
        return None
    return run, row


def claim(conn: Connection, seen: PipelineStep, *, owner: str, ttl: timedelta) -> Claimed | None:
    """Start a due step (compare-and-swap), within the run's limits."""
    current = current_rows(conn, seen)
    if current is None:
        return None
    run, row = current
    now = utcnow()
    fresh = row.status == S.RUNNABLE
    due = row.next_attempt_at is None or row.next_attempt_at <= now
    if not (fresh and due) and not (row.status == S.SUSPENDED and row.next_attempt_at and due):
        return None
    d = snapshots.definition_of(run)
    executing, executed = q.run_counts(conn, run.run_id)
    if not has_slot(d.config.maxConcurrentSteps, executing):
        return None
    if fresh and over_budget(d.config.maxSteps, executed):
        runs.finish_run(
            conn,
            run,
            RunStatus.FAILED,
            error_code=Code.MAX_STEPS_EXCEEDED,
            error=f"the run reached its limit of {d.config.maxSteps} step executions",
        )
        return None
    return Claimed(_take(conn, row, owner=owner, ttl=ttl, now=now), run)


def _take(
    conn: Connection, row: PipelineStep, *, owner: str, ttl: timedelta, now: datetime
) -> PipelineStep:
    fresh = row.status == S.RUNNABLE
    return q.update_step(
        conn,
        row,
        status=S.RUNNING.value,
        claimed_by=owner,
        lease_expires_at=now + ttl,
        attempt=row.attempt + 1 if fresh else row.attempt,
        started_at=row.started_at or now,
        next_attempt_at=None,
    )


def claim_ready(
    conn: Connection, run: PipelineRun, *, owner: str, ttl: timedelta, limit: int
) -> tuple[list[Claimed], bool]:
    """Claim, in the caller's transaction (the run row held), the run's runnable steps
    that are due now — those the step that just finished made runnable — so they start
    at once instead of after the next claim round's read and its own transaction.

    Returns the claims and whether due steps were left for the claim round (a limit
    was reached; the round also fails a run over its ``maxSteps``).
    """
    if run.status != RunStatus.RUNNING:
        return [], False
    now = utcnow()
    ready = q.runnable_steps(conn, run.run_id, now)
    if not ready:
        return [], False
    d = snapshots.definition_of(run)
    executing, executed = q.run_counts(conn, run.run_id)
    out: list[Claimed] = []
    for row in ready:
        if (
            len(out) >= limit
            or not has_slot(d.config.maxConcurrentSteps, executing)
            or over_budget(d.config.maxSteps, executed)
        ):
            return out, True
        out.append(Claimed(_take(conn, row, owner=owner, ttl=ttl, now=now), run))
        executing += 1
        executed += 1
    return out, False


def node_of(run: PipelineRun, row: PipelineStep) -> NodeSpec:
    """The node of the run's definition a step row belongs to."""
    return snapshots.definition_of(run).node(row.step_id)


def succeed(
    conn: Connection,
    seen: PipelineStep,
    done: Done,
    *,
    input_snapshot: Mapping[str, object] | None = None,
) -> PipelineRun | None:
    """Record a step's output, merge it into the state bag, plan what follows; None
    (and nothing written) when the step moved on while its body ran."""
    run = snapshots.lock(conn, seen.run_id)
    if run is None or run.status != RunStatus.RUNNING:
        return None
    # The step row is not read again: the compare-and-swap on the version the engine
    # claimed, and on its status, is what tells that it did not move on meanwhile.
    return _succeed(conn, run, seen, done, input_snapshot=input_snapshot, was=S.RUNNING)


def succeed_and_claim(
    conn: Connection,
    seen: PipelineStep,
    done: Done,
    *,
    input_snapshot: Mapping[str, object] | None = None,
    owner: str,
    ttl: timedelta,
    limit: int,
) -> tuple[PipelineRun | None, list[Claimed], bool]:
    """Record a step's success, plan what follows and claim (up to ``limit``) what
    became runnable, in one transaction: (run, claims, steps left for the claim round).
    The run is None when the step moved on while its body ran (the result is dropped)."""
    run = succeed(conn, seen, done, input_snapshot=input_snapshot)
    if run is None or limit <= 0:
        return run, [], True
    claimed, left = claim_ready(conn, run, owner=owner, ttl=ttl, limit=limit)
    return run, claimed, left


def _succeed(
    conn: Connection,
    run: PipelineRun,
    row: PipelineStep,
    done: Done,
    *,
    input_snapshot: Mapping[str, object] | None,
    was: StepStatus | None = None,
) -> PipelineRun | None:
    """``row`` succeeded with ``done``; None when it is no longer ``was`` at its version."""
    node = node_of(run, row)
    output = redact(done.output)
    new_state = run.state
    if row.item_index == NODE_ROW:
        try:
            new_state = nodes.write_output(run, node, output)
        except bag.ReducerError as exc:
            if was is not None and not _unmoved(conn, row, was):
                return None
            nodes.fail_node(conn, run, node, row, Code.REDUCER_ERROR, str(exc))
            return runs.advance(conn, run.run_id)
    routes = list(done.routes) if done.routes is not None and node.kind is StepKind.ROUTER else None
    ended = nodes.finished(S.SUCCEEDED, output=output, routes=routes, error_code=None, error=None)
    if input_snapshot is not None:
        ended["input"] = redact(input_snapshot)
    if q.update_step_if(conn, row, ended, was=was) is None:
        return None
    # The run row is written only when the step changed it (no-op steps leave it be).
    changes: RunChange = {}
    if new_state is not run.state:
        changes["state"] = new_state
    if done.input_tokens or done.output_tokens or done.cost:
        changes["input_tokens"] = run.input_tokens + done.input_tokens
        changes["output_tokens"] = run.output_tokens + done.output_tokens
        changes["cost"] = run.cost + done.cost
    if changes:
        run = q.update_run(conn, run, **changes)
    return runs.advance(conn, run.run_id, locked=run)


def _unmoved(conn: Connection, seen: PipelineStep, was: StepStatus) -> bool:
    row = q.get_step(conn, StepKey.of(seen))
    return row is not None and row.version == seen.version and row.status == was


def suspend(
    conn: Connection,
    seen: PipelineStep,
    s: Suspend,
    *,
    input_snapshot: Mapping[str, object] | None = None,
) -> bool:
    """Park a step until ``s.until`` (or until an approval / a cancel)."""
    current = current_rows(conn, seen)
    if current is None or current[1].status != S.RUNNING:
        return False
    _, row = current
    now = utcnow()
    extra: StepChange = {} if input_snapshot is None else {"input": redact(input_snapshot)}
    until = s.until
    woken = row.next_attempt_at  # set while running: woken before it could suspend
    if woken is not None and (until is None or woken < until):
        until = woken
    changes: StepChange = {
        "status": S.SUSPENDED.value,
        "suspended_at": row.suspended_at or now,
        "next_attempt_at": until,
        "suspend": redact({"reason": s.reason, "data": s.data or {}}),
        "claimed_by": None,
        "lease_expires_at": None,
    }
    changes.update(extra)
    q.update_step(conn, row, **changes)
    return True


def fail(
    conn: Connection,
    seen: PipelineStep,
    code: str,
    error: str,
    *,
    retry_at: datetime | None = None,
    input_snapshot: Mapping[str, object] | None = None,
) -> PipelineRun | None:
    """A failed execution: try again at ``retry_at``, else the step fails (and with it
    the run, unless the node continues on failure)."""
    current = current_rows(conn, seen)
    if current is None or current[1].status != S.RUNNING:
        return None
    run, row = current
    extra: StepChange = {} if input_snapshot is None else {"input": redact(input_snapshot)}
    if retry_at is not None:
        changes: StepChange = {
            "status": S.RUNNABLE.value,
            "next_attempt_at": retry_at,
            "error_code": code,
            "error": redact(error),
            "claimed_by": None,
            "lease_expires_at": None,
            "suspend": None,
            "suspended_at": None,
        }
        changes.update(extra)
        q.update_step(conn, row, **changes)
        return run
    if extra:
        row = q.update_step(conn, row, **extra)
    nodes.fail_node(conn, run, node_of(run, row), row, code, error)
    return runs.advance(conn, run.run_id)


def decide(
    conn: Connection,
    run_id: str,
    step_id: str,
    item_index: int,
    *,
    approve: bool,
    actor: str,
    reason: str | None,
) -> tuple[int, JsonObject]:
    """Approve or reject a suspended gate step; (HTTP status, answer)."""
    run = q.lock_run(conn, run_id)
    if run is None:
        return 404, {"error": "run_not_found", "message": f"no run {run_id}"}
    row = q.get_step(conn, StepKey(run_id, step_id, item_index))
    if row is None:
        return 404, {"error": "step_not_found", "message": f"no step {step_id} in run {run_id}"}
    answer: JsonObject = {"runId": run_id, "stepId": step_id, "itemIndex": item_index}
    suspended = (row.suspend or {}).get("reason") == APPROVAL
    if run.status != RunStatus.RUNNING or row.status != S.SUSPENDED or not suspended:
        return 409, {
            "error": "step_not_awaiting_approval",
            "message": f"step {step_id} is {row.status}, not waiting for an approval",
            "status": row.status,
            **answer,
        }
    decision = "approved" if approve else "rejected"
    output: JsonObject = {"decision": decision, "by": actor, "reason": reason}
    runs.audit_run(
        conn,
        f"pipeline.step.{'approve' if approve else 'reject'}",
        run,
        actor,
        stepId=step_id,
        itemIndex=None if item_index == NODE_ROW else item_index,
        reason=reason,
    )
    if approve:
        run_after = _succeed(conn, run, row, Done(output), input_snapshot=None)
    else:
        row = q.update_step(conn, row, output=output)
        nodes.fail_node(
            conn, run, node_of(run, row), row, Code.GATE_REJECTED, f"rejected by {actor}: {reason}"
        )
        run_after = runs.advance(conn, run_id)
    return 200, {**answer, "decision": decision, "runStatus": (run_after or run).status}
