"""A session outlives its worker through its published branch (#27): real
``forgeflow serve`` processes on PostgreSQL (an ingress and workers), the real
``codex app-server`` driven by the scripted model, the Gitea emulator, SIGKILL.

- the worker that took a repository over continues the session's branch: the next push
  is a fast-forward holding both commits, and the answer says what was lost (the dead
  worker, the last pushed commit);
- a workspace folder lost on one host is rebuilt from the branch;
- a branch that diverged on Gitea blocks (``blocked_workspace``, both heads named) and
  nothing is reset;
- throughout, one receipt and at most one answer per task.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from forgeflow_testkit.agents import TurnAsk, read_turn
from forgeflow_testkit.codex_home import write_codex_home
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from forgeflow_testkit.model_server import (
    RecordedRequest,
    ScriptedModel,
    last_input_is_tool_output,
)
from forgeflow_testkit.model_steps import Reply, ShellCall, Step, gitea_comment, message, new_id
from tests.support.agentic import CODEX
from tests.support.cluster import Cluster, hook, make_cluster, wait_for
from tests.support.dbwatch import DbWatch

BRANCH = "ccweb/issue-{n}"
TERMINAL = {"succeeded", "succeeded_with_rest_fallback", "failed", "failed_reply", "cancelled"}
LOST = "forgeflow: this session last ran on worker"


@pytest.fixture
def codex_env(tmp_path: Path, model: ScriptedModel) -> dict[str, str]:
    """What a ``serve`` process needs to run the real app-server against the model."""
    home = write_codex_home(tmp_path / "codex-home", model.url)
    return {
        **home.env(),
        "FORGEFLOW_AGENT_RUNTIME": "codex",
        "FORGEFLOW_CODEX_COMMAND": f"{CODEX} app-server",
        "FORGEFLOW_MODEL": "scripted-model",
        "FORGEFLOW_LEASE_TTL_SECONDS": "2",
    }


@pytest.fixture
def clusters(gitea: GiteaEmulator, tmp_path: Path, pg_url: str) -> Iterator[list[Cluster]]:
    """An ingress (first) and two workers, none started yet."""
    ingress = make_cluster(gitea, tmp_path / "ingress", pg_url)
    workers = [Cluster(gitea, tmp_path / f"w{i}", pg_url, ingress.bot_token) for i in (1, 2)]
    every = [ingress, *workers]
    for c in every:
        c.workdir.mkdir()
    try:
        yield every
    finally:
        for c in reversed(every):
            c.stop()


def commit(text: str) -> str:
    return f"echo {text} > fix.txt && git add fix.txt && git commit -qm '{text}'"


def turn(ingress: Cluster, model: ScriptedModel, issue: int, command: Callable[[], str],
         text: str) -> str:  # fmt: skip
    """Mention the bot; its turn runs ``command()`` (called when the turn first asks the
    model: its worktree is ready, the test may act), then answers on Gitea."""
    shell_id, comment_id = new_id("call"), new_id("call")
    asks: list[TurnAsk] = []

    def shell(request: RecordedRequest) -> Step:
        ask = read_turn(request)
        assert ask is not None
        asks.append(ask)
        return Reply.of(ShellCall(command(), call_id=shell_id))

    def reply(_request: RecordedRequest) -> Step:
        ask = asks[0]
        return gitea_comment(ask.owner, ask.repo, ask.number, f"Done.\n\n{ask.marker}",
                             call_id=comment_id)  # fmt: skip

    # Ahead of any other rule, each once (rules added later match first).
    model.respond(
        last_input_is_tool_output(comment_id), lambda _r: message("Done."), times=1, first=True
    )
    model.respond(last_input_is_tool_output(shell_id), reply, times=1, first=True)
    model.respond(lambda r: read_turn(r) is not None, shell, times=1, first=True)
    return ingress.mention(issue, text)


def finished(ingress: Cluster, task_id: str, timeout: float = 120) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        with ingress.admin() as admin:
            detail: dict[str, Any] = admin.get(f"/api/gitea-workflow/tasks/{task_id}").json()
        state = detail["task"]["state"]
        return detail if state in TERMINAL or state == "blocked_workspace" else None

    result: dict[str, Any] = wait_for(done, timeout=timeout, what=f"task {task_id} settles")
    return result


def audited(detail: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [e for e in detail["audit"] if e["action"] == action]


def kinds(cluster: Cluster, issue: int) -> list[str]:
    return sorted(c["body"].rsplit("kind=", 1)[1] for c in cluster.bot_comments(issue))


def answer(cluster: Cluster, issue: int, task_id: str) -> str:
    bodies = [
        c["body"]
        for c in cluster.bot_comments(issue)
        if "kind=final" in c["body"] and task_id in c["body"]
    ]
    assert len(bodies) == 1, bodies
    return bodies[0]


def worktree(cluster: Cluster, issue: int) -> Path:
    return (
        cluster.workdir
        / "data"
        / "workspaces"
        / ".sessions"
        / "default"
        / "acme"
        / (f"widget/issue-{issue}")
    )


def host_git(path: Path, *args: str) -> str:
    """git read on the host by the test (forgeflow itself never does this)."""
    out = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def once_each(cluster: Cluster, issue: int, tasks: list[str]) -> None:
    """One receipt and at most one answer per task, on the issue."""
    bodies = [c["body"] for c in cluster.bot_comments(issue)]
    for task_id in tasks:
        mine = [b for b in bodies if task_id in b]
        assert sum("kind=receipt" in b for b in mine) == 1, mine
        assert sum("kind=final" in b for b in mine) <= 1, mine


def test_the_worker_that_takes_over_continues_the_published_branch(
    clusters: list[Cluster], codex_env: dict[str, str], model: ScriptedModel, pg_url: str
) -> None:
    ingress, one, two = clusters
    gitea = ingress.gitea
    ingress.start("--role", "ingress")
    one.start("--role", "worker", FORGEFLOW_WORKER_ID="worker-1", **codex_env)
    hook(ingress)
    issue = gitea.add_issue("acme", "widget", title="Flaky test", author="alice")
    branch = BRANCH.format(n=issue)
    with DbWatch(pg_url) as watch:
        first = turn(ingress, model, issue, lambda: commit("one"), "@ccweb-bot fix it")
        assert finished(ingress, first)["task"]["state"] == "succeeded"
        c1 = gitea.branch_sha("acme", "widget", branch)
        assert c1 is not None
        two.start("--role", "worker", FORGEFLOW_WORKER_ID="worker-2", **codex_env)
        one.kill9()  # its worktree, and whatever was not pushed from it, is gone
        second = turn(ingress, model, issue, lambda: commit("two"), "@ccweb-bot once more")
        detail = finished(ingress, second)
    assert detail["task"]["state"] == "succeeded", detail["task"]
    assert watch.violations == []
    claims = [e["metadata"]["owner"] for e in audited(detail, "task.claim")]
    assert claims and all(o.startswith("worker-2/") for o in claims)
    # The new worker's worktree started from the published branch: the push is a
    # fast-forward from the first commit, and Gitea's branch holds both.
    c2 = gitea.branch_sha("acme", "widget", branch)
    pushed = [e["metadata"] for e in audited(detail, "publish.pushed")]
    assert pushed == [{"branch": branch, "from": c1, "to": c2, "recovered": False}]
    assert c2 is not None and gitea.branch_log("acme", "widget", branch)[:2] == [c2, c1]
    assert host_git(worktree(two, issue), "show", "HEAD:fix.txt") == "two"
    # What was lost is said, once, in the answer: the dead worker, the last pushed commit.
    said = [line for line in answer(ingress, issue, second).splitlines() if LOST in line]
    assert len(said) == 1 and "`worker-2`" not in said[0], said
    assert "`worker-1`" in said[0] and f"`{c1[:10]}`" in said[0], said
    assert LOST not in answer(ingress, issue, first)
    once_each(ingress, issue, [first, second])


def test_a_lost_workspace_folder_is_rebuilt_from_the_branch(
    clusters: list[Cluster], codex_env: dict[str, str], model: ScriptedModel
) -> None:
    ingress, one, _ = clusters
    gitea = ingress.gitea
    ingress.start("--role", "ingress")
    one.start("--role", "worker", FORGEFLOW_WORKER_ID="worker-1", **codex_env)
    hook(ingress)
    issue = gitea.add_issue("acme", "widget", title="Flaky test", author="alice")
    branch = BRANCH.format(n=issue)
    first = turn(ingress, model, issue, lambda: commit("one"), "@ccweb-bot fix it")
    assert finished(ingress, first)["task"]["state"] == "succeeded"
    c1 = gitea.branch_sha("acme", "widget", branch)
    one.stop()
    shutil.rmtree(one.workdir / "data" / "workspaces")  # mirror, clone, worktrees
    one.start("--role", "worker", FORGEFLOW_WORKER_ID="worker-1", **codex_env)
    second = turn(ingress, model, issue, lambda: commit("two"), "@ccweb-bot once more")
    detail = finished(ingress, second)
    assert detail["task"]["state"] == "succeeded", detail["task"]
    c2 = gitea.branch_sha("acme", "widget", branch)
    assert c2 is not None and gitea.branch_log("acme", "widget", branch)[:2] == [c2, c1]
    # The same worker: its disk was lost, not taken over; no takeover line.
    assert LOST not in answer(ingress, issue, second)
    once_each(ingress, issue, [first, second])


def test_a_diverged_branch_blocks_naming_both_heads_and_resets_nothing(
    clusters: list[Cluster], codex_env: dict[str, str], model: ScriptedModel
) -> None:
    ingress, one, _ = clusters
    gitea = ingress.gitea
    ingress.start("--role", "ingress")
    one.start("--role", "worker", FORGEFLOW_WORKER_ID="worker-1", **codex_env)
    hook(ingress)
    issue = gitea.add_issue("acme", "widget", title="Flaky test", author="alice")
    branch = BRANCH.format(n=issue)
    first = turn(ingress, model, issue, lambda: commit("one"), "@ccweb-bot fix it")
    assert finished(ingress, first)["task"]["state"] == "succeeded"
    theirs: list[str] = []

    def behind_our_back() -> str:
        # Someone pushes to the session branch while the turn runs: the agent's commit
        # and theirs both sit on the first one.
        theirs.append(gitea.push_branch("acme", "widget", branch, {"other.txt": "theirs\n"}))
        return commit("ours")

    second = turn(ingress, model, issue, behind_our_back, "@ccweb-bot once more")
    detail = finished(ingress, second)
    assert detail["task"]["state"] == "succeeded"
    assert [e["metadata"]["code"] for e in audited(detail, "publish.refused")] == [
        "push_not_fast_forward"
    ]
    path = worktree(one, issue)
    ours = host_git(path, "rev-parse", "HEAD")
    third = turn(ingress, model, issue, lambda: "true", "@ccweb-bot and now?")
    blocked = finished(ingress, third)
    assert blocked["task"]["state"] == "blocked_workspace", blocked["task"]
    [block] = audited(blocked, "task.block")
    meta = block["metadata"]
    assert (meta["reason"], meta["localHead"], meta["publishedHead"]) == (
        "diverged",
        ours,
        theirs[0],
    )
    assert ours in meta["detail"] and theirs[0] in meta["detail"]
    # Nothing reset: the worktree keeps its commit, Gitea keeps theirs.
    assert host_git(path, "rev-parse", "HEAD") == ours
    assert host_git(path, "status", "--porcelain") == ""
    assert gitea.branch_sha("acme", "widget", branch) == theirs[0]
    once_each(ingress, issue, [first, second, third])
    assert not any(third in b and "kind=final" in b for b in (
        c["body"] for c in ingress.bot_comments(issue)))  # fmt: skip
