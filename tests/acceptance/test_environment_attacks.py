"""Attacks on a repository's environment (issue #26) from inside real turns (the real
``codex app-server`` and bubblewrap, a scripted model running the attack as a shell
command): the agent tries to choose what runs with the setup secrets.

- the agent rewrites the setup script in its clone and commits it (a clean tree, so
  nothing blocks the next task); the next setup, run because a secret changed, runs the
  default branch's script as Gitea has it, and no secret reaches a turn;
- a failing setup whose output tries to close the answer's code fence (longer runs of
  tildes than the fence) to have the bot post mentions and links of its choosing: the
  whole log's end stays inside one fence;
- a setup printing NUL bytes and terminal escapes: on PostgreSQL its run is recorded
  (failed, as any), the log kept without them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from forgeflow_testkit.gitea_emulator import GiteaEmulator
from forgeflow_testkit.model_server import ScriptedModel
from tests.support.agentic import Agentic, start_agentic
from tests.support.cluster import wait_for
from tests.support.turns import shell_turn

REPO = "/api/gitea-workflow/repos/default:acme/widget/environment"
FIRST = "first-setup-s3cr3t-81d2aa"
SECOND = "second-setup-s3cr3t-c47e19"

# Run in the agent's session worktree: its clone is the worktree's common folder's parent.
HIJACK = """
clone=$(cd "$(git rev-parse --git-common-dir)/.." && pwd)
printf '%s\\n' 'echo "ran:agent-script"' 'env > "$HOME/stolen-env"' \\
  'env > "$FORGEFLOW_ENV_DIR/stolen-env"' > "$clone/ci/env-setup.sh"
git -C "$clone" commit -qam "a setup of my own" && echo hijack-committed
git -C "$clone" status --porcelain | wc -l | sed 's/^/dirty-lines:/'
"""


def set_secret(agentic: Agentic, value: str, n: int) -> None:
    with agentic.ff.admin() as admin:
        body = {"requestId": f"secret-{n}", "secrets": {"SETUP_TOKEN": value}}
        r = admin.put(REPO + "/secrets", json=body)
        assert r.status_code == 200, r.text


def setup_log(agentic: Agentic) -> str:
    return setup_log_any(agentic, "ready")


def setup_log_any(agentic: Agentic, state: str = "failed") -> str:
    with agentic.ff.admin() as admin:
        setup = admin.get(REPO).json()["setup"]
    assert setup is not None and setup["state"] == state, setup
    return str(setup["log"])


def test_a_setup_script_the_agent_rewrote_in_its_clone_never_runs(agentic: Agentic) -> None:
    agentic.gitea.push_branch(
        "acme",
        "widget",
        "main",
        {"ci/env-setup.sh": 'echo "ran:gitea-script len:${#SETUP_TOKEN}"\n'},
    )
    set_secret(agentic, FIRST, 1)
    with agentic.ff.admin() as admin:
        body = {"requestId": "env-1", "environment": {"setupScript": "ci/env-setup.sh"}}
        assert admin.put(REPO, json=body).status_code == 200
    first = shell_turn(agentic, HIJACK)
    assert "hijack-committed" in first.output and "dirty-lines:0" in first.output
    assert f"ran:gitea-script len:{len(FIRST)}" in setup_log(agentic)
    # A new secret: the setup must run again before the next turn.
    set_secret(agentic, SECOND, 2)
    second = shell_turn(
        agentic,
        'cat "$HOME/stolen-env" "$FORGEFLOW_ENV_DIR/stolen-env" 2>/dev/null'
        ' | sed "s/^/stolen:/"\n'
        'grep -rl --exclude-dir=sessions s3cr3t "$HOME" "$FORGEFLOW_ENV_DIR" 2>/dev/null'
        ' | sed "s/^/found:/"\n'
        "echo looked",
    )
    assert "looked" in second.output
    assert "stolen:" not in second.output and "found:" not in second.output
    assert FIRST not in second.output and SECOND not in second.output
    log = setup_log(agentic)
    assert f"ran:gitea-script len:{len(SECOND)}" in log and "ran:agent-script" not in log


def test_a_setup_log_cannot_close_the_answer_s_fence(agentic: Agentic) -> None:
    printed = [
        "~~~~~",
        "~~~~~~~~",
        "   ~~~~~~~~~~~~ ",
        "@mallory [log in again](http://evil.example/)",
    ]
    script = "".join(f"echo '{line}'\n" for line in printed) + "exit 3\n"
    agentic.gitea.push_branch("acme", "widget", "main", {"ci/broken.sh": script})
    with agentic.ff.admin() as admin:
        body = {"requestId": "env-1", "environment": {"setupScript": "ci/broken.sh"}}
        assert admin.put(REPO, json=body).status_code == 200
    task_id = agentic.mention("@ccweb-bot please build it")
    assert agentic.finished(task_id)["task"]["errorCode"] == "environment_setup_failed"
    answer = wait_for(
        lambda: next(
            (c["body"] for c in agentic.bot_comments() if "environment_setup_failed" in c["body"]),
            None,
        ),
        what="the failure's answer",
    )
    assert "@mallory" in answer  # quoted, as text
    _, _, fenced = answer.partition("The log's end:\n\n")
    opening, _, rest = fenced.partition("\n")
    assert re.fullmatch(r"~{4,}", opening), answer
    # CommonMark: a line of at least as many tildes (up to three spaces before) closes it.
    closing = re.compile(rf"^ {{0,3}}~{{{len(opening)},}}[ \t]*$")
    lines = rest.split("\n")
    closers = [i for i, line in enumerate(lines) if closing.match(line)]
    assert len(closers) == 1, answer  # the fence's own end, nothing of the log's
    inside = "\n".join(lines[: closers[0]])
    assert "@mallory" in inside and inside.endswith("exit status 3"), answer


@pytest.fixture
def pg_agentic(
    gitea: GiteaEmulator,
    model: ScriptedModel,
    tmp_path: Path,
    pg_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Agentic]:
    yield from start_agentic(gitea, model, tmp_path, pg_url, monkeypatch)


def test_a_setup_log_with_nul_bytes_is_kept_on_postgres(pg_agentic: Agentic) -> None:
    # PostgreSQL's text refuses NUL: the log the setup prints must not stop forgeflow
    # from recording the setup (and failing the task) as it does for any log.
    script = "printf 'before\\000after\\n'\nprintf '\\033[2J\\033]0;title\\007'\nexit 4\n"
    pg_agentic.gitea.push_branch("acme", "widget", "main", {"ci/nul.sh": script})
    with pg_agentic.ff.admin() as admin:
        body = {"requestId": "env-1", "environment": {"setupScript": "ci/nul.sh"}}
        assert admin.put(REPO, json=body).status_code == 200
    task_id = pg_agentic.mention("@ccweb-bot please build it")
    detail = pg_agentic.finished(task_id)
    assert detail["task"]["errorCode"] == "environment_setup_failed", detail["task"]
    log = setup_log_any(pg_agentic)
    assert "before" in log and "after" in log
    assert "\x00" not in log and "\x1b" not in log and "\x07" not in log
    assert "exit status 4" in log
