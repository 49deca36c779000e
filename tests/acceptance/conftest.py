"""A Gitea emulator and a forgeflow wired to it, both on real sockets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from forgeflow.config import Role
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.cluster import SCRIPTED
from tests.support.forgeflow import WEBHOOK_SECRET, Running, run_forgeflow
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
    monkeypatch.setenv("FORGEFLOW_TEST_TURN_SECONDS", "0.3")
    monkeypatch.setenv("FORGEFLOW_TEST_TRACE", str(tmp_path / "trace.jsonl"))
    bot_token = gitea.add_user(BOT)
    gitea.add_user("alice")
    for repo in ("widget", "gadget"):
        gitea.add_repo("acme", repo)
        gitea.set_permission("acme", repo, "alice", "write")
        gitea.set_permission("acme", repo, BOT, "admin")
    with run_forgeflow(
        tmp_path / "ff",
        db_url,
        role=Role.ALL,
        gitea_url=gitea.url,
        gitea_token=bot_token,
        agent_runtime=SCRIPTED,
        retry_base_seconds=0.1,
        poll_seconds=0.5,
    ) as ff:
        for repo in ("widget", "gadget"):
            gitea.add_hook("acme", repo, url=ff.webhook_url, secret=WEBHOOK_SECRET)
        yield gitea, ff
