"""Pipeline spaces in review mode against the real ``codex app-server`` (0.171.0) and
the scripted Responses-API model: the draft turn's thread is read-only and has no
Gitea MCP server, its ``turn/start`` names a read-only sandbox, and nothing reaches
Gitea; the draft is the step's output."""

from __future__ import annotations

from typing import Any

from forgeflow_testkit.agents import answering_agent
from forgeflow_testkit.model_server import RecordedRequest
from tests.support.agentic import Agentic
from tests.support.cluster import wait_for

YAML = {"Content-Type": "application/yaml"}
DRAFT = "comment: the change looks right; no finding."

REVIEW = """
key: codex_review
name: A review-mode draft with the real codex
enabled: true
inputs: [{name: issue, type: integer, required: true}]
nodes:
  - {id: start, kind: trigger}
  - id: space
    kind: listen
    bodyKey: messaging.createSpace
    outputKey: space
    inputs: {repo: acme/widget, number: "{{ inputs.issue }}"}
    extras: {mode: review}
  - id: draft
    kind: listen
    bodyKey: conversation.promptAgent
    outputKey: draft
    inputs: {repo: acme/widget, number: "{{ inputs.issue }}", prompt: "Review it"}
    extras: {pollSeconds: 0.2, spaceId: "{{ space.spaceId }}"}
edges:
  - {from: start, to: space}
  - {from: space, to: draft}
triggers: [{type: manual}]
"""


def _is_draft_turn(request: RecordedRequest) -> bool:
    texts = request.texts("user")
    return bool(texts) and "Your sandbox is read-only" in texts[-1]


def test_a_review_draft_turn_is_read_only_without_the_gitea_tool(agentic: Agentic) -> None:
    worktree = (
        agentic.ff.settings.resolved_workspace_root
        / ".sessions/default/acme/widget"
        / f"issue-{agentic.issue}"
    )
    probe = worktree / "sandbox-probe.txt"
    # The model tries to write a file in the worktree with codex's shell tool, then
    # answers with its draft.
    call_id = agentic.model.reply_with_shell_then_message(f"echo hi > {probe}", final=DRAFT)
    with agentic.ff.admin() as admin:
        assert admin.post("/api/pipelines/templates", content=REVIEW, headers=YAML).is_success
        r = admin.post(
            "/api/pipelines/templates/codex_review/runs",
            json={"requestId": "go", "inputs": {"issue": agentic.issue}},
        )
        run_id = r.json()["run"]["runId"]
        run: dict[str, Any] = wait_for(
            lambda: (
                (x := admin.get(f"/api/pipelines/runs/{run_id}").json()["run"])["status"]
                != "running"
                and x
            ),
            timeout=90,
        )
    assert run["status"] == "succeeded", run
    draft = run["state"]["draft"]
    assert draft["reply"] == DRAFT
    detail = agentic.detail(draft["taskId"])
    assert (detail["task"]["state"], detail["task"]["mode"]) == ("succeeded", "review")

    # The thread: read-only, no MCP server at all (so no bot token in it).
    params = [e["metadata"] for e in detail["audit"] if e["action"] == "session.thread_params"]
    assert params and params[0]["sandbox"] == "read-only" and params[0]["mcpServers"] == {}
    assert params[0]["cwd"] == str(worktree)
    # The turn ran in the repository's read-only jail: turn/start told Codex the
    # sandbox is external, with no open network.
    sandbox = [e["metadata"] for e in detail["audit"] if e["action"] == "turn.sandbox"]
    assert sandbox == [
        {
            "sandboxPolicy": {"type": "externalSandbox", "networkAccess": "restricted"},
            "kind": "normal",
        }
    ]
    # The model was offered no Gitea tool in any request of the turn.
    turn_requests = [r for r in agentic.model.requests if _is_draft_turn(r)]
    assert turn_requests
    for request in agentic.model.requests:
        offered = {t.qualified for t in request.tools}
        assert not [t for t in offered if "gitea" in t.lower() or "comment" in t.lower()], offered
    # The write was refused by the jail, which binds the repository read-only.
    outputs = [
        o["output"]
        for r in agentic.model.requests
        for o in r.function_call_outputs()
        if o.get("call_id") == call_id
    ]
    assert outputs, "the shell call's output never reached the model"
    assert not probe.exists(), outputs
    assert "Read-only file system" in outputs[0], outputs
    # Nothing on Gitea: no receipt, no answer, no failure notice.
    assert agentic.bot_comments() == []

    # A later mention on the same issue runs on the issue's own thread, in full access
    # with the Gitea tool, and answers there.
    answering_agent(agentic.model)
    mention = agentic.finished(agentic.mention())
    assert mention["task"]["state"] == "succeeded" and mention["task"]["mode"] is None
    assert mention["task"]["threadId"] != detail["task"]["threadId"]
    params = [e["metadata"] for e in mention["audit"] if e["action"] == "session.thread_params"]
    assert params[0]["sandbox"] == "danger-full-access" and "gitea" in params[0]["mcpServers"]
    sandbox = [e["metadata"] for e in mention["audit"] if e["action"] == "turn.sandbox"]
    assert sandbox == [
        {"sandboxPolicy": {"type": "externalSandbox", "networkAccess": "enabled"}, "kind": "normal"}
    ]
    kinds = sorted(c["body"].rsplit("kind=", 1)[1] for c in agentic.bot_comments())
    assert kinds == ["final -->", "receipt -->"]
