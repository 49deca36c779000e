"""Retrying a failed or cancelled run: its failed, cancelled and skipped-by-failure
steps run again; succeeded steps keep their outputs and their writes to the state bag.

What "skipped because of the failure" looks like in the data: a ``skipped`` row with no
error code, closed when the run ended (:func:`nodes.close_open`) — exactly like a node
skipped because a router chose another branch or because its trigger did not start
the run. The columns cannot tell them apart, so the planner does: every row to retry
is taken back to pending, and a skipped row the planner would skip again from the
rows that stay (a dead branch) stays skipped; every other skipped row runs.

A retry is one transaction with the run row locked first, like every other move of a
run: a crash halfway leaves the run as it was (failed or cancelled).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Connection

from forgeflow.domain.json import JsonObject, JsonValue
from forgeflow.domain.pipeline_records import PipelineRun, PipelineStep, StepChange
from forgeflow.pipelines import runs, snapshots, views
from forgeflow.pipelines.definition import PipelineDefinition
from forgeflow.pipelines.kinds import NODE_ROW, Code, RunStatus, StepKind, StepStatus
from forgeflow.pipelines.planner import NodeState, plan
from forgeflow.pipelines.runs import PipelineError
from forgeflow.store import pipelines as q

S = StepStatus
RETRYABLE_RUNS = frozenset({RunStatus.FAILED, RunStatus.CANCELLED})
# Safety catches fail the run whatever ``continueOnFail`` says (recovery.py).
_SAFETY = frozenset({Code.INTERRUPTED_NON_IDEMPOTENT, Code.SUSPENDED_TIMEOUT})
# An execution that ended without its body returning: it may have had its side effect.
_INTERRUPTED = frozenset({Code.INTERRUPTED_NON_IDEMPOTENT, Code.RUN_ENDED, Code.STEP_TIMEOUT})


@dataclass
class Selection:
    """The rows a retry takes back: to pending, and forEach nodes back to running (their
    finished items keep their outputs); ``interrupted`` names the steps that need a
    confirmation."""

    pending: list[PipelineStep] = field(default_factory=list)
    reopened: list[PipelineStep] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)

    def labels(self) -> list[str]:
        """The nodes taken back, in the definition's order."""
        return list(self.nodes)

    def items(self) -> list[str]:
        return [label(r) for r in self.pending if r.item_index != NODE_ROW]


def label(row: PipelineStep) -> str:
    return row.step_id + ("" if row.item_index == NODE_ROW else f"#{row.item_index}")


def _failed_node(d: PipelineDefinition, row: PipelineStep) -> bool:
    """A failed node that failed the run (with ``continueOnFail`` its failure was
    absorbed: the branch after it ran, and running it again would not run that)."""
    return row.status == S.FAILED and (
        not d.node(row.step_id).continueOnFail or row.error_code in _SAFETY
    )


def _skipped_again(
    d: PipelineDefinition, start: str, own: dict[str, PipelineStep], taken: set[str]
) -> set[str]:
    """The nodes the planner skips once the ``taken`` nodes and every skipped node are
    pending again: dead branches, which stay skipped."""
    states = {
        sid: NodeState()
        if sid in taken or r.status == S.SKIPPED
        else NodeState(S(r.status), frozenset(r.routes or ()))
        for sid, r in own.items()
    }
    return set(plan(d, start, states).skip)


def select(d: PipelineDefinition, start: str, rows: list[PipelineStep]) -> Selection:
    """What a retry of a run with these step rows takes back. Pure."""
    own = {r.step_id: r for r in rows if r.item_index == NODE_ROW}
    items: dict[str, list[PipelineStep]] = {}
    for r in rows:
        if r.item_index != NODE_ROW:
            items.setdefault(r.step_id, []).append(r)
    taken = {sid for sid, r in own.items() if _failed_node(d, r) or r.status == S.CANCELLED}
    again = _skipped_again(d, start, own, taken)
    taken |= {sid for sid, r in own.items() if r.status == S.SKIPPED and sid not in again}
    out = Selection()
    for node in d.nodes:
        if node.id not in taken:
            continue
        row = own[node.id]
        out.nodes.append(node.id)
        open_items = [i for i in items.get(node.id, ()) if i.status != S.SUCCEEDED]
        if node.kind is StepKind.FOREACH and items.get(node.id):
            out.reopened.append(row)
            out.pending.extend(open_items)
            chosen = open_items
        else:
            out.pending.append(row)
            chosen = [row]
        if not node.idempotent:
            out.interrupted += [label(r) for r in chosen if _interrupted(r)]
    return out


