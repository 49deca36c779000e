"""Token accounting and budgets: usage from the runtime, threshold events, refusals."""

from __future__ import annotations

import json
from typing import Any

from forgeflow.store import events
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.cluster import wait_for
from tests.support.forgeflow import Running
from tests.support.world import BOT

Worker = tuple[GiteaEmulator, Running]


def _mention(gitea: GiteaEmulator, index: int, text: str) -> dict[str, Any]:
    comment = gitea.post_comment("acme", "widget", index, author="alice", body=text)
    body: dict[str, Any] = json.loads(gitea.delivery_of_comment(comment["id"]).response)
    return body


def _state(ff: Running, task_id: str) -> str:
    with ff.admin() as admin:
        return str(admin.get(f"/api/gitea-workflow/tasks/{task_id}").json()["task"]["state"])


def test_daily_budget_crossing_and_refusal(worker: Worker) -> None:
    gitea, ff = worker
    issue = gitea.add_issue("acme", "widget", title="t", author="alice")
    first = _mention(gitea, issue, "@ccweb-bot one")["taskId"]
    with ff.admin() as admin:
        r = admin.put(
            "/api/gitea-workflow/repos/default:acme/widget/budget",
            json={"requestId": "b1", "dailyTokens": 150, "reason": "pilot"},
        )
        assert r.status_code == 200 and r.json()["dailyTokens"] == 150
    wait_for(lambda: _state(ff, first) == "succeeded")
    # 120 of 150 tokens used: the 80 % threshold was crossed, once.
    crossed = ff.services.store.db.read_sync(lambda c: events.all_of(c, "BudgetThresholdCrossed"))
    assert len(crossed) == 1 and crossed[0].payload["used"] == 120
    second = _mention(gitea, issue, "@ccweb-bot two")["taskId"]
    wait_for(lambda: _state(ff, second) == "succeeded")
    third = _mention(gitea, issue, "@ccweb-bot three")
    assert third["status"] == "rejected" and third["reason"] == "budget_exceeded"
    wait_for(
        lambda: any(
            "daily token budget of 150 tokens" in c["body"]
            for c in gitea.comments("acme", "widget", issue)
            if c["user"]["login"] == BOT
        )
    )
    with ff.admin() as admin:
        report = admin.get("/api/gitea-workflow/usage").json()["items"]
    widget = next(r for r in report if r["repoKey"] == "default:acme/widget")
    assert widget["day"]["inputTokens"] == 200 and widget["day"]["outputTokens"] == 40
    assert widget["limits"]["day"] == 150
    assert widget["sessions"][0]["inputTokens"] == 200
