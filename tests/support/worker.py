"""A whole forgeflow (role all, scripted runtime) on two emulated repositories."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from forgeflow.config import Role
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.cluster import SCRIPTED
from tests.support.forgeflow import WEBHOOK_SECRET, Running, run_forgeflow
from tests.support.world import BOT


def start_worker(
    gitea: GiteaEmulator,
    tmp_path: Path,
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    *,
    turn_seconds: str = "0.3",
    repos: tuple[str, ...] = ("widget", "gadget"),
) -> Iterator[tuple[GiteaEmulator, Running]]:
    """A whole forgeflow (role all, scripted runtime) on acme/<repo> for each of
    ``repos``, their webhooks pointing at it."""
    monkeypatch.setenv("FORGEFLOW_TEST_TURN_SECONDS", turn_seconds)
    monkeypatch.setenv("FORGEFLOW_TEST_TRACE", str(tmp_path / "trace.jsonl"))
    bot_token = gitea.add_user(BOT)
    gitea.add_user("alice")
    for repo in repos:
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
        for repo in repos:
            gitea.add_hook("acme", repo, url=ff.webhook_url, secret=WEBHOOK_SECRET)
        yield gitea, ff
