"""Sign in with Gitea in a real browser: through the emulator's sign-in and grant pages,
a reader of ``acme/widget`` follows its task's transcript live while the real turn runs
and finds nothing of ``acme/secret`` (by URL, in the list, in the live feed); a writer
aborts the turn, which the reader could not. No page, URL, cookie, log line or database
row holds the user's Gitea token."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Dialog, Page, Response, expect

from forgeflow_testkit.codex_home import write_codex_home
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from forgeflow_testkit.model_server import ScriptedModel
from forgeflow_testkit.model_steps import ShellCall
from tests.browser.conftest import ARTIFACTS
from tests.support.agentic import Agentic, serve_agentic
from tests.support.forgeflow import WEBHOOK_SECRET
from tests.support.gitea_users import PASSWORDS, World, make_world
from tests.support.turns import script_turn


@dataclass
class Site:
    agentic: Agentic
    world: World
    seen: list[str]  # every URL the browsers asked for, and every page forgeflow sent


@pytest.fixture
def site(tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Site]:
    gitea = GiteaEmulator(tmp_path / "gitea-repos")
    gitea.start()
    try:
        with ScriptedModel() as model:
            home = write_codex_home(tmp_path / "codex-home", model.url)
            for key, value in home.env().items():
                monkeypatch.setenv(key, value)
            world = make_world(gitea, tmp_path / "ff")
            with serve_agentic(
                gitea,
                model,
                world.widget_issue,
                tmp_path,
                sqlite_url,
                world.bot_token,
                public_url=world.public_url,
                listen_port=world.port,
            ) as agentic:
                gitea.add_hook("acme", "secret", url=agentic.ff.webhook_url, secret=WEBHOOK_SECRET)
                yield Site(agentic, world, [])
    finally:
        gitea.stop()


def _context(browser: Browser, site: Site) -> tuple[BrowserContext, Page, list[str]]:
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    context.set_default_timeout(30_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("request", lambda r: site.seen.append(r.url))

    def _body(response: Response) -> None:
        if response.url.startswith(site.agentic.ff.url) and response.status < 300:
            try:
                site.seen.append(response.text())
            except Exception:  # a redirect's or an aborted load's body is gone
                return

    page.on("response", _body)
    return context, page, errors


def _sign_in_with_gitea(page: Page, login: str) -> None:
    """From forgeflow's sign-in page through Gitea's sign-in and grant pages, back."""
    page.click("#gitea-sign-in")
    page.fill("#user_name", login)
    page.fill("#password", PASSWORDS[login])
    page.click("button:has-text('Sign In')")
    expect(page.locator("h1")).to_contain_text("Authorize forgeflow")
    page.click("#authorize")
    expect(page.locator("header .who")).to_have_text(f"gitea:{login}")


def _mention(gitea: GiteaEmulator, repo: str, issue: int) -> str:
    comment = gitea.post_comment("acme", repo, issue, author="alice", body="@ccweb-bot look")
    d = gitea.delivery_of_comment(comment["id"])
    assert d.status_code == 202, d.response
    task_id: str = json.loads(d.response)["taskId"]
    return task_id


def _accept(dialog: Dialog) -> None:
    dialog.accept()


def test_a_reader_follows_their_task_and_a_writer_aborts_it(
    browser: Browser, site: Site, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    agentic, gitea, ff = site.agentic, site.world.gitea, site.agentic.ff
    script_turn(agentic.model, [ShellCall("echo secret-work-output")])
    secret = _mention(gitea, "secret", site.world.secret_issue)
    agentic.finished(secret)
    script_turn(
        agentic.model,
        [ShellCall("echo reader-can-see-this"), ShellCall("echo second-step")],
        pauses=[0.0, 30.0],
    )
    widget = agentic.mention("@ccweb-bot please look around")

    reader_context, reader, reader_errors = _context(browser, site)
    reader.goto(f"{ff.url}/ui/tasks/{widget}")  # the link in the receipt
    _sign_in_with_gitea(reader, "rita")
    assert reader.url == f"{ff.url}/ui/tasks/{widget}"
    reader.evaluate("window.__sameDocument = true")
    expect(reader.locator("#task-transcript")).to_contain_text("reader-can-see-this")
    expect(reader.locator("#task-state")).to_have_text("running")
    assert reader.evaluate("window.__sameDocument") is True  # it came live, not by reload
    expect(reader.locator("#read-only")).to_contain_text("need write permission")
    expect(reader.locator("#task-controls")).not_to_contain_text("Abort")
    reader.screenshot(path=str(_artifact("gitea-reader-task.png")), full_page=True)

    # Nothing of acme/secret: by URL, in the list, in the live feed (another tab).
    other = reader_context.new_page()
    other.on("request", lambda r: site.seen.append(r.url))
    answer = other.goto(f"{ff.url}/ui/tasks/{secret}")
    assert answer is not None and answer.status == 404
    expect(other.locator("h1")).to_have_text("Not found")
    other.goto(f"{ff.url}/ui/tasks")
    expect(other.locator(f"a[href='/ui/tasks/{widget}']").first).to_be_visible()
    expect(other.locator(f"a[href='/ui/tasks/{secret}']")).to_have_count(0)
    expect(other.locator("main")).not_to_contain_text("acme/secret")
    assert other.request.get(f"{ff.url}/ui/live?task={secret}").status == 404
    assert other.request.get(f"{ff.url}/ui/live?task={widget}").status == 200
    other.close()

    writer_context, writer, writer_errors = _context(browser, site)
    writer.goto(f"{ff.url}/ui/tasks/{widget}")
    _sign_in_with_gitea(writer, "wendy")
    expect(writer.locator("#task-state")).to_have_text("running")
    writer.once("dialog", _accept)
    writer.click("button:has-text('Abort turn')")
    expect(writer.locator(".flash")).to_contain_text(f"abort: task {widget}")
    expect(writer.locator("#task-state")).not_to_have_text("running")
    # The reader's page, still open, follows the abort live.
    expect(reader.locator("#task-state")).not_to_have_text("running")
    assert reader.evaluate("window.__sameDocument") is True

    # The user's Gitea tokens: in no URL, page, cookie, log line or database row.
    tokens = gitea.oauth_tokens()
    assert len(tokens) >= 4  # an access and a refresh token for each of the two users
    cookies = [c["value"] for ctx in (reader_context, writer_context) for c in ctx.cookies()]
    logs = capfd.readouterr()
    database = b"".join(p.read_bytes() for p in tmp_path.glob("forgeflow.db*"))
    for token in tokens:
        assert not any(token in text for text in site.seen + cookies)
        assert token not in logs.out and token not in logs.err
        assert token.encode() not in database
    # Script errors and CSP violations: none. (A 404 is expected: the reader's look at
    # the secret task, and the emulator's pages have no favicon.)
    unexpected = [e for e in reader_errors + writer_errors if "status of 404" not in e]
    assert unexpected == []
    reader_context.close()
    writer_context.close()


def _artifact(name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / name
