"""The whole mention path with a worker: receipt, turn, verified reply (scripted runtime)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.cluster import wait_for
from tests.support.forgeflow import Running
from tests.support.world import BOT


def _task(ff: Running, task_id: str) -> dict[str, Any]:
    with ff.admin() as admin:
        detail: dict[str, Any] = admin.get(f"/api/gitea-workflow/tasks/{task_id}").json()
        return detail


def _mention(gitea: GiteaEmulator, index: int) -> str:
    """The task of the mention this posts (read from its own delivery, not the newest)."""
    comment = gitea.post_comment("acme", "widget", index, author="alice", body="@ccweb-bot fix it")
    task_id: str = json.loads(gitea.delivery_of_comment(comment["id"]).response)["taskId"]
    return task_id


def _bot_comments(gitea: GiteaEmulator, index: int) -> list[dict[str, Any]]:
    return [c for c in gitea.comments("acme", "widget", index) if c["user"]["login"] == BOT]


def test_mention_ends_succeeded_with_one_receipt_and_a_verified_reply(
    worker: tuple[GiteaEmulator, Running],
) -> None:
    gitea, ff = worker
    issue = gitea.add_issue("acme", "widget", title="Bug", author="alice")
    task_id = _mention(gitea, issue)
    detail = wait_for(lambda: (d := _task(ff, task_id))["terminal"] and d)
    assert detail["task"]["state"] == "succeeded", detail["task"]
    path = [(e["fromState"], e["toState"]) for e in detail["audit"] if e["toState"]]
    assert path == [
        ("received", "queued"),
        ("queued", "preparing"),
        ("preparing", "running"),
        ("running", "verifying_reply"),
        ("verifying_reply", "succeeded"),
    ]
    bot = _bot_comments(gitea, issue)
    receipts = [c for c in bot if "kind=receipt" in c["body"]]
    finals = [c for c in bot if "kind=final" in c["body"]]
    assert len(receipts) == 1 and receipts[0]["body"].startswith("giteabot: 已收到")
    assert len(finals) == 1
    assert receipts[0]["id"] < finals[0]["id"]
    assert detail["turns"][0]["turnKey"] == f"{task_id}:1"
    assert detail["task"]["inputTokens"] == 100
    # The bot's own comments were delivered back to forgeflow and ignored (AC-07).
    # Its edits of the receipt (the tracking comment, #25) come back too, ignored as edits.
    own = [d for d in gitea.deliveries if d.payload["sender"]["login"] == BOT]
    created = [d.response for d in own if d.payload.get("action") == "created"]
    assert created and all("bot_comment" in r for r in created)
    assert all('"status":"ignored"' in d.response for d in own)
    actions = {e["action"] for e in detail["audit"]}
    assert {
        "workspace.clone",
        "workspace.status",
        "comment.intent",
        "comment.result",
        "turn.intent",
        "turn.start",
        "mcp.call",
        "reply.found",
    } <= actions


def test_forgotten_reply_gets_one_retry_then_succeeds(
    worker: tuple[GiteaEmulator, Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    gitea, ff = worker
    runtime = ff.services.runtime
    assert runtime is not None
    runtime.reply = "none-once"  # type: ignore[attr-defined]
    issue = gitea.add_issue("acme", "widget", title="Bug", author="alice")
    task_id = _mention(gitea, issue)
    detail = wait_for(lambda: (d := _task(ff, task_id))["terminal"] and d)
    assert detail["task"]["state"] == "succeeded", detail["task"]
    assert [t["kind"] for t in detail["turns"]] == ["normal", "reply_retry"]
    assert detail["task"]["replyAttempt"] == 1


def test_reply_never_posted_falls_back_to_rest(worker: tuple[GiteaEmulator, Running]) -> None:
    gitea, ff = worker
    ff.services.runtime.reply = "none"  # type: ignore[union-attr]
    issue = gitea.add_issue("acme", "widget", title="Bug", author="alice")
    task_id = _mention(gitea, issue)
    detail = wait_for(lambda: (d := _task(ff, task_id))["terminal"] and d)
    assert detail["task"]["state"] == "succeeded_with_rest_fallback", detail["task"]
    assert detail["task"]["replyError"] == "mcp_reply_missing"
    fallbacks = [c for c in _bot_comments(gitea, issue) if "kind=fallback" in c["body"]]
    assert len(fallbacks) == 1 and fallbacks[0]["body"].startswith(f"done: {task_id}")
