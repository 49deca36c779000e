"""Browser tests of the admin pages: Debian's chromium driven by Playwright.

``scripts/setup.sh test`` installs ``/usr/bin/chromium``; Playwright never downloads a
browser of its own here. Screenshots go to ``test-artifacts/ui/`` (git-ignored).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.forgeflow import ADMIN_TOKEN, Running
from tests.support.worker import start_worker

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "ui"


# Module scope, not session: while Playwright's sync API is running it owns an event
# loop on the main thread, and a later test's asyncio.run() would refuse to start.
@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/setup.sh test")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@dataclass
class Stack:
    """A Gitea emulator, forgeflow with its scheduler, and a browser page."""

    gitea: GiteaEmulator
    ff: Running
    page: Page
    console_errors: list[str]

    def mention(self, issue: int, text: str = "@ccweb-bot please fix it") -> str:
        comment = self.gitea.post_comment("acme", "widget", issue, author="alice", body=text)
        d = self.gitea.delivery_of_comment(comment["id"])
        assert d.status_code == 202, d.response
        task_id: str = json.loads(d.response)["taskId"]
        return task_id

    def sign_in(self, operator: str = "alice") -> None:
        self.page.goto(self.ff.url + "/ui/")
        self.page.fill("input[name=token]", ADMIN_TOKEN)
        self.page.fill("input[name=operator]", operator)
        self.page.click("button:has-text('Sign in')")
        self.page.wait_for_selector(f"text=admin:{operator}")

    def shot(self, name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


@pytest.fixture
def stack(
    browser: Browser, tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Stack]:
    gitea = GiteaEmulator(tmp_path / "gitea-repos")
    gitea.start()
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    context.set_default_timeout(15_000)
    worker = start_worker(
        gitea, tmp_path, sqlite_url, monkeypatch, turn_seconds="0.5", repos=("widget",)
    )
    try:
        _, ff = next(worker)
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        yield Stack(gitea, ff, page, errors)
        # No script error and no Content-Security-Policy violation on any page.
        assert errors == []
    finally:
        worker.close()  # forgeflow stops
        context.close()
        gitea.stop()
