"""The short crash harness: kill -9 under load on each database, every CI run.

The long run and its figures: ``python -m tests.chaos.harness --long`` and docs/CHAOS.md.
Set ``FORGEFLOW_CHAOS_SEED`` to replay a seed printed by an earlier run.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from tests.chaos.harness import ChaosConfig, run_chaos

pytestmark = pytest.mark.chaos

# About 25 s of load and kills; the drain can last up to a minute more: a comment intent
# left pending by a kill is taken over at once by a worker started after it, but by the
# other, older worker only after it aged 60 s (comment_intents.IN_FLIGHT).
CI = ChaosConfig(repos=10, tasks=50, kills=6, workers=2, gap=(0.3, 1.5), drain_timeout=100)


def test_kill9_under_load_keeps_every_promise(
    db_url: str, tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    config = replace(CI, database="sqlite" if db_url.startswith("sqlite") else "postgres")
    if seed := os.environ.get("FORGEFLOW_CHAOS_SEED"):
        config = replace(config, seed=int(seed))
    result = run_chaos(config, tmp_path, db_url)
    report = result.render()
    record_property("figures", report)
    print(report)
    assert result.figures["kills"] == config.kills, report
    assert result.figures["tasks"] == config.tasks, report
    assert result.violations == [], report