def _interrupted(row: PipelineStep) -> bool:
    return row.started_at is not None and row.error_code in _INTERRUPTED


_CLEARED: StepChange = {
    "error_code": None,
    "error": None,
    "output": None,
    "finished_at": None,
    "claimed_by": None,
    "lease_expires_at": None,
    "next_attempt_at": None,
}


def _reset(conn: Connection, chosen: Selection) -> None:
    for r in chosen.pending:
        pending: StepChange = {
            **_CLEARED,
            "status": S.PENDING.value,
            # Attempts go on counting (a body's idempotency key stays new: a new child
            # run, a new agent task); ``retry.attempts`` counts from here.
            "retry_base": r.attempt,
            "input": None,
            "routes": None,
            "suspend": None,
            "started_at": None,
            "suspended_at": None,
        }
        q.update_step(conn, r, **pending)
    reopened: StepChange = {**_CLEARED, "status": S.RUNNING.value}
    for r in chosen.reopened:
        q.update_step(conn, r, **reopened)


def retry_run(
    conn: Connection, run_id: str, *, actor: str, confirm_interrupted: bool
) -> tuple[PipelineRun, Selection]:
    """Take a failed or cancelled run's steps back (see :func:`select`), run the planner
    and audit ``pipeline.run.retry``; returns the run, running again, and what was taken."""
    run = q.lock_run(conn, run_id)
    if run is None:
        raise PipelineError("run_not_found", f"no run {run_id}", status=404)
    if RunStatus(run.status) not in RETRYABLE_RUNS:
        raise PipelineError(
            "run_not_retryable",
            f"run {run_id} is {run.status}: only a failed or cancelled run can be retried",
            status=409,
            runStatus=run.status,
        )
    chosen = select(snapshots.definition_of(run), run.start_step_id, q.steps_of(conn, run_id))
    if not chosen.pending and not chosen.reopened:
        raise PipelineError("nothing_to_retry", f"run {run_id} has no step to run again")
    if chosen.interrupted and not confirm_interrupted:
        names = ", ".join(chosen.interrupted)
        raise PipelineError(
            "interrupted_needs_confirmation",
            f"{names}: interrupted while running and declared idempotent: false; its side "
            "effect may have happened. Retry with confirmInterrupted: true to run it again",
            steps=chosen.interrupted,
        )
    before = {"fromStatus": run.status, "fromErrorCode": run.error_code}
    _reset(conn, chosen)
    run = q.update_run(
        conn, run, status=RunStatus.RUNNING.value, finished_at=None, error_code=None, error=None
    )
    runs.audit_run(
        conn,
        "pipeline.run.retry",
        run,
        actor,
        steps=chosen.labels(),
        items=chosen.items(),
        confirmedInterrupted=chosen.interrupted,
        **before,
    )
    return runs.advance(conn, run_id, locked=run) or run, chosen


def answer(conn: Connection, run_id: str, *, actor: str, confirm: bool) -> tuple[int, JsonObject]:
    """:func:`retry_run` as a control's answer (the API and the run page share it)."""
    run, chosen = retry_run(conn, run_id, actor=actor, confirm_interrupted=confirm)
    steps: list[JsonValue] = [*chosen.labels(), *chosen.items()]
    return 200, {"run": views.run_json(run, state=False), "steps": steps}


def interrupted(run: PipelineRun, rows: list[PipelineStep]) -> list[str]:
    """The steps a retry of this run would need a confirmation for (none unless the run
    is failed or cancelled): what the run page asks about next to its Retry button."""
    if RunStatus(run.status) not in RETRYABLE_RUNS:
        return []
    return select(snapshots.definition_of(run), run.start_step_id, rows).interrupted
