"""Which claimed steps an engine takes back: expired leases, a dead predecessor's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from forgeflow.domain.pipeline_records import PipelineStep
from forgeflow.pipelines.recovery import abandoned
from forgeflow.store.pipelines import StepKey
from tests.support.pipelines import step_row

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _row(holder: str | None, expires_in: float) -> PipelineStep:
    return step_row("s", claimed_by=holder, lease_expires_at=NOW + timedelta(seconds=expires_in))


@pytest.mark.parametrize(
    ("holder", "expires_in", "startup", "executing", "expected"),
    [
        ("node-b/1", 10, False, False, False),  # another live node, lease valid
        ("node-b/1", -1, False, False, True),  # its lease expired
        ("node-a/0", 10, False, False, False),  # our dead predecessor: only at start-up
        ("node-a/0", 10, True, False, True),
        ("node-a/1", 10, True, False, False),  # ourselves
        ("node-a/1", -1, False, True, False),  # ours, still executing (renewal is late)
        ("node-a/1", -1, False, False, True),  # ours, but nobody executes it any more
        (None, -1, False, False, False),
    ],
)
def test_abandoned(
    holder: str | None, expires_in: float, startup: bool, executing: bool, expected: bool
) -> None:
    row = _row(holder, expires_in)
    live = frozenset({StepKey.of(row)}) if executing else frozenset()
    assert (
        abandoned(
            row, owner="node-a/1", node_prefix="node-a/", startup=startup, now=NOW, executing=live
        )
        is expected
    )
