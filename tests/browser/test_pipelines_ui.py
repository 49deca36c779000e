"""Pipeline pages in a real browser: start a run from the declared inputs, watch the
gate wait on the DAG, approve it and see the run finish; a disabled template's
triggers are flagged."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import Dialog, expect

from tests.browser.conftest import Stack

GATED: dict[str, Any] = {
    "key": "ship_it",
    "name": "Ship it <carefully>",
    "enabled": True,
    "inputs": [
        {"name": "pr", "type": "integer", "required": True},
        {"name": "note", "type": "string", "description": "why <now>"},
    ],
    "nodes": [
        {"id": "trigger", "kind": "trigger"},
        {
            "id": "approval",
            "kind": "listen",
            "bodyKey": "human.gate",
            "inputs": {"message": "Merge PR #{{inputs.pr}}?"},
        },
        {"id": "done", "kind": "terminal"},
    ],
    "edges": [{"from": "trigger", "to": "approval"}, {"from": "approval", "to": "done"}],
    "triggers": [{"type": "manual"}, {"type": "event", "eventType": "PullRequestPublished"}],
}


def _accept(dialog: Dialog) -> None:
    dialog.accept()


def test_approve_a_gate_and_the_run_finishes(stack: Stack) -> None:
    with stack.ff.admin() as admin:
        assert admin.post("/api/pipelines/templates", json=GATED).status_code == 201
    stack.sign_in()
    page = stack.page
    page.click("nav >> text=Pipelines")
    page.click("#template-table a:has-text('ship_it')")
    expect(page.locator("h1")).to_contain_text("Ship it <carefully>")
    page.fill("#start-form input[name='in.pr']", "42")
    page.fill("#start-form input[name='in.note']", "release <day>")
    stack.shot("08-pipeline-template")
    page.click("#start-form button:has-text('Start a run')")
    expect(page.locator(".flash.ok")).to_contain_text("started")
    gate = page.locator("#run-gates .gate")
    expect(gate).to_contain_text("Merge PR #42?", timeout=15_000)
    expect(page.locator("svg.dag g.st-suspended")).to_have_attribute("data-step", "approval")
    expect(page.locator("#run-state")).to_contain_text("release <day>")
    stack.shot("09-pipeline-run-waiting")
    gate.locator("input[name=reason]").first.fill("looks good")
    gate.locator("button:has-text('Approve')").click()
    expect(page.locator(".flash.ok")).to_contain_text("approved")
    expect(page.locator("#run-status")).to_have_text("succeeded", timeout=15_000)
    expect(page.locator("svg.dag g[data-step=done]")).to_have_class("node st-succeeded")
    stack.shot("10-pipeline-run-finished")
    with stack.ff.admin() as admin:
        runs = admin.get("/api/pipelines/runs", params={"templateKey": "ship_it"}).json()
        assert [r["status"] for r in runs["items"]] == ["succeeded"]
        assert runs["items"][0]["createdBy"] == "admin:alice"
    # Disabling the template flags its triggers.
    page.click("nav >> text=Pipelines")
    page.once("dialog", _accept)
    page.click("#template-table tr:has-text('ship_it') button:has-text('Disable')")
    expect(page.locator(".flash.ok")).to_contain_text("ship_it is disabled")
    # Each of ship_it's two triggers says so (and only its row: built-ins are listed too).
    expect(page.locator("#template-table tr:has-text('ship_it') .flag")).to_have_text(
        ["template disabled", "template disabled"]
    )
    stack.shot("11-pipeline-templates")
