"""A Gitea emulator and a forgeflow wired to it, both on real sockets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from forgeflow_testkit.gitea_emulator import GiteaEmulator
from forgeflow_testkit.model_server import ScriptedModel
from tests.support.agentic import Agentic, start_agentic
from tests.support.forgeflow import WEBHOOK_SECRET, Running, run_forgeflow
from tests.support.worker import start_worker
from tests.support.world import BOT, World


@pytest.fixture
def gitea(tmp_path: Path) -> Iterator[GiteaEmulator]:
    emu = GiteaEmulator(tmp_path / "gitea-repos")
    emu.start()
    try:
        yield emu
    finally:
        emu.stop()


@pytest.fixture
def world(gitea: GiteaEmulator, tmp_path: Path, db_url: str) -> Iterator[World]:
    bot_token = gitea.add_user(BOT)
    gitea.add_user("alice")
    gitea.add_user("mallory")
    gitea.add_repo("acme", "widget")
    gitea.set_permission("acme", "widget", "alice", "write")
    gitea.set_permission("acme", "widget", "mallory", "read")
    gitea.set_permission("acme", "widget", BOT, "admin")
    issue = gitea.add_issue("acme", "widget", title="Flaky test", author="alice")
    gitea.push_branch("acme", "widget", "feature", {"f.txt": "x\n"}, base="main")
    pull = gitea.add_pull("acme", "widget", title="Feature", head="feature", author="alice")
    with run_forgeflow(tmp_path / "ff", db_url, gitea_url=gitea.url, gitea_token=bot_token) as ff:
        gitea.add_hook("acme", "widget", url=ff.webhook_url, secret=WEBHOOK_SECRET)
        yield World(gitea, ff, bot_token, issue, pull)


@pytest.fixture
def worker(
    gitea: GiteaEmulator, tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[GiteaEmulator, Running]]:
    yield from start_worker(gitea, tmp_path, db_url, monkeypatch)


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as scripted:
        yield scripted


@pytest.fixture
def agentic(
    gitea: GiteaEmulator,
    model: ScriptedModel,
    tmp_path: Path,
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Agentic]:
    """forgeflow with the real codex app-server on SQLite (tests/support/agentic.py)."""
    yield from start_agentic(gitea, model, tmp_path, sqlite_url, monkeypatch)
