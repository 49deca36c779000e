"""What the agent did, in the browser: the task page's transcript growing while the real
turn runs, the links from Gitea to it, and a session's conversation with its published diff."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from forgeflow.domain.markers import parse_marker
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from forgeflow_testkit.model_server import ScriptedModel
from forgeflow_testkit.model_steps import (
    ShellCall,
)
from tests.browser.conftest import ARTIFACTS
from tests.support.agentic import Agentic, start_agentic
from tests.support.forgeflow import ADMIN_TOKEN
from tests.support.turns import script_turn, shell_turn

# Where people would reach forgeflow; the tests follow the links' paths on the real server.
PUBLIC_URL = "https://forgeflow.example"


@pytest.fixture
def agentic(tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Agentic]:
    gitea = GiteaEmulator(tmp_path / "gitea-repos")
    gitea.start()
    try:
        with ScriptedModel() as model:
            yield from start_agentic(
                gitea, model, tmp_path, sqlite_url, monkeypatch, public_url=PUBLIC_URL
            )
    finally:
        gitea.stop()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    context.set_default_timeout(30_000)
    opened = context.new_page()
    errors: list[str] = []
    opened.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield opened
        # No script error and no Content-Security-Policy violation on any page.
        assert errors == []
    finally:
        context.close()


def sign_in(page: Page) -> None:
    page.fill("input[name=token]", ADMIN_TOKEN)
    page.fill("input[name=operator]", "alice")
    page.click("button:has-text('Sign in')")
    page.wait_for_selector("text=admin:alice")


def test_the_transcript_grows_on_the_task_page_while_the_turn_runs(
    page: Page, agentic: Agentic
) -> None:
    page.goto(agentic.ff.url + "/ui/")
    sign_in(page)

    script_turn(
        agentic.model,
        [ShellCall("echo first-step"), ShellCall("echo second-step")],
        pauses=[0.0, 4.0],
    )
    task_id = agentic.mention("@ccweb-bot please look around")
    page.goto(f"{agentic.ff.url}/ui/tasks/{task_id}")
    page.evaluate("window.__sameDocument = true")
    transcript = page.locator("#task-transcript")
    expect(transcript).to_contain_text("first-step", timeout=30_000)
    # The reader opens the first command's output; the page keeps it open as it grows.
    page.locator("#task-transcript details", has_text="first-step").locator("summary").click()
    expect(transcript).to_contain_text("second-step", timeout=30_000)
    expect(page.locator("#task-state")).to_have_text("succeeded", timeout=30_000)
    expect(transcript).to_contain_text("Done.")
    first = page.locator("#task-transcript details", has_text="first-step")
    assert first.get_attribute("open") is not None
    expect(first.locator("pre")).to_contain_text("first-step")
    assert page.evaluate("window.__sameDocument") is True
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "transcript.png"), full_page=True)


def link_path(body: str) -> str:
    """The path of the task-page link in a bot comment (on this test's real server)."""
    found = re.search(re.escape(PUBLIC_URL) + r"(/ui/tasks/[^)\s]+)\)", body)
    assert found is not None, body
    return found.group(1)


def test_the_receipt_and_the_answer_link_to_the_task_page(page: Page, agentic: Agentic) -> None:
    turn = shell_turn(agentic, "true")
    receipt, answer = agentic.bot_comments()
    assert receipt["body"].startswith("giteabot: 已收到")
    path = link_path(receipt["body"])
    assert path == f"/ui/tasks/{turn.task_id}"
    # The agent's own answer gained the link, and its marker is still the last line.
    assert link_path(answer["body"]) == path
    assert parse_marker(answer["body"]) is not None
    assert answer["body"].rstrip().splitlines()[-1].startswith("<!--")
    # Someone who follows it signs in first, then sees the task.
    page.goto(agentic.ff.url + path)
    expect(page.locator("input[name=token]")).to_be_visible()
    sign_in(page)
    assert page.url == agentic.ff.url + path
    expect(page.locator("#task-state")).to_have_text("succeeded")
    expect(page.locator("#task-transcript")).to_contain_text("Done.")


def test_the_session_page_shows_the_conversation_and_the_published_diff(
    page: Page, agentic: Agentic
) -> None:
    first = shell_turn(agentic, "true", "@ccweb-bot what does this repository do?")
    second = shell_turn(
        agentic,
        "echo 'fixed line' > fix.txt && git add fix.txt && git commit -qm 'Fix it'",
        "@ccweb-bot please fix it",
    )
    session_key = second.detail["task"]["sessionKey"]
    assert first.detail["task"]["sessionKey"] == session_key
    page.goto(agentic.ff.url + f"/ui/tasks/{second.task_id}")
    sign_in(page)
    page.click(f"#task-workspace a:has-text('{session_key}')")
    conversation = page.locator("#session-conversation")
    expect(conversation).to_contain_text("what does this repository do?")
    expect(conversation).to_contain_text("please fix it")
    expect(conversation.locator(".answer")).to_have_count(2)
    expect(conversation).to_contain_text("pushed")
    diff = page.locator("#session-diff pre.diff")
    expect(diff).to_contain_text("+fixed line")
    expect(diff).to_contain_text("fix.txt")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "session.png"), full_page=True)
