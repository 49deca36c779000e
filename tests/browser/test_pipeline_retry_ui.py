"""In a real browser: the run page's Retry button (and its confirmation for an
interrupted ``idempotent: false`` step), and a webhook trigger's delivery log with the
Replay button."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

import httpx
from playwright.sync_api import Dialog, expect

from tests.browser.conftest import Stack
from tests.support.pipelines import fails_once

SHAKY: dict[str, Any] = {
    "key": "shaky_ui",
    "name": "Fails once",
    "enabled": True,
    "nodes": [
        {"id": "t", "kind": "trigger"},
        *fails_once(),
        {
            "id": "gate",
            "kind": "listen",
            "bodyKey": "human.gate",
            "extras": {"idempotent": False},
            "inputs": {"message": "Ship it?"},
        },
        {"id": "end", "kind": "terminal"},
    ],
    "edges": [
        {"from": "t", "to": "count"},
        {"from": "count", "to": "shaky"},
        {"from": "shaky", "to": "gate"},
        {"from": "gate", "to": "end"},
    ],
    "triggers": [{"type": "manual"}, {"type": "webhook"}],
}


def _accept(dialog: Dialog) -> None:
    dialog.accept()


def _status(admin: httpx.Client, run_id: str, step: str | None = None) -> str:
    run = admin.get(f"/api/pipelines/runs/{run_id}").json()["run"]
    if step is None:
        return str(run["status"])
    return str(next(s["status"] for s in run["steps"] if s["stepId"] == step))


def _wait(admin: httpx.Client, run_id: str, want: str, step: str | None = None) -> None:
    deadline = time.monotonic() + 15
    while _status(admin, run_id, step) != want:
        assert time.monotonic() < deadline, f"{step or 'run'} never {want}"
        time.sleep(0.1)


def test_retry_a_failed_run_then_confirm_an_interrupted_gate(stack: Stack) -> None:
    with stack.ff.admin() as admin:
        assert admin.post("/api/pipelines/templates", json=SHAKY).status_code == 201
        r = admin.post("/api/pipelines/templates/shaky_ui/runs", json={"requestId": "s1"})
        run_id = r.json()["run"]["runId"]
        _wait(admin, run_id, "failed")
    stack.sign_in()
    page = stack.page
    page.goto(f"{stack.ff.url}/ui/pipelines/runs/{run_id}")
    expect(page.locator("#run-status")).to_have_text("failed")
    expect(page.locator("#retry-form input[name=confirmInterrupted]")).to_have_count(0)
    stack.shot("40-pipeline-run-failed")
    page.click("#retry-form button:has-text('Retry')")
    expect(page.locator(".flash.ok[role=status]")).to_contain_text("runs again: shaky, gate, end")
    expect(page.locator("#run-gates .gate")).to_contain_text("Ship it?", timeout=15_000)
    expect(page.locator("#retry-form")).to_have_count(0)
    # The first step ran once: its output is the first run's.
    expect(page.locator("#run-state")).to_contain_text('"stdout": "1"')

    with stack.ff.admin() as admin:
        admin.post(f"/api/pipelines/runs/{run_id}/cancel", json={"requestId": "c1"})
    page.reload()
    expect(page.locator("#run-status")).to_have_text("cancelled")
    box = page.locator("#retry-form input[name=confirmInterrupted]")
    expect(page.locator("#retry-form label.confirm")).to_contain_text("gate")
    page.click("#retry-form button:has-text('Retry')")
    expect(page.locator(".flash.bad[role=status]")).to_contain_text(
        "interrupted_needs_confirmation"
    )
    expect(page.locator("#run-status")).to_have_text("cancelled")
    box.check()
    stack.shot("41-pipeline-run-retry-confirm")
    page.click("#retry-form button:has-text('Retry')")
    expect(page.locator(".flash.ok[role=status]")).to_contain_text("runs again: gate, end")
    gate = page.locator("#run-gates .gate")
    expect(gate).to_contain_text("Ship it?", timeout=15_000)
    gate.locator("button:has-text('Approve')").click()
    expect(page.locator("#run-status")).to_have_text("succeeded", timeout=15_000)
    with stack.ff.admin() as admin:
        audit = admin.get(
            "/api/gitea-workflow/audit", params={"action": "pipeline.run.retry"}
        ).json()["items"]
        assert [(e["actor"], e["metadata"]["steps"]) for e in audit] == [
            ("admin:alice", ["shaky", "gate", "end"]),
            ("admin:alice", ["gate", "end"]),
        ]


def test_the_delivery_log_and_replay(stack: Stack) -> None:
    with stack.ff.admin() as admin:
        created = admin.post("/api/pipelines/templates", json=SHAKY).json()["template"]
    hook = next(t for t in created["triggers"] if t["type"] == "webhook")
    token = hook["webhookPath"].removeprefix("/webhooks/")
    body = json.dumps({"note": "from <ci>"}).encode()
    digest = hmac.new(token.encode(), body, hashlib.sha256).hexdigest()
    signed = {"X-Hub-Signature-256": f"sha256={digest}", "X-Gitea-Delivery": "g-1"}
    url = stack.ff.url + hook["webhookPath"]
    assert httpx.post(url, content=body, headers=signed).status_code == 202
    assert httpx.post(url, content=b'{"x": "refused-canary"}').status_code == 401

    stack.sign_in()
    page = stack.page
    page.goto(f"{stack.ff.url}/ui/pipelines/templates/shaky_ui")
    page.click(".triggers a.trigger-deliveries")
    rows = page.locator("#delivery-table tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("refused")
    expect(rows.nth(0)).to_contain_text("invalid_signature")
    expect(rows.nth(1)).to_contain_text("accepted")
    expect(rows.nth(1)).to_contain_text("x-gitea-delivery:g-1")
    expect(rows.nth(0).locator("button")).to_have_count(0)
    expect(page.locator("body")).not_to_contain_text("refused-canary")
    expect(page.locator("body")).not_to_contain_text(token)
    stack.shot("42-pipeline-trigger-deliveries")
    page.once("dialog", _accept)
    rows.nth(1).locator("button:has-text('Replay')").click()
    expect(page.locator(".flash.ok[role=status]")).to_contain_text("replayed as run")
    expect(page.locator("h1")).to_contain_text("Run")
    expect(page.locator("#run-state")).to_contain_text("from <ci>")
    with stack.ff.admin() as admin:
        runs = admin.get("/api/pipelines/runs", params={"templateKey": "shaky_ui"}).json()
        assert runs["total"] == 2
        assert {r["createdBy"] for r in runs["items"]} == {
            "admin:alice",
            f"trigger:{hook['triggerId']}",
        }
