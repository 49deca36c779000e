"""The pipeline queries of recovery: which steps some engine claims, their leases, the
steps suspended too long, and the finished children nobody woke their parents for."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, and_, or_, select, update

from forgeflow.domain.pipeline_records import PipelineRun, PipelineStep
from forgeflow.store.pipeline_schema import pipeline_runs as runs
from forgeflow.store.pipeline_schema import pipeline_steps as steps
from forgeflow.store.pipelines import StepKey, where_step
from forgeflow.store.rows import pipeline_run, pipeline_step


def claimed_steps(conn: Connection) -> list[PipelineStep]:
    """Every step whose body some engine claims to execute."""
    rows = conn.execute(
        select(steps)
        .where(steps.c.status == "running")
        .where(steps.c.claimed_by.is_not(None))
        .order_by(steps.c.run_id, steps.c.step_id, steps.c.item_index)
    )
    return [pipeline_step(r) for r in rows]


def renew_leases(
    conn: Connection, owner: str, keys: list[StepKey], until: datetime
) -> set[StepKey]:
    """Extend the leases this owner holds; returns the keys it still holds."""
    held = set()
    for key in keys:
        result = conn.execute(
            update(steps)
            .where(where_step(key))
            .where(steps.c.status == "running")
            .where(steps.c.claimed_by == owner)
            .values(lease_expires_at=until)
        )
        if result.rowcount == 1:
            held.add(key)
    return held


def suspended_since(conn: Connection, before: datetime) -> list[PipelineStep]:
    """Suspended steps (of running runs) that were first suspended before ``before``."""
    rows = conn.execute(
        select(steps)
        .join(runs, runs.c.run_id == steps.c.run_id)
        .where(runs.c.status == "running")
        .where(steps.c.status == "suspended")
        .where(steps.c.suspended_at < before)
        .order_by(steps.c.suspended_at)
    )
    return [pipeline_step(r) for r in rows]


def children_done_unseen(conn: Connection, now: datetime) -> list[PipelineRun]:
    """Finished child runs whose parent step still sleeps until a later poll: their
    wake-up (a transaction after the child's own) was lost to a crash between the two."""
    child = runs.alias("child")
    rows = conn.execute(
        select(child, steps.c.suspend)
        .join(
            steps,
            and_(
                steps.c.run_id == child.c.parent_run_id,
                steps.c.step_id == child.c.parent_step_id,
                steps.c.item_index == child.c.parent_item_index,
            ),
        )
        .join(runs, runs.c.run_id == steps.c.run_id)
        .where(runs.c.status == "running", steps.c.status == "suspended")
        .where(or_(steps.c.next_attempt_at.is_(None), steps.c.next_attempt_at > now))
        .where(child.c.status.in_(("succeeded", "failed", "cancelled")))
    )
    # Only the child the step waits for: an earlier attempt's child must not wake it.
    waited = [(r, (r[-1] or {}).get("data") or {}) for r in rows]
    return [pipeline_run(r[:-1]) for r, data in waited if data.get("childRunId") == r[0]]
