"""The admin pages in a real browser (issue 6): sign in, pause and resume, cancel,
live updates, and a disabled repository refusing mentions."""

from __future__ import annotations

import re
from typing import Any

from playwright.sync_api import Dialog, expect

from tests.browser.conftest import Stack
from tests.support.cluster import wait_for


def _accept(dialog: Dialog) -> None:
    dialog.accept()


def _api(stack: Stack, path: str) -> dict[str, Any]:
    with stack.ff.admin() as admin:
        body: dict[str, Any] = admin.get("/api/gitea-workflow" + path).json()
        return body


def test_sign_in_and_out(stack: Stack) -> None:
    page = stack.page
    page.goto(stack.ff.url + "/ui/tasks")
    expect(page).to_have_url(re.compile(r"/ui/login\?next=%2Fui%2Ftasks$"))
    page.fill("input[name=token]", "wrong-token")
    page.click("button:has-text('Sign in')")
    expect(page.locator("[role=alert]")).to_contain_text("not the admin token")
    stack.shot("01-sign-in-refused")
    assert [e for e in stack.console_errors if "status of 401" not in e] == []
    stack.console_errors.clear()  # the refused sign-in answered 401, as it should
    page.fill("input[name=token]", "admin-test-token-abcdef")
    page.fill("input[name=operator]", "alice")
    page.click("button:has-text('Sign in')")
    expect(page).to_have_url(stack.ff.url + "/ui/tasks")
    expect(page.locator("header .who")).to_have_text("admin:alice")
    cookie = next(c for c in page.context.cookies() if c["name"] == "ff_session")
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert page.evaluate("document.cookie") == ""  # not readable by scripts
    page.click("button:has-text('Sign out')")
    expect(page).to_have_url(re.compile(r"/ui/login$"))
    page.goto(stack.ff.url + "/ui/")
    expect(page).to_have_url(re.compile(r"/ui/login\?next="))


def test_pause_and_resume(stack: Stack) -> None:
    stack.sign_in()
    page = stack.page
    page.fill("#ov-control input[name=reason]", "upgrading <the> runners")
    page.click("#ov-control button:has-text('Pause')")
    expect(page.locator(".flash.ok")).to_contain_text("Paused")
    expect(page.locator("#ov-control")).to_contain_text("upgrading <the> runners")
    stack.shot("02-overview-paused")
    overview = _api(stack, "/overview")
    assert overview["globalPaused"] is True and overview["updatedBy"] == "admin:alice"
    page.click("#ov-control button:has-text('Resume')")
    expect(page.locator(".flash.ok")).to_contain_text("Resumed")
    expect(page.locator("#ov-control")).to_contain_text("claiming")
    assert _api(stack, "/overview")["globalPaused"] is False


def test_cancel_a_queued_task(stack: Stack) -> None:
    stack.sign_in()
    page = stack.page
    page.click("#ov-control button:has-text('Pause')")  # so the task stays queued
    expect(page.locator(".flash.ok")).to_contain_text("Paused")
    issue = stack.gitea.add_issue("acme", "widget", title="Flaky <b>test</b>", author="alice")
    task_id = stack.mention(issue, "@ccweb-bot fix <script>alert(1)</script> please")
    page.click("nav >> text=Tasks")
    row = page.locator("#task-table tr", has_text=task_id)
    expect(row).to_contain_text("queued")
    expect(row).to_contain_text("<script>alert(1)</script>")  # shown as text
    stack.shot("03-tasks")
    row.locator(f"a:has-text('{task_id}')").click()
    page.once("dialog", _accept)
    page.fill("#task-controls input[name=reason]", "not needed")
    page.click("#task-controls button:has-text('Cancel')")
    expect(page.locator(".flash.ok")).to_contain_text("cancelled")
    expect(page.locator("#task-state")).to_have_text("cancelled")
    expect(page.locator("#task-timeline")).to_contain_text("admin:alice")
    stack.shot("04-task-cancelled")
    detail = _api(stack, f"/tasks/{task_id}")
    assert detail["task"]["state"] == "cancelled"


def test_a_task_reaches_succeeded_without_a_reload(stack: Stack) -> None:
    stack.sign_in()
    page = stack.page
    page.click("#ov-control button:has-text('Pause')")
    issue = stack.gitea.add_issue("acme", "widget", title="Live", author="alice")
    task_id = stack.mention(issue)
    page.goto(f"{stack.ff.url}/ui/tasks/{task_id}")
    expect(page.locator("#task-state")).to_have_text("queued")
    page.evaluate("window.__sameDocument = true")
    with stack.ff.admin() as admin:  # resume from elsewhere: the page is not touched
        admin.post("/api/gitea-workflow/control/resume", json={"requestId": "live-resume"})
    expect(page.locator("#task-state")).to_have_text("succeeded", timeout=30_000)
    assert page.evaluate("window.__sameDocument") is True
    expect(page.locator("#task-turns")).to_contain_text("100")  # input tokens of the turn
    expect(page.locator("#task-comments")).to_contain_text("final")
    expect(page.locator("#task-timeline")).to_contain_text("verifying_reply")
    stack.shot("05-task-succeeded-live")


def test_disable_a_repository_and_a_new_mention_is_refused(stack: Stack) -> None:
    issue = stack.gitea.add_issue("acme", "widget", title="Disable", author="alice")
    first = stack.mention(issue)  # registers the repository
    wait_for(lambda: _api(stack, f"/tasks/{first}")["terminal"], 30, "first task done")
    stack.sign_in()
    page = stack.page
    page.click("nav >> text=Repositories")
    page.once("dialog", _accept)
    page.click("#repo-table button:has-text('Disable')")
    expect(page.locator(".flash.ok")).to_contain_text("default:acme/widget is disabled")
    expect(page.locator("#repo-table")).to_contain_text("disabled")
    stack.shot("06-repositories")
    again = stack.gitea.post_comment(
        "acme", "widget", issue, author="alice", body="@ccweb-bot again"
    )
    refused = stack.gitea.delivery_of_comment(again["id"])
    assert refused.status_code == 409 and "repository_disabled" in refused.response
    page.click("nav >> text=Deliveries")
    row = page.locator("#delivery-table tr", has_text="repository_disabled")
    expect(row).to_contain_text("rejected")
    expect(row).to_contain_text("409")
    stack.shot("07-deliveries")
    page.click("nav >> text=Repositories")
    page.click("#repo-table button:has-text('Enable')")
    expect(page.locator(".flash.ok")).to_contain_text("is active")
    # The repository's own page: its record and its environment (none declared here).
    page.click("#repo-table a:has-text('default:acme/widget')")
    expect(page.locator("h1")).to_have_text("default:acme/widget")
    expect(page.locator("#repo-environment")).to_contain_text("None declared")
    stack.shot("07b-repository")
    stack.mention(issue, "@ccweb-bot and now?")
