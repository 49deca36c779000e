"""A forgeflow running the real `codex app-server` against the scripted Responses-API
model, the PyPI `gitea-mcp` and the Gitea emulator: the harness of the agent tests."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from forgeflow.config import Role
from forgeflow_testkit.codex_home import write_codex_home
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from forgeflow_testkit.model_server import ScriptedModel
from tests.support.cluster import wait_for
from tests.support.forgeflow import WEBHOOK_SECRET, Running, run_forgeflow
from tests.support.world import BOT

ROOT = Path(__file__).resolve().parents[2]
CODEX = ROOT / "tools" / "node" / "node_modules" / ".bin" / "codex"
GITEA_MCP = Path(sys.executable).parent / "gitea-mcp"


def app_server_groups(data_dir: Path) -> list[int]:
    """The process groups of the app-servers forgeflow runs now (one per repository)."""
    groups = []
    for path in (data_dir / "run").glob("codex-*.pgid"):
        try:  # an app-server that ends between the listing and the read removes its file
            groups.append(int(path.read_text()))
        except FileNotFoundError:
            continue
    return sorted(groups)


class GroupWatch:
    """Samples the app-server process groups in a thread, so a test sees every one that
    ran even when its idle timer ends it before the test looks (a busy machine)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.seen: dict[int, bool] = {}  # group → alive when first listed
        self.most_at_once = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            try:
                groups = app_server_groups(self.data_dir)
            except (OSError, ValueError):  # a pgid file mid-write or just removed
                continue
            self.most_at_once = max(self.most_at_once, len(groups))
            for group in groups:
                if group not in self.seen:
                    self.seen[group] = group_alive(group)

    def __enter__(self) -> GroupWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass
class Agentic:
    gitea: GiteaEmulator
    ff: Running
    model: ScriptedModel
    issue: int
    hook_id: int = 0  # forgeflow's hook on acme/widget

    def mention(
        self, text: str = "@ccweb-bot please fix the flaky test", index: int | None = None
    ) -> str:
        comment = self.gitea.post_comment(
            "acme", "widget", index or self.issue, author="alice", body=text
        )
        d = self.gitea.delivery_of_comment(comment["id"])
        assert d.status_code == 202, d.response
        task_id: str = json.loads(d.response)["taskId"]
        return task_id

    def detail(self, task_id: str) -> dict[str, Any]:
        with self.ff.admin() as admin:
            body: dict[str, Any] = admin.get(f"/api/gitea-workflow/tasks/{task_id}").json()
            return body

    def finished(self, task_id: str, timeout: float = 90) -> dict[str, Any]:
        detail: dict[str, Any] = wait_for(
            lambda: (d := self.detail(task_id))["terminal"] and d,
            timeout=timeout,
            what=f"task {task_id} ends",
        )
        return detail

    def bot_comments(self, index: int | None = None) -> list[dict[str, Any]]:
        return [
            c
            for c in self.gitea.comments("acme", "widget", index or self.issue)
            if c["user"]["login"] == BOT
        ]


def start_agentic(
    gitea: GiteaEmulator,
    model: ScriptedModel,
    tmp_path: Path,
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    **settings: Any,
) -> Iterator[Agentic]:
    assert CODEX.exists() and GITEA_MCP.exists()
    home = write_codex_home(tmp_path / "codex-home", model.url)
    for key, value in home.env().items():
        monkeypatch.setenv(key, value)
    bot = gitea.add_user(BOT)
    gitea.add_user("alice")
    gitea.add_repo("acme", "widget")
    gitea.set_permission("acme", "widget", "alice", "write")
    gitea.set_permission("acme", "widget", BOT, "admin")
    issue = gitea.add_issue("acme", "widget", title="Flaky test", author="alice")
    with serve_agentic(gitea, model, issue, tmp_path, db_url, bot, **settings) as agentic:
        yield agentic


@contextmanager
def serve_agentic(
    gitea: GiteaEmulator,
    model: ScriptedModel,
    issue: int,
    tmp_path: Path,
    db_url: str,
    bot_token: str,
    **settings: Any,
) -> Iterator[Agentic]:
    """The forgeflow of :func:`start_agentic` on its world; entered again with the same
    ``tmp_path`` and ``db_url`` it is that forgeflow restarted (the same data folder and
    database, a new process's objects)."""
    values: dict[str, Any] = {
        "gitea_url": gitea.url,
        "gitea_token": bot_token,
        "agent_runtime": "codex",
        "codex_command": f"{CODEX} app-server",
        "model": "scripted-model",
        "retry_base_seconds": 0.2,
        "poll_seconds": 0.5,
        **settings,
    }
    with run_forgeflow(tmp_path / "ff", db_url, role=Role.ALL, **values) as ff:
        hook_id = gitea.add_hook("acme", "widget", url=ff.webhook_url, secret=WEBHOOK_SECRET)
        yield Agentic(gitea, ff, model, issue, hook_id)
