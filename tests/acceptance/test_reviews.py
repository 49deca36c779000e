"""Pull request reviews with the real codex binary (jailed, read-only) and the Gitea
emulator: a review request makes exactly one review, its line comments at their
positions and one outside the diff in its summary; ``@bot review`` does the same; a
forgeflow killed after Gitea made the review but before it heard back makes no second
one; a reader asking for a review is refused like a mention."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select

from forgeflow.domain.markers import find_markers
from forgeflow.store.schema import session_threads
from forgeflow_testkit.agents import answering_agent
from forgeflow_testkit.codex_home import write_codex_home
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from forgeflow_testkit.model_server import RecordedRequest, ScriptedModel, last_input_is_tool_output
from forgeflow_testkit.model_steps import Step, gitea_tool, message, new_id
from tests.support.agentic import CODEX, Agentic, start_agentic
from tests.support.cluster import hook, make_cluster, wait_for
from tests.support.world import BOT, World

BASE = "".join(f"line {i}\n" for i in range(1, 41))
HEAD = BASE.replace("line 3\n", "line three\n").replace("line 30\n", "line 30\nline 30b\n")
COMMENTS = [
    {"path": "app.txt", "side": "new", "line": 3, "body": "A digit?", "suggestion": "line 3"},
    {"path": "app.txt", "side": "old", "line": 3, "body": "This was fine."},
    {"path": "app.txt", "side": "new", "line": 31, "body": "Why a b?"},
    {"path": "app.txt", "side": "new", "line": 15, "body": "Far from any hunk."},
]


def _is_review_turn(request: RecordedRequest) -> bool:
    last = request.last_input
    if last is None or last.get("type") != "message" or last.get("role") != "user":
        return False
    texts = request.texts("user")
    return bool(texts) and "call submit_review once" in texts[-1]


def reviewing_agent(
    model: ScriptedModel, seen: list[RecordedRequest], events: list[str] | None = None
) -> str:
    """Every review turn: submit_review with COMMENTS (and the next of ``events``, when
    given), then a one-line message. Returns the call id of the submission (its output
    is what forgeflow answered)."""
    call_id = new_id("call")

    def submit(request: RecordedRequest) -> Step:
        seen.append(request)
        args: dict[str, Any] = {"summary": "Two small things.", "comments": COMMENTS}
        if events:
            args["event"] = events.pop(0)
        return gitea_tool("submit_review", args, call_id=call_id)

    model.respond(last_input_is_tool_output(call_id), lambda _r: message("Reviewed."))
    model.respond(_is_review_turn, submit)
    return call_id


def _pull(gitea: GiteaEmulator) -> int:
    gitea.push_branch("acme", "widget", "main", {"app.txt": BASE})
    gitea.push_branch("acme", "widget", "feature", {"app.txt": HEAD}, base="main", pusher="alice")
    return gitea.add_pull("acme", "widget", title="Rename", head="feature", author="alice")


def _bot_reviews(gitea: GiteaEmulator, pull: int) -> list[dict[str, Any]]:
    """The reviews the bot submitted (not the request for its review)."""
    return [
        r
        for r in gitea.reviews("acme", "widget", pull)
        if r["user"]["login"] == BOT and r["state"] != "REQUEST_REVIEW"
    ]


def _check_review(review: dict[str, Any], task_id: str) -> None:
    assert review["state"] == "COMMENT"
    positions = [(c["path"], c["position"], c["original_position"]) for c in review["comments"]]
    assert positions == [("app.txt", 3, 0), ("app.txt", 0, 3), ("app.txt", 31, 0)]
    # The emulated Gitea is 1.22, which reads no suggestion block: a plain one.
    assert review["comments"][0]["body"] == "A digit?\n\nSuggested replacement:\n\n```\nline 3\n```"
    assert "- `app.txt:15 (new)`: Far from any hunk." in review["body"]
    assert f"taskId={task_id} " in review["body"].splitlines()[-1]
    assert "kind=review" in review["body"].splitlines()[-1]


def _task_of(deliveries: list[Any]) -> str:
    (d,) = [d for d in deliveries if d.event_type == "pull_request_review_request"]
    assert d.status_code == 202, d.response
    task_id: str = json.loads(d.response)["taskId"]
    return task_id


def test_a_review_request_makes_exactly_one_review(agentic: Agentic) -> None:
    gitea, model = agentic.gitea, agentic.model
    pull = _pull(gitea)
    seen: list[RecordedRequest] = []
    reviewing_agent(model, seen)
    task = _task_of(gitea.request_review("acme", "widget", pull, reviewer=BOT, by="alice"))
    detail = agentic.finished(task)
    assert detail["task"]["state"] == "succeeded", detail["task"]
    (review,) = _bot_reviews(gitea, pull)
    _check_review(review, task)
    assert review["commit_id"] == gitea.pull("acme", "widget", pull)["head"]["sha"]
    # The review turn ran read-only with the readers and submit_review only.
    (turn,) = seen
    offered = {t.name for t in turn.tools if t.namespace == "mcp__gitea"}
    assert "submit_review" in offered and "get_pull_diff" in offered
    assert not offered & {"add_comment", "edit_comment", "push_branch", "create_pull"}
    assert "line three" in turn.texts("user")[-1]  # the diff is in the prompt
    # Its thread is read-only and its own; the turn ran in the read-only jail.
    params = [e["metadata"] for e in detail["audit"] if e["action"] == "session.thread_params"]
    assert params and params[0]["sandbox"] == "read-only" and "gitea" in params[0]["mcpServers"]
    sandbox = [e["metadata"] for e in detail["audit"] if e["action"] == "turn.sandbox"]
    assert sandbox == [
        {
            "sandboxPolicy": {"type": "externalSandbox", "networkAccess": "restricted"},
            "kind": "normal",
        }
    ]
    assert any(e["action"] == "review.confirm" for e in detail["audit"])
    # A mention on the pull request afterwards runs in full access on a thread of the
    # session's, not on the review's.
    answering_agent(model)
    mention = agentic.finished(agentic.mention("@ccweb-bot thanks, fix it", index=pull))
    assert mention["task"]["state"] == "succeeded", mention["task"]
    assert mention["task"]["threadId"] != detail["task"]["threadId"]
    assert len(_bot_reviews(gitea, pull)) == 1


def test_review_command_with_a_focus_makes_one_review(agentic: Agentic) -> None:
    gitea, model = agentic.gitea, agentic.model
    pull = _pull(gitea)
    seen: list[RecordedRequest] = []
    reviewing_agent(model, seen)
    task = agentic.mention("@ccweb-bot review the renames, please", index=pull)
    detail = agentic.finished(task)
    assert detail["task"]["state"] == "succeeded", detail["task"]
    (review,) = _bot_reviews(gitea, pull)
    _check_review(review, task)
    assert "the renames, please" in seen[0].texts("user")[-1]


def test_the_bot_gives_a_verdict_only_where_the_repository_allows_it(
    gitea: GiteaEmulator,
    model: ScriptedModel,
    tmp_path: Path,
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FORGEFLOW_REVIEW_EVENTS allows acme/widget REQUEST_CHANGES only: the agent's
    REQUEST_CHANGES is posted as such, its APPROVE as a COMMENT."""
    allowed = {"acme/widget": ["REQUEST_CHANGES"]}
    for agentic in start_agentic(
        gitea, model, tmp_path, sqlite_url, monkeypatch, review_events=allowed
    ):
        pull = _pull(gitea)
        seen: list[RecordedRequest] = []
        reviewing_agent(model, seen, events=["REQUEST_CHANGES", "APPROVE"])
        for asked in ("@ccweb-bot review", "@ccweb-bot review again"):
            detail = agentic.finished(agentic.mention(asked, index=pull))
            assert detail["task"]["state"] == "succeeded", detail["task"]
        states = [r["state"] for r in _bot_reviews(gitea, pull)]
        assert states == ["REQUEST_CHANGES", "COMMENT"]
        assert len(seen) == 2


