"""The README's first command on a fresh clone, as a new user meets it (issue 22).

A ``git clone`` of this repository (its committed tree), ``./scripts/serve.sh`` with
only the settings docs/operations.md "First run, step by step" names (the Gitea URL and
the bot's token, here the emulator's; the webhook secret; the model's base URL and key,
here the scripted Responses-API model's; the public URL and the port), then
``forgeflow gitea connect acme/widget``, one mention, and a verified answer from the real
``codex app-server`` in its jail. The clone's set-up does its own installing (a virtual
environment, forgeflow, the pinned Codex CLI); only the package caches of this machine
make it quicker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from forgeflow_testkit.agents import answering_agent
from forgeflow_testkit.codex_home import API_KEY
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from forgeflow_testkit.model_server import ScriptedModel
from tests.support.cluster import wait_for
from tests.support.process import clean_env, free_port
from tests.support.world import BOT

ROOT = Path(__file__).resolve().parents[2]
SECRET = "first-run-webhook-secret-0123456789"


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    where = tmp_path / "forgeflow"
    subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(where)],
        check=True,
        timeout=120,
    )
    assert not (where / ".venv").exists() and not (where / "tools/node/node_modules").exists()
    return where


@pytest.fixture
def served(
    clone: Path, gitea: GiteaEmulator, model: ScriptedModel, tmp_path: Path
) -> Iterator[tuple[dict[str, str], str, Path]]:
    token = gitea.add_user(BOT)
    gitea.add_user("alice")
    gitea.add_repo("acme", "widget")
    gitea.set_permission("acme", "widget", "alice", "write")
    gitea.set_permission("acme", "widget", BOT, "admin")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    home = tmp_path / "codex-home"  # a user without a Codex configuration of their own
    home.mkdir()
    env = clean_env(
        FORGEFLOW_GITEA_URL=gitea.url,
        FORGEFLOW_GITEA_TOKEN=token,
        FORGEFLOW_WEBHOOK_SECRET=SECRET,
        FORGEFLOW_MODEL_BASE_URL=model.url,
        FORGEFLOW_MODEL_API_KEY=API_KEY,
        # The scripted model offers codex no model catalogue: named, codex treats it as a
        # plain Responses-API model and lists the Gitea tools as functions. (Codex's
        # default, gpt-6.2-sol, gets its MCP tools in a shape the scripted model does not
        # read: it saw no tools at all.) A user names their provider's model the same way.
        FORGEFLOW_MODEL="scripted-model",
        FORGEFLOW_PUBLIC_URL=base,
        FORGEFLOW_PORT=str(port),
        CODEX_HOME=str(home),
        PYTHON=sys.executable,
    )
    # Nothing of this checkout on PATH: the clone must find what its own set-up installed.
    env["PATH"] = os.pathsep.join(
        p for p in env["PATH"].split(os.pathsep) if not p.startswith(str(ROOT))
    )
    log = tmp_path / "serve.log"
    started = time.monotonic()
    with log.open("wb") as err:
        proc = subprocess.Popen(
            ["./scripts/serve.sh"],
            cwd=clone,
            env=env,
            stdout=err,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # serve.sh and everything it starts, ended together
        )
    try:
        wait_for(lambda: _healthy(base, proc), timeout=600, what="serve.sh serving")
        print(f"first run: serving after {time.monotonic() - started:.1f} s")
        yield env, base, log
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _healthy(base: str, proc: subprocess.Popen[bytes]) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"serve.sh exited with {proc.returncode}")
    try:
        return httpx.get(base + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_readme_first_command_answers_the_first_mention(
    served: tuple[dict[str, str], str, Path],
    clone: Path,
    gitea: GiteaEmulator,
    model: ScriptedModel,
) -> None:
    env, base, log = served
    forgeflow = str(clone / ".venv/bin/forgeflow")
    text = log.read_text()
    # serve says where the admin pages are; with every setting given, nothing it cannot do.
    assert f"forgeflow: admin pages at {base}/ui/" in text, text
    assert "is not set" not in text and "not installed" not in text, text
    token = (clone / ".forgeflow/admin_token").read_text().strip()
    # doctor, run as the README has it from another folder, is green.
    doctor = subprocess.run(
        [forgeflow, "doctor"], cwd="/", env=env, capture_output=True, text=True, timeout=180
    )
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    connect = subprocess.run(
        [forgeflow, "gitea", "connect", "acme/widget"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert connect.returncode == 0 and connect.stdout.startswith("create a webhook"), connect
    answering_agent(model, answer="forgeflow ran on its first try.")
    issue = gitea.add_issue("acme", "widget", title="Hello", author="alice")
    posted = gitea.post_comment(
        "acme", "widget", issue, author="alice", body="@ccweb-bot say hello"
    )
    delivery = gitea.delivery_of_comment(posted["id"])
    assert delivery.status_code == 202, delivery.response
    task_id = json.loads(delivery.response)["taskId"]
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}) as admin:
        detail = wait_for(
            lambda: (
                (d := admin.get(f"/api/gitea-workflow/tasks/{task_id}").json())["terminal"] and d
            ),
            timeout=180,
            what="the first mention answered",
        )
        why = [(e["action"], e["errorCode"]) for e in detail["audit"] if e["errorCode"]]
        assert detail["task"]["state"] == "succeeded", (detail["errors"], why)
        assert any(e["action"] == "reply.found" for e in detail["audit"]), detail["audit"]
    comments = gitea.comments("acme", "widget", issue)
    bodies = [c["body"] for c in comments if c["user"]["login"] == BOT]
    assert [b.rsplit("kind=", 1)[1] for b in bodies] == ["receipt -->", "final -->"]
    assert bodies[1].startswith("forgeflow ran on its first try.")
    # forgeflow's own Gitea tools answered: no external MCP server was set or needed.
    assert "FORGEFLOW_GITEA_MCP_COMMAND" not in env
    assert "mcp_command_missing" not in log.read_text()
