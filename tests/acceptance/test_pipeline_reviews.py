"""The ``pr_review`` pipeline with the real codex binary (jailed, read-only) and the
Gitea emulator: its step makes the review command's task, which submits through
``submit_review`` and forgeflow posts exactly one Gitea review (line comments at their
positions, one outside the diff in the summary, the suggestion as the emulated Gitea
1.22 reads it); the run's state names that review. A template triggered by a reader's
comment is refused like the reader's mention would be: no review."""

from __future__ import annotations

from typing import Any

import httpx

from forgeflow_testkit.gitea_emulator import GiteaEmulator
from forgeflow_testkit.model_server import RecordedRequest, ScriptedModel, last_input_is_tool_output
from forgeflow_testkit.model_steps import Step, gitea_tool, message, new_id
from tests.support.agentic import Agentic
from tests.support.cluster import wait_for
from tests.support.world import BOT

BASE = "".join(f"line {i}\n" for i in range(1, 41))
HEAD = BASE.replace("line 3\n", "line three\n")
COMMENTS = [
    {"path": "app.txt", "side": "new", "line": 3, "body": "A digit?", "suggestion": "line 3"},
    {"path": "app.txt", "side": "new", "line": 20, "body": "Far from the hunk."},
]
YAML = {"Content-Type": "application/yaml"}
ON_A_READERS_COMMENT = """
key: review_on_comment
name: Review when mallory comments
enabled: true
nodes:
  - {id: t, kind: trigger, bodyKey: pipeline.trigger}
  - id: review
    kind: listen
    bodyKey: conversation.reviewPullRequest
    inputs: {resource: "{{ event.resourceKey }}", focus: "{{ event.body }}"}
    outputKey: review
  - {id: done, kind: terminal}
edges:
  - {from: t, to: review}
  - {from: review, to: done}
triggers:
  - {type: event, eventType: CommentCreated, match: {isPull: true, author: mallory}}
"""


def _reviewing_agent(model: ScriptedModel, seen: list[RecordedRequest]) -> None:
    call_id = new_id("call")

    def is_review_turn(request: RecordedRequest) -> bool:
        texts = request.texts("user")
        last = request.last_input or {}
        return last.get("role") == "user" and bool(texts) and "submit_review" in texts[-1]

    def submit(request: RecordedRequest) -> Step:
        seen.append(request)
        args = {"summary": "One rename to undo.", "comments": COMMENTS}
        return gitea_tool("submit_review", args, call_id=call_id)

    model.respond(last_input_is_tool_output(call_id), lambda _r: message("Reviewed."))
    model.respond(is_review_turn, submit)


def _bot_reviews(gitea: GiteaEmulator, pull: int) -> list[dict[str, Any]]:
    return [
        r
        for r in gitea.reviews("acme", "widget", pull)
        if r["user"]["login"] == BOT and r["state"] != "REQUEST_REVIEW"
    ]


def _ended(admin: httpx.Client, run_id: str) -> dict[str, Any]:
    def done() -> Any:
        run = admin.get(f"/api/pipelines/runs/{run_id}").json()["run"]
        return run["status"] != "running" and run

    ended: dict[str, Any] = wait_for(done, timeout=120, what=f"run {run_id} ends")
    return ended


def test_pr_review_posts_one_review_through_a_review_task(agentic: Agentic) -> None:
    gitea, model = agentic.gitea, agentic.model
    gitea.push_branch("acme", "widget", "main", {"app.txt": BASE})
    gitea.push_branch("acme", "widget", "feature", {"app.txt": HEAD}, base="main", pusher="alice")
    pull = gitea.add_pull("acme", "widget", title="Rename", head="feature", author="alice")
    seen: list[RecordedRequest] = []
    _reviewing_agent(model, seen)
    inputs = {"repo": "acme/widget", "number": pull, "focus": "the renamed lines"}
    with agentic.ff.admin() as admin:
        r = admin.post(
            "/api/pipelines/templates/pr_review/runs",
            json={"requestId": "rv1", "inputs": inputs, "operator": "olga"},
        )
        assert r.status_code == 201, r.text
        run = _ended(admin, r.json()["run"]["runId"])
    assert run["status"] == "succeeded", run
    out = run["state"]["review"]
    (review,) = _bot_reviews(gitea, pull)
    assert (out["reviewId"], out["state"]) == (review["id"], "succeeded")
    # The review command's task: the PR's own session, read-only, one review posted by
    # forgeflow at the head, asked as the operator who started the run.
    detail = agentic.finished(out["taskId"])
    task = detail["task"]
    assert (task["mode"], task["sessionKey"]) == (
        "pr_review",
        f"default:acme/widget:pull_request:{pull}",
    )
    assert task["author"] == "admin:olga"
    assert review["commit_id"] == gitea.pull("acme", "widget", pull)["head"]["sha"]
    positions = [(c["path"], c["position"]) for c in review["comments"]]
    assert positions == [("app.txt", 3)]
    # The emulated Gitea is 1.22: no suggestion block, a plain one under its line.
    body = review["comments"][0]["body"]
    assert body == "A digit?\n\nSuggested replacement:\n\n```\nline 3\n```"
    assert "- `app.txt:20 (new)`: Far from the hunk." in review["body"]
    assert f"taskId={out['taskId']} " in review["body"].splitlines()[-1]
    (turn,) = seen  # one review turn, with the focus, and the review tools only
    assert "the renamed lines" in turn.texts("user")[-1]
    offered = {t.name for t in turn.tools if t.namespace == "mcp__gitea"}
    assert "submit_review" in offered and not offered & {"add_comment", "edit_comment"}
    assert any(e["action"] == "review.confirm" for e in detail["audit"])


def test_a_readers_comment_starts_no_review(agentic: Agentic) -> None:
    gitea = agentic.gitea
    gitea.add_user("mallory")
    gitea.set_permission("acme", "widget", "mallory", "read")
    gitea.push_branch("acme", "widget", "feature", {"f.txt": "x\n"}, base="main")
    pull = gitea.add_pull("acme", "widget", title="Feature", head="feature", author="alice")
    with agentic.ff.admin() as admin:
        r = admin.post("/api/pipelines/templates", content=ON_A_READERS_COMMENT, headers=YAML)
        assert r.status_code == 201, r.text
        gitea.post_comment("acme", "widget", pull, author="mallory", body="look at f.txt")

        def started() -> Any:
            runs = admin.get(
                "/api/pipelines/runs", params={"templateKey": "review_on_comment"}
            ).json()["items"]
            return runs and runs[0]["runId"]

        run_id = wait_for(started, timeout=60, what="the comment's run")
        run = _ended(admin, run_id)
    assert (run["status"], run["errorCode"]) == ("failed", "insufficient_permission"), run
    step = next(s for s in run["steps"] if s["stepId"] == "review")
    assert "mallory" in step["error"]
    assert _bot_reviews(gitea, pull) == []