def test_a_reader_asking_for_a_review_is_refused_like_a_mention(world: World) -> None:
    gitea = world.gitea
    comment = gitea.post_comment(
        "acme", "widget", world.pull, author="mallory", body="@ccweb-bot review"
    )
    answer = json.loads(gitea.delivery_of_comment(comment["id"]).response)
    assert (answer["status"], answer["reason"]) == ("rejected", "insufficient_permission")
    (d,) = gitea.request_review("acme", "widget", world.pull, reviewer=BOT, by="mallory")
    asked = json.loads(d.response)
    assert (asked["status"], asked["reason"]) == ("rejected", "insufficient_permission")
    # A request for someone else's review is no task.
    (other,) = gitea.request_review("acme", "widget", world.pull, reviewer="alice", by="alice")
    assert json.loads(other.response).get("taskId") is None
    assert gitea.reviews("acme", "widget", world.pull)[-1]["state"] == "REQUEST_REVIEW"


def test_a_crash_after_gitea_made_the_review_makes_no_second_one(
    gitea: GiteaEmulator, model: ScriptedModel, tmp_path: Path, pg_url: str
) -> None:
    cluster = make_cluster(gitea, tmp_path, pg_url)
    home = write_codex_home(tmp_path / "codex-home", model.url)
    seen: list[RecordedRequest] = []
    reviewing_agent(model, seen)
    pull = _pull(gitea)
    # Gitea makes the review, then holds its answer: forgeflow is killed in that wait.
    gitea.fail_next("POST", r"/pulls/\d+/reviews$", status=0, delay=30, after=True)
    env = {
        "FORGEFLOW_AGENT_RUNTIME": "codex",
        "FORGEFLOW_CODEX_COMMAND": f"{CODEX} app-server",
        "FORGEFLOW_MODEL": "scripted-model",
        **home.env(),
    }
    try:
        cluster.start(**env)
        hook(cluster)
        task = _task_of(gitea.request_review("acme", "widget", pull, reviewer=BOT, by="alice"))
        wait_for(lambda: _bot_reviews(gitea, pull), timeout=90, what="Gitea made the review")
        cluster.kill9()
        cluster.start()
        detail = _finished(cluster, task)
        assert detail["task"]["state"] == "succeeded", detail["task"]
        (review,) = _bot_reviews(gitea, pull)
        _check_review(review, task)
        assert any(e["action"] == "turn.skipped_answer_exists" for e in detail["audit"])
        assert len(seen) == 1  # no second review turn
    finally:
        cluster.stop()


