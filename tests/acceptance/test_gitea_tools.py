"""forgeflow's own Gitea tools, each called from inside a real turn: the real codex
binary (jailed) calls them through the broker's ``/mcp`` as the scripted model says,
against the Gitea emulator; what each call returned is what codex sent the model back.
Crafted arguments that name another repository or climb out of this one are refused
with a tool error and audited as ``mcp.refused``. The agent's comments are recorded, so
a comment it posted before a forgeflow restart is still its own to edit after it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from forgeflow_testkit.agents import TurnAsk, read_turn
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from forgeflow_testkit.model_server import (
    RecordedRequest,
    ScriptedModel,
    last_input_is_tool_output,
)
from forgeflow_testkit.model_steps import Step, gitea_tool, message, new_id
from tests.support.agentic import Agentic, serve_agentic, start_agentic
from tests.support.world import BOT

Call = Callable[[TurnAsk, dict[str, str]], tuple[str, dict[str, Any]]]


def tool_turn(
    agentic: Agentic, calls: list[tuple[str, Call]]
) -> tuple[dict[str, Any], dict[str, str]]:
    """One mention whose turn makes ``calls`` in order (each built from the turn and
    the outputs so far, by label), then answers with add_comment. Returns the task's
    detail and each call's output by label."""
    ids = {label: new_id("call") for label, _ in calls}
    answer_id = new_id("call")
    asks: list[TurnAsk] = []
    outputs: dict[str, str] = {}

    def step(n: int) -> Callable[[RecordedRequest], Step]:
        def make(request: RecordedRequest) -> Step:
            if n == 0:
                ask = read_turn(request)
                assert ask is not None
                asks.append(ask)
            else:
                prev = calls[n - 1][0]
                outputs[prev] = _text(agentic, ids[prev])
            if n == len(calls):
                body = {"body": f"Done.\n\n{asks[0].marker}"}
                return gitea_tool("add_comment", body, call_id=answer_id)
            label, build = calls[n]
            name, args = build(asks[0], outputs)
            return gitea_tool(name, args, call_id=ids[label])

        return make

    model = agentic.model
    model.respond(
        last_input_is_tool_output(answer_id), lambda _r: message("ok"), times=1, first=True
    )
    for n in range(len(calls), 0, -1):
        model.respond(last_input_is_tool_output(ids[calls[n - 1][0]]), step(n), times=1, first=True)
    model.respond(lambda r: read_turn(r) is not None, step(0), times=1, first=True)
    detail = agentic.finished(agentic.mention("@ccweb-bot please triage this"))
    assert detail["task"]["state"] == "succeeded", detail["task"]
    return detail, outputs


def _text(agentic: Agentic, call_id: str) -> str:
    """The tool's answer as codex sent it back: content parts after its "Wall time" one."""
    found = [
        o["output"]
        for r in agentic.model.requests
        for o in r.function_call_outputs()
        if o.get("call_id") == call_id
    ]
    assert found, f"the output of {call_id} never reached the model"
    output = found[0]
    if isinstance(output, str):
        return output
    texts = [str(p.get("text") or "") for p in output if isinstance(p, dict)]
    return "".join(t for t in texts if not t.startswith("Wall time:"))


def _fixed(name: str, args: dict[str, Any]) -> Call:
    return lambda _ask, _out: (name, args)


