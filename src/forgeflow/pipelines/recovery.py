"""The safety catches of steps whose execution stopped: an executor that died (its lease
expired, or a dead incarnation of this node held it) and a suspension that lasted too
long. Each is a unit of work of its own, one step per transaction.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Connection

from forgeflow.domain.pipeline_records import PipelineRun, PipelineStep
from forgeflow.pipelines import nodes, runs, snapshots
from forgeflow.pipelines.kinds import Code, RunStatus, StepStatus
from forgeflow.pipelines.steps import current_rows, node_of
from forgeflow.store import pipeline_recovery as qr
from forgeflow.store import pipelines as q
from forgeflow.store.pipelines import StepKey
from forgeflow.store.types import utcnow

S = StepStatus


def _safety_fail(
    conn: Connection, run: PipelineRun, row: PipelineStep, code: str, error: str
) -> PipelineRun:
    """The safety catches fail the whole run, whatever ``continueOnFail`` says."""
    row = nodes.finish_step(conn, row, S.FAILED, error_code=code, error=error)
    return runs.finish_run(
        conn, run, RunStatus.FAILED, error_code=code, error=f"step {row.step_id}: {error}"
    )


def abandoned(
    row: PipelineStep,
    *,
    owner: str,
    node_prefix: str,
    startup: bool,
    now: datetime,
    executing: frozenset[StepKey] = frozenset(),
) -> bool:
    """Whether a claimed step's executor is gone: its lease expired (and this engine is
    not executing it), or — at start-up — a dead incarnation of this node held it. Pure."""
    holder = row.claimed_by or ""
    if not holder or StepKey.of(row) in executing:
        return False
    expired = row.lease_expires_at is not None and row.lease_expires_at <= now
    return expired or (startup and holder.startswith(node_prefix) and holder != owner)


def recover(conn: Connection, seen: PipelineStep) -> PipelineRun | None:
    """Take back a step whose executor died (see :func:`abandoned`); one step per
    transaction, so only its own run is locked.

    An idempotent step runs again (a suspended one is polled again); a step with
    ``extras.idempotent: false`` may have applied its side effect, so it fails the run.
    Returns the run when the step was taken back.
    """
    current = current_rows(conn, seen)
    if current is None or current[1].status != S.RUNNING:
        return None
    run, row = current
    if not node_of(run, row).idempotent:
        return _safety_fail(
            conn,
            run,
            row,
            Code.INTERRUPTED_NON_IDEMPOTENT,
            "interrupted while running and declared idempotent: false; "
            "not run again (retry the run with confirmInterrupted to run it deliberately)",
        )
    polled = row.suspended_at is not None and row.suspend is not None
    q.update_step(
        conn,
        row,
        status=(S.SUSPENDED if polled else S.RUNNABLE).value,
        next_attempt_at=utcnow() if polled else None,
        claimed_by=None,
        lease_expires_at=None,
        error_code="interrupted_by_restart",
    )
    return run


def overdue(conn: Connection, now: datetime) -> list[PipelineStep]:
    """Suspended steps past their run's ``suspendedStepTimeout`` (read-only), except
    those with ``extras.awaitApproval: true``."""
    out = []
    for row in qr.suspended_since(conn, now):
        d = snapshots.definition_for(conn, row.run_id)
        if d is None or d.node(row.step_id).awaits_approval:
            continue
        since = row.suspended_at
        if since is not None and since + timedelta(seconds=d.config.suspendedStepTimeout) <= now:
            out.append(row)
    return out


def expire(conn: Connection, seen: PipelineStep) -> PipelineRun | None:
    """Fail a step suspended longer than its run's ``suspendedStepTimeout`` — except
    ``extras.awaitApproval: true`` (``human.gate`` is not exempt). The safety catch
    fails the whole run; returns it then."""
    now = utcnow()
    current = current_rows(conn, seen)
    if current is None or current[1].status != S.SUSPENDED:
        return None
    run, row = current
    if node_of(run, row).awaits_approval:
        return None
    limit = timedelta(seconds=snapshots.definition_of(run).config.suspendedStepTimeout)
    if row.suspended_at is None or row.suspended_at + limit > now:
        return None
    return _safety_fail(
        conn,
        run,
        row,
        Code.SUSPENDED_TIMEOUT,
        f"suspended longer than suspendedStepTimeout ({limit.total_seconds():g}s)",
    )