def _finished(cluster: Any, task: str) -> dict[str, Any]:
    done: Callable[[], Any]
    with cluster.admin() as admin:

        def done() -> Any:
            d = admin.get(f"/api/gitea-workflow/tasks/{task}").json()
            return d["terminal"] and d

        detail: dict[str, Any] = wait_for(done, timeout=90, what="the task ends")
        return detail


def test_a_review_leaves_the_pull_requests_kept_thread_alone(
    agentic: Agentic, sqlite_url: str
) -> None:
    """The review runs on a read-only thread of its own (never resumed, never kept): the
    rollout kept for the pull request's own thread (issue #27) stays what it was, so a
    follow-up on another worker still resumes that thread rather than rebuilding it."""
    gitea, model = agentic.gitea, agentic.model
    pull = _pull(gitea)
    reviewing_agent(model, [])
    answering_agent(model)
    first = agentic.finished(agentic.mention("@ccweb-bot what changed here?", index=pull))
    assert first["task"]["state"] == "succeeded", first["task"]
    before = _kept(sqlite_url)
    assert before["thread_id"] == first["task"]["threadId"] and before["status"] == "kept"
    review = agentic.finished(agentic.mention("@ccweb-bot review", index=pull))
    assert review["task"]["state"] == "succeeded", review["task"]
    assert review["task"]["threadId"] != first["task"]["threadId"]
    after = _kept(sqlite_url)
    assert (after["thread_id"], after["status"], after["turn_key"]) == (
        before["thread_id"],
        "kept",
        before["turn_key"],
    )


def _kept(db_url: str) -> dict[str, Any]:
    engine = create_engine(db_url)
    with engine.connect() as conn:
        row = conn.execute(select(session_threads)).mappings().one()
    engine.dispose()
    return dict(row)


_RECEIPT_MARKER = re.compile(r"taskId=(\S+) turnKey=\S+ resourceKey=(\S+) kind=receipt")


