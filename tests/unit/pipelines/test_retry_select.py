"""Which rows a retry takes back (pure): failed and cancelled nodes, and the skipped
ones the planner would not skip again — a dead branch stays skipped."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from forgeflow.domain.pipeline_records import PipelineStep
from forgeflow.pipelines.retry import select
from tests.support.pipelines import dag, step_row

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _rows(**status: str | tuple[str, ...]) -> list[PipelineStep]:
    out = []
    for step, given in status.items():
        st, *rest = (given,) if isinstance(given, str) else given
        out.append(
            step_row(
                step,
                status=st,
                routes=list(rest) or None,
                error_code="boom" if st == "failed" else None,
                started_at=NOW if st in ("failed", "succeeded") else None,
            )
        )
    return out


def test_a_dead_branch_stays_skipped_and_the_failed_branch_runs_again() -> None:
    d = dag(
        "t>r t>soft soft>end t2>y r>x:yes r>y:no x>end y>end",
        r={"kind": "router", "extras": {"switchKey": "inputs.k"}},
        soft={"kind": "listen", "bodyKey": "test.echo", "continueOnFail": True},
        t2="trigger",
    )
    rows = _rows(
        t="succeeded",
        t2="skipped",
        r=("succeeded", "yes"),
        x="failed",
        y="skipped",
        end="skipped",
        soft="failed",
    )
    chosen = select(d, "t", rows)
    # soft failed with continueOnFail: absorbed, not taken; y is a dead branch; t2 did
    # not start this run.
    assert chosen.labels() == ["end", "x"]  # in the definition's order
    assert chosen.interrupted == []


def test_an_interrupted_step_of_a_non_idempotent_node_is_named() -> None:
    d = dag(
        "t>a a>b b>end",
        a={"kind": "listen", "extras": {"idempotent": False}},
        b={"kind": "listen", "extras": {"idempotent": False}},
    )
    rows = _rows(t="succeeded", a="succeeded", b="cancelled", end="skipped")
    rows[2] = replace(rows[2], error_code="run_ended", started_at=NOW)
    assert select(d, "t", rows).interrupted == ["b"]
    # Cancelled before it started: nothing can have happened.
    rows[2] = replace(rows[2], started_at=None)
    assert select(d, "t", rows).interrupted == []
    # A body that failed by itself is known to have finished.
    rows[2] = replace(rows[2], status="failed", error_code="script_failed", started_at=NOW)
    assert select(d, "t", rows).interrupted == []