def test_every_tool_works_from_a_real_turn(agentic: Agentic) -> None:
    gitea, n = agentic.gitea, agentic.issue
    gitea.add_label("acme", "widget", "bug")
    other = gitea.add_issue("acme", "widget", title="Crash on start", body="boom", author="alice")
    # The session's branch on Gitea, with one commit (as a push_branch would leave it).
    sha = gitea.push_branch("acme", "widget", f"ccweb/issue-{n}", {"fix.txt": "fixed\n"})
    token = agentic.ff.settings.gitea_token
    assert token is not None
    posted = httpx.post(
        f"{gitea.url}/api/v1/repos/acme/widget/statuses/{sha}",
        headers={"Authorization": f"token {token.get_secret_value()}"},
        json={"state": "success", "context": "ci/test", "description": "all green"},
    )
    assert posted.status_code == 201, posted.text

    def pr_number(out: dict[str, str]) -> int:
        return int(json.loads(out["create_pull"])["number"])

    calls: list[tuple[str, Call]] = [
        ("get_issue", _fixed("get_issue", {})),
        ("get_other", _fixed("get_issue", {"number": other})),
        ("list_comments", _fixed("list_comments", {"limit": 5})),
        ("search", _fixed("search_issues", {"query": "crash", "state": "all"})),
        ("read_file", _fixed("read_file", {"path": "fix.txt", "ref": f"ccweb/issue-{n}"})),
        ("progress", _fixed("add_comment", {"body": "Looking into it."})),
        (
            "edit",
            lambda _a, out: (
                "edit_comment",
                {"comment_id": json.loads(out["progress"])["id"], "body": "Looked into it."},
            ),
        ),
        ("edit_other", _fixed("edit_comment", {"comment_id": 1, "body": "hijack"})),
        ("add_labels", _fixed("add_labels", {"labels": ["bug"]})),
        ("no_label", _fixed("add_labels", {"labels": ["wontfix"]})),
        ("remove_labels", _fixed("remove_labels", {"labels": ["bug"]})),
        ("push", _fixed("push_branch", {})),
        ("create_pull", _fixed("create_pull", {"title": "Fix the flaky test", "body": "b"})),
        ("update_pull", _fixed("update_pull", {"title": "Fix the flaky test (v2)"})),
        ("files", lambda _a, out: ("list_pull_files", {"number": pr_number(out)})),
        ("diff", lambda _a, out: ("get_pull_diff", {"number": pr_number(out)})),
        ("status", _fixed("get_commit_status", {})),
    ]
    detail, out = tool_turn(agentic, calls)

    issue = json.loads(out["get_issue"])
    assert (issue["number"], issue["title"], issue["author"]) == (n, "Flaky test", "alice")
    assert json.loads(out["get_other"])["body"] == "boom"
    assert "@ccweb-bot please triage this" in out["list_comments"]
    assert [r["number"] for r in json.loads(out["search"])["results"]] == [other]
    assert out["read_file"] == "fixed\n"
    progress = json.loads(out["progress"])["id"]
    assert any(
        c["id"] == progress and c["body"] == "Looked into it."
        for c in gitea.comments("acme", "widget", n)
    )
    assert out["edit_other"].startswith("refused: comment 1 was not posted by you")
    assert "bug" in json.loads(out["add_labels"])["labels"]
    assert "no label 'wontfix'" in out["no_label"] and "bug" in out["no_label"]
    assert gitea.issue("acme", "widget", n)["labels"] == []
    pull = gitea.pull("acme", "widget", pr_number(out))
    assert (pull["head"]["ref"], pull["base"]["ref"]) == (f"ccweb/issue-{n}", "main")
    assert pull["title"] == "Fix the flaky test (v2)"
    assert [f["filename"] for f in json.loads(out["files"])["files"]] == ["fix.txt"]
    assert "+fixed" in out["diff"]
    status = json.loads(out["status"])
    assert (status["state"], status["statuses"][0]["context"]) == ("success", "ci/test")
    # Every call is in the transcript's audit (codex's mcpToolCall items), refusals too.
    tools = [e["metadata"]["tool"] for e in detail["audit"] if e["action"] == "mcp.call"]
    assert tools.count("gitea.add_comment") == 2 and "gitea.get_commit_status" in tools
    refused = [e["metadata"] for e in detail["audit"] if e["action"] == "mcp.refused"]
    assert [r["tool"] for r in refused] == ["edit_comment", "add_labels"]