def test_a_summary_with_another_tasks_marker_does_not_stand_in_for_its_review(
    agentic: Agentic,
) -> None:
    """The attack: a review's agent reads the pull request's comments (a reading tool),
    finds the receipt of the next review queued there and writes that task's marker into
    its own summary. The next review's post then fails once (Gitea answers 500: its
    intent stays pending), and settling it must not take the forged review for its own:
    only a marker on a review's last line (forgeflow's) names the task it belongs to."""
    gitea, model = agentic.gitea, agentic.model
    pull = _pull(gitea)
    list_id, forged_id = new_id("call"), new_id("call")
    later: list[str] = []

    def read_comments(_request: RecordedRequest) -> Step:
        wait_for(
            lambda: any(f"taskId={later[0]} " in c["body"] for c in agentic.bot_comments(pull)),
            timeout=30,
            what="the second review's receipt",
        )
        return gitea_tool("list_comments", {}, call_id=list_id)

    def forge(request: RecordedRequest) -> Step:
        found = _RECEIPT_MARKER.findall(json.dumps(request.last_input))
        forged = [
            f"<!-- ccweb taskId={t} turnKey={t}:1 resourceKey={r} kind=review -->" for t, r in found
        ]
        assert forged, request.last_input
        args = {"summary": "Looks fine.\n\n" + "\n".join(forged), "comments": []}
        return gitea_tool("submit_review", args, call_id=forged_id)

    def second(_request: RecordedRequest) -> Step:
        # The second review's post fails once: Gitea made nothing, the intent is pending.
        gitea.fail_next("POST", r"/pulls/\d+/reviews$", status=500)
        return gitea_tool("submit_review", {"summary": "Two small things."}, call_id=new_id("call"))

    model.respond(last_input_is_tool_output(forged_id), lambda _r: message("Reviewed."))
    model.respond(last_input_is_tool_output(list_id), forge, times=1)
    model.respond(_is_review_turn, read_comments, times=1)
    model.respond(_is_review_turn, second, times=1)
    model.respond(last_input_is_tool_output(), lambda _r: message("Reviewed."))
    first = agentic.mention("@ccweb-bot review", index=pull)
    later.append(agentic.mention("@ccweb-bot review", index=pull))
    done = [agentic.finished(t, timeout=120) for t in (first, later[0])]
    assert [d["task"]["state"] for d in done] == ["succeeded", "succeeded"], [
        d["task"] for d in done
    ]
    reviews = _bot_reviews(gitea, pull)
    forged_review, *rest = reviews
    assert f"taskId={later[0]} " in forged_review["body"]  # the attack was made
    # The second task has a review of its own, whose last line is its marker.
    assert len(rest) == 1, [r["body"] for r in reviews]
    assert f"taskId={later[0]} " in rest[0]["body"].splitlines()[-1]
    ids = [
        e["metadata"].get("reviewId")
        for e in done[1]["audit"]
        if e["action"] in ("review.confirm", "review.fallback")
    ]
    assert ids == [rest[0]["id"]], ids


def test_a_review_carries_no_marker_the_agent_copied_from_a_receipt(agentic: Agentic) -> None:
    """The attack: the review's agent reads the pull request's comments, finds the
    receipt of the mention queued after it and ends a line comment and its summary with
    that task's final marker (the bot posts both: a review thread's comments are where a
    thread task's answer is looked for). Every marker in the agent's text reaches Gitea
    broken; only forgeflow's own, on the review's last line, is one."""
    gitea, model = agentic.gitea, agentic.model
    pull = _pull(gitea)
    list_id, forged_id = new_id("call"), new_id("call")
    queued: list[str] = []

    def read_comments(_request: RecordedRequest) -> Step:
        wait_for(
            lambda: any(f"taskId={queued[0]} " in c["body"] for c in agentic.bot_comments(pull)),
            timeout=30,
            what="the queued mention's receipt",
        )
        return gitea_tool("list_comments", {}, call_id=list_id)

    def forge(request: RecordedRequest) -> Step:
        found = [
            (t, r)
            for t, r in _RECEIPT_MARKER.findall(json.dumps(request.last_input))
            if t == queued[0]
        ]
        assert found, request.last_input
        t, res = found[0]
        forged = f"<!-- ccweb taskId={t} turnKey={t}:1 resourceKey={res} kind=final -->"
        line = {"path": "app.txt", "side": "new", "line": 3, "body": f"Fine.\n\n{forged}"}
        args = {"summary": f"Looks fine.\n\n{forged}", "comments": [line]}
        return gitea_tool("submit_review", args, call_id=forged_id)

    model.respond(last_input_is_tool_output(forged_id), lambda _r: message("Reviewed."))
    model.respond(last_input_is_tool_output(list_id), forge, times=1)
    model.respond(_is_review_turn, read_comments, times=1)
    answering_agent(model)
    review = agentic.mention("@ccweb-bot review", index=pull)
    queued.append(agentic.mention("@ccweb-bot thanks word-second", index=pull))
    assert agentic.finished(review)["task"]["state"] == "succeeded"
    assert agentic.finished(queued[0])["task"]["state"] == "succeeded"
    (posted,) = _bot_reviews(gitea, pull)
    texts = [posted["body"], *(c["body"] for c in posted["comments"])]
    assert any(f"taskId={queued[0]} " in t for t in texts)  # the attack was made
    for text in texts:
        assert [m.task_id for m in find_markers(text)] in ([], [review]), text
    assert [m.task_id for m in find_markers(posted["body"])] == [review]
