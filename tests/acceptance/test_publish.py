"""Publishing a session's work, with the real `codex app-server` in real turns.

After a turn in which the agent committed, forgeflow pushes its session branch to
Gitea (fast-forward only, never the default branch); a refused push fails no task and
the next turn is told. The agent can also push itself (the `push_branch` tool) and open
a pull request (`create_pull`): the built-in `ticket_to_pr` template does both, end to end.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import httpx

from forgeflow_testkit.agents import TurnAsk, answering_agent, read_turn
from forgeflow_testkit.model_server import RecordedRequest, last_input_is_tool_output
from forgeflow_testkit.model_steps import (
    Reply,
    ShellCall,
    Step,
    ToolCall,
    gitea_comment,
    message,
    new_id,
)
from tests.support.agentic import Agentic
from tests.support.cluster import wait_for
from tests.support.turns import Turn, printed, section, shell_turn, tool_output, wrapped
from tests.support.world import BOT

BRANCH = "ccweb/issue-{n}"
NAMESPACE = "mcp__gitea"


def turn(
    agentic: Agentic, command: str | Callable[[], str], text: str = "@ccweb-bot please fix it"
) -> Turn:
    return shell_turn(agentic, command, text)


def audited(detail: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [e["metadata"] for e in detail["audit"] if e["action"] == action]


def publish_rows(detail: dict[str, Any]) -> list[str]:
    return [e["action"] for e in detail["audit"] if str(e["action"]).startswith("publish.")]


def commit(path: str, text: str, subject: str) -> str:
    return (
        f"echo {text} > {path} && git add {path} && git commit -qm '{subject}' && "
        "echo '== sha' && git rev-parse HEAD"
    )


def test_a_committing_turn_is_pushed_to_the_session_branch(agentic: Agentic) -> None:
    gitea, branch = agentic.gitea, BRANCH.format(n=agentic.issue)
    main = gitea.branch_sha("acme", "widget", "main")
    assert gitea.branch_sha("acme", "widget", branch) is None

    first = turn(agentic, commit("fix.txt", "one", "First fix"))
    sha = section(first.output, "sha").strip()
    assert re.fullmatch(r"[0-9a-f]{40}", sha), first.output
    assert gitea.branch_sha("acme", "widget", branch) == sha
    pushed = audited(first.detail, "publish.pushed")
    assert pushed == [{"branch": branch, "from": None, "to": sha, "recovered": False}], pushed
    assert publish_rows(first.detail) == ["publish.pushed"]
    assert gitea.branch_sha("acme", "widget", "main") == main

    # The next turn commits on top: a fast-forward from the first commit.
    second = turn(agentic, commit("fix.txt", "two", "Second fix"), "@ccweb-bot once more")
    again = section(second.output, "sha").strip()
    assert again != sha and gitea.branch_sha("acme", "widget", branch) == again
    pushed = audited(second.detail, "publish.pushed")
    assert pushed == [{"branch": branch, "from": sha, "to": again, "recovered": False}], pushed
    assert publish_rows(second.detail) == ["publish.pushed"]
    assert gitea.branch_sha("acme", "widget", "main") == main


def test_nothing_is_pushed_when_nothing_was_committed(agentic: Agentic) -> None:
    branch = BRANCH.format(n=agentic.issue)
    answering_agent(agentic.model)
    task_id = agentic.mention()
    detail = agentic.finished(task_id)
    assert detail["task"]["state"] == "succeeded", detail["task"]
    assert agentic.gitea.branch_sha("acme", "widget", branch) is None
    assert publish_rows(detail) == [], detail["audit"]
    asks = [a for r in agentic.model.requests if (a := read_turn(r)) is not None]
    assert len(asks) == 1
    prompt = asks[0].prompt
    assert f"Your work: commit on branch {branch}." in prompt, prompt
    assert f"forgeflow pushes it to the branch {branch} on Gitea" in prompt, prompt
    assert "`push_branch`" in prompt, prompt
    assert "was refused" not in prompt


def test_a_refused_push_fails_no_task_and_the_diverged_branch_blocks_the_next(
    agentic: Agentic,
) -> None:
    gitea, branch = agentic.gitea, BRANCH.format(n=agentic.issue)
    theirs: list[str] = []

    def someone_pushes_first() -> str:
        # Someone else pushes to the session's branch while the turn runs: the agent's
        # commit (on the default branch's head) does not contain theirs.
        theirs.append(gitea.push_branch("acme", "widget", branch, {"other.txt": "x\n"},
                                        message="Theirs"))  # fmt: skip
        return commit("fix.txt", "mine", "My fix")

    first = turn(agentic, someone_pushes_first)
    mine = section(first.output, "sha").strip()
    assert re.fullmatch(r"[0-9a-f]{40}", mine) and mine != theirs[0]
    refused = audited(first.detail, "publish.refused")
    assert len(refused) == 1 and refused[0]["branch"] == branch, first.detail["audit"]
    assert refused[0]["code"] == "push_not_fast_forward", refused
    assert refused[0]["error"].startswith("push_not_fast_forward: "), refused
    assert publish_rows(first.detail) == ["publish.refused"]
    assert gitea.branch_sha("acme", "widget", branch) == theirs[0]
    assert "was refused" not in first.prompt

    # The session's branch and Gitea's have diverged: the next task is blocked for an
    # operator, both heads named, and nothing is reset or forced (#27). (A refusal that
    # leaves Gitea's branch where it was, a protected branch, is told to the next turn.)
    second = agentic.mention("@ccweb-bot did it land?")
    detail: dict[str, Any] = wait_for(
        lambda: (d := agentic.detail(second))["task"]["state"] == "blocked_workspace" and d,
        timeout=90,
        what="the next task is blocked",
    )
    block = audited(detail, "task.block")
    assert [(b["reason"], b["localHead"], b["publishedHead"]) for b in block] == [
        ("diverged", mine, theirs[0])
    ]
    assert gitea.branch_sha("acme", "widget", branch) == theirs[0]  # still never forced


def pipeline_run(admin: httpx.Client, run_id: str) -> dict[str, Any]:
    body: dict[str, Any] = admin.get(f"/api/pipelines/runs/{run_id}").json()["run"]
    return body


def runs(admin: httpx.Client, template: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = admin.get(
        "/api/pipelines/runs", params={"templateKey": template}
    ).json()["items"]
    return items


def open_pulls(agentic: Agentic) -> list[dict[str, Any]]:
    token = agentic.ff.settings.gitea_token
    assert token is not None
    r = httpx.get(
        f"{agentic.gitea.url}/api/v1/repos/acme/widget/pulls",
        params={"state": "open"},
        headers={"Authorization": f"token {token.get_secret_value()}"},
    )
    r.raise_for_status()
    pulls: list[dict[str, Any]] = r.json()
    return pulls


def test_ticket_to_pr_end_to_end(agentic: Agentic) -> None:
    gitea, model, n = agentic.gitea, agentic.model, agentic.issue
    branch = BRANCH.format(n=n)
    main = gitea.branch_sha("acme", "widget", "main")
    shell_id, push_id, pr_id, comment_id = (new_id("call") for _ in range(4))
    asks: list[TurnAsk] = []

    def shell(request: RecordedRequest) -> Step:
        ask = read_turn(request)
        assert ask is not None
        asks.append(ask)
        return Reply.of(
            ShellCall(wrapped(commit("feature.txt", "done", "Implement it")), None, shell_id)
        )

    def push(_request: RecordedRequest) -> Step:
        return ToolCall("push_branch", {}, NAMESPACE, push_id)

    def open_pr(_request: RecordedRequest) -> Step:
        arguments = {"title": "Fix the flaky test", "body": f"Closes #{n}"}
        return ToolCall("create_pull", arguments, NAMESPACE, pr_id)

    def answer(request: RecordedRequest) -> Step:
        (output,) = [o for o in request.function_call_outputs() if o.get("call_id") == pr_id]
        found = re.search(r"https?://[^\s\"'\\]+/pulls/\d+", str(output["output"]))
        assert found is not None, output
        ask = asks[0]
        body = f"Opened {found.group(0)}: adds feature.txt.\n\n{ask.marker}"
        return gitea_comment(ask.owner, ask.repo, ask.number, body, call_id=comment_id)

    model.respond(
        last_input_is_tool_output(comment_id),
        lambda _r: message("Opened the pull request."),
        times=1,
        first=True,
    )
    model.respond(last_input_is_tool_output(pr_id), answer, times=1, first=True)
    model.respond(last_input_is_tool_output(push_id), open_pr, times=1, first=True)
    model.respond(last_input_is_tool_output(shell_id), push, times=1, first=True)
    model.respond(lambda r: read_turn(r) is not None, shell, times=1, first=True)

    with agentic.ff.admin() as admin:
        r = admin.post("/api/pipelines/templates/ticket_to_pr/enable", json={"requestId": "on1"})
        assert r.status_code == 200, r.text
        gitea.edit_issue("acme", "widget", n, by="alice", assignees=[BOT])
        (item,) = wait_for(lambda: runs(admin, "ticket_to_pr"), what="a ticket_to_pr run")
        run_id = item["runId"]
        run = wait_for(
            lambda: (x := pipeline_run(admin, run_id))["status"] != "running" and x,
            timeout=120,
            what="the ticket_to_pr run ends",
        )
        assert run["status"] == "succeeded", json.dumps(run, indent=1)
        task_id = run["state"]["implementation"]["taskId"]
        detail = agentic.detail(task_id)

    sha = section(printed(agentic, shell_id), "sha").strip()
    assert re.fullmatch(r"[0-9a-f]{40}", sha)
    pushed_text = tool_output(agentic, push_id)
    assert f"pushed: the branch {branch} on Gitea is now at {sha}" in pushed_text, pushed_text
    assert gitea.branch_sha("acme", "widget", branch) == sha
    assert gitea.branch_sha("acme", "widget", "main") == main
    # Pushed once, by the tool: at the end of the turn the branch was already there.
    assert audited(detail, "publish.pushed") == [
        {"branch": branch, "from": None, "to": sha, "recovered": False}
    ], detail["audit"]
    assert publish_rows(detail) == ["publish.pushed"]

    (pull,) = open_pulls(agentic)
    assert (pull["head"]["ref"], pull["base"]["ref"]) == (branch, "main"), pull
    assert f"#{n}" in pull["body"] and pull["head"]["sha"] == sha, pull
    finals = [c["body"] for c in agentic.bot_comments() if "kind=final" in c["body"]]
    assert len(finals) == 1 and pull["html_url"] in finals[0], finals