def test_crafted_arguments_cannot_leave_the_repository(agentic: Agentic) -> None:
    gitea = agentic.gitea
    gitea.add_repo("acme", "other", files={"secret.txt": "top secret\n"})
    gitea.set_permission("acme", "other", BOT, "admin")
    crafted: list[tuple[str, dict[str, Any]]] = [
        ("read_file", {"path": "../../other/raw/secret.txt"}),
        ("read_file", {"path": "..%2F..%2Fother%2Fraw%2Fsecret.txt"}),
        ("read_file", {"path": "http://127.0.0.1/api/v1/repos/acme/other/raw/secret.txt"}),
        ("read_file", {"path": "/api/v1/repos/acme/other/raw/secret.txt"}),
        ("read_file", {"path": "..\\..\\other\\secret.txt"}),
        ("read_file", {"path": "secret.txt", "ref": "main/../../../other"}),
        ("read_file", {"path": "secret.txt", "ref": "main..HEAD"}),
        ("get_issue", {"owner": "acme", "repo": "other"}),
        ("add_comment", {"body": "leak", "repo": "acme/other"}),
    ]
    calls = [(f"c{i}", _fixed(name, args)) for i, (name, args) in enumerate(crafted)]
    detail, out = tool_turn(agentic, calls)
    for i, (name, args) in enumerate(crafted):
        assert out[f"c{i}"].startswith("refused: invalid arguments"), (name, args, out[f"c{i}"])
        assert "top secret" not in out[f"c{i}"]
    refused = [e["metadata"] for e in detail["audit"] if e["action"] == "mcp.refused"]
    assert len(refused) == len(crafted)
    # Nothing reached the other repository through the bot.
    assert not [p for _m, p, _s in gitea.requests if "/acme/other" in p]


def test_a_comment_posted_before_a_restart_can_be_edited_after_it(
    gitea: GiteaEmulator,
    model: ScriptedModel,
    tmp_path: Path,
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    running = start_agentic(gitea, model, tmp_path, sqlite_url, monkeypatch)
    first = next(running)
    progress_call = _fixed("add_comment", {"body": "Looking into it."})
    _detail, out = tool_turn(first, [("progress", progress_call)])
    progress = json.loads(out["progress"])["id"]
    (receipt,) = [c["id"] for c in first.bot_comments() if "kind=receipt" in c["body"]]
    token = first.ff.settings.gitea_token
    assert token is not None
    running.close()  # forgeflow stops: every object of that process is gone
    # Its webhook went with it; the restarted forgeflow adds its own.
    api = httpx.Client(
        base_url=f"{gitea.url}/api/v1/repos/acme/widget",
        headers={"Authorization": f"token {token.get_secret_value()}"},
    )
    for hook in api.get("/hooks").json():
        assert api.delete(f"/hooks/{hook['id']}").status_code == 204
    with serve_agentic(
        gitea, model, first.issue, tmp_path, sqlite_url, token.get_secret_value()
    ) as second:
        calls: list[tuple[str, Call]] = [
            ("edit", _fixed("edit_comment", {"comment_id": progress, "body": "Looked into it."})),
            ("edit_receipt", _fixed("edit_comment", {"comment_id": receipt, "body": "hijack"})),
        ]
        detail, out = tool_turn(second, calls)
    assert json.loads(out["edit"]) == {"id": progress, "edited": True}
    assert out["edit_receipt"].startswith(f"refused: comment {receipt} was not posted by you")
    bodies = {c["id"]: c["body"] for c in gitea.comments("acme", "widget", first.issue)}
    assert bodies[progress] == "Looked into it." and "hijack" not in bodies[receipt]
    # The edit is the second task's record: its intent and its result.
    edits = [c for c in detail["comments"] if c["kind"] == "tool_edit"]
    assert [(c["commentId"], c["status"]) for c in edits] == [(progress, "sent")]
