"""A diff bomb in a pull request, with the real codex binary and the Gitea emulator:
the hostile agent commits a text file of many megabytes (a few hundred kilobytes once
git compresses it) and forgeflow pushes it to the pull request's branch. What forgeflow
reads of the pull request's diff afterwards, from Gitea (``get_pull_diff``, a review's
prompt) or from its mirror (a re-review's diff since the earlier review), must stay
bounded in forgeflow's own memory, which the jail's limits do not cover.

forgeflow runs in the test's process, so the process's peak resident size
(``ru_maxrss``) is read around the read; the bomb is made by git inside the jail and
the emulator streams its diff from a git process, so neither counts."""

from __future__ import annotations

import json
import resource
import time
from typing import Any

from forgeflow_testkit.agents import TurnAsk, read_turn
from forgeflow_testkit.model_server import RecordedRequest, ScriptedModel, last_input_is_tool_output
from forgeflow_testkit.model_steps import (
    Reply,
    ShellCall,
    Step,
    gitea_comment,
    gitea_tool,
    message,
    new_id,
)
from tests.acceptance.test_rereview import _signed_in
from tests.acceptance.test_reviews import BASE, HEAD, _bot_reviews, _task_of, reviewing_agent
from tests.support.agentic import Agentic
from tests.support.world import BOT

BOMB_BYTES = 160 * 1024 * 1024
# What forgeflow may hold of a diff besides its usual work: the 8 MiB it reads at most,
# a copy or two of that, and the noise of a turn.
MARGIN = 64 * 1024 * 1024
BOMB = (
    f"yes 'a line of data that the pull request adds to the repository' "
    f"| head -c {BOMB_BYTES} > data.txt && git add data.txt && git commit -qm 'Add data'"
)


def _peak() -> int:
    """The test process's (so forgeflow's) peak resident size, in bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _pull(agentic: Agentic) -> int:
    gitea = agentic.gitea
    gitea.push_branch("acme", "widget", "main", {"app.txt": BASE})
    gitea.push_branch("acme", "widget", "feature", {"app.txt": HEAD}, base="main", pusher="alice")
    return gitea.add_pull("acme", "widget", title="Rename", head="feature", author="alice")


def _output(request: RecordedRequest) -> str:
    last = request.last_input
    assert last is not None
    return json.dumps(last.get("output"))


def bombing_agent(model: ScriptedModel, *, read_diff: bool) -> dict[str, Any]:
    """A mention turn: commit the bomb; with ``read_diff``, push it and read the pull
    request's diff with get_pull_diff (the peak before and after that read is kept);
    then answer."""
    seen: dict[str, Any] = {}
    shell_id, push_id, diff_id, answer_id = (new_id("call") for _ in range(4))
    asks: list[TurnAsk] = []

    def answer(_r: RecordedRequest) -> Step:
        ask = asks[-1]
        body = f"Added the data.\n\n{ask.marker}"
        return gitea_comment(ask.owner, ask.repo, ask.number, body, call_id=answer_id)

    def read(request: RecordedRequest) -> Step:
        seen["push"] = _output(request)
        seen["before"] = _peak()
        return gitea_tool("get_pull_diff", {"max_bytes": 2000}, call_id=diff_id)

    def after_read(request: RecordedRequest) -> Step:
        seen["after"] = _peak()
        seen["diff"] = _output(request)
        return answer(request)

    def turn(request: RecordedRequest) -> Step:
        ask = read_turn(request)
        assert ask is not None
        asks.append(ask)
        return Reply.of(ShellCall(BOMB, call_id=shell_id))

    model.respond(last_input_is_tool_output(answer_id), lambda _r: message("Done."))
    model.respond(last_input_is_tool_output(diff_id), after_read)
    model.respond(last_input_is_tool_output(push_id), read)
    after_shell = (
        (lambda _r: gitea_tool("push_branch", {}, call_id=push_id)) if read_diff else answer
    )
    model.respond(last_input_is_tool_output(shell_id), after_shell)
    model.respond(lambda r: read_turn(r) is not None and "call submit_review" not in
                  (r.texts("user") or [""])[-1], turn)  # fmt: skip
    return seen


def test_the_agents_diff_bomb_is_read_bounded_by_get_pull_diff(agentic: Agentic) -> None:
    pull = _pull(agentic)
    seen = bombing_agent(agentic.model, read_diff=True)
    detail = agentic.finished(agentic.mention("@ccweb-bot add the data", index=pull), 180)
    assert detail["task"]["state"] == "succeeded", detail["task"]
    assert "data.txt" in seen["diff"]  # the bomb was pushed and its diff read
    assert seen["after"] - seen["before"] < MARGIN, (seen["before"], seen["after"])
    assert "longer than 2000 bytes" in seen["diff"]


def test_the_session_page_shows_the_agents_diff_bomb_bounded(agentic: Agentic) -> None:
    """The session page shows the pushed work's diff, read from the mirror on every
    view (by anyone who may read the repository): it reads what it shows, quickly."""
    pull = _pull(agentic)
    bombing_agent(agentic.model, read_diff=False)
    detail = agentic.finished(agentic.mention("@ccweb-bot add the data", index=pull), 180)
    assert detail["task"]["state"] == "succeeded", detail["task"]
    with _signed_in(agentic) as client:
        before, start = _peak(), time.monotonic()
        for _ in range(3):
            page = client.get(f"/ui/sessions/{detail['task']['sessionKey']}")
            assert page.status_code == 200
        took, after = time.monotonic() - start, _peak()
    assert "+a line of data that the pull request adds" in page.text  # the diff is shown
    assert after - before < MARGIN, (before, after)
    assert took < 10, took


def test_a_rereview_reads_a_diff_bomb_bounded_from_the_mirror_and_from_gitea(
    agentic: Agentic,
) -> None:
    """A first review, then the agent's bomb pushed by a mention turn, then a review
    request: the re-review's prompt (the diff since the first review, in forgeflow's
    mirror; or the whole diff from Gitea) is made without holding the bomb."""
    gitea, model = agentic.gitea, agentic.model
    pull = _pull(agentic)
    reviews: list[RecordedRequest] = []
    reviewing_agent(model, reviews)
    first = agentic.finished(agentic.mention("@ccweb-bot review", index=pull))
    assert first["task"]["state"] == "succeeded", first["task"]
    commits = len(gitea.branch_log("acme", "widget", "feature"))
    bombing_agent(model, read_diff=False)
    bombed = agentic.finished(agentic.mention("@ccweb-bot add the data", index=pull), 180)
    assert bombed["task"]["state"] == "succeeded", bombed["task"]
    assert len(gitea.branch_log("acme", "widget", "feature")) == commits + 1  # pushed
    before = _peak()
    task = _task_of(gitea.request_review("acme", "widget", pull, reviewer=BOT, by="alice"))
    second = agentic.finished(task, 180)
    assert second["task"]["state"] == "succeeded", second["task"]
    assert len(reviews) == 2 and len(_bot_reviews(gitea, pull)) == 2
    prompt = reviews[1].texts("user")[-1]
    assert "data.txt" in prompt
    after = _peak()
    assert after - before < MARGIN, (before, after)
