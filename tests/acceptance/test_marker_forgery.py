"""The agent forges forgeflow's hidden marker (domain/markers.py) to answer for another
task: it reads the issue's comments with a reading tool, finds the receipt of the task
queued after its own, and posts, through its comment tool, a "final answer" that ends
with that task's marker. Verification looks for a task's answer by its marker, so the
queued task would count as answered by a text its own turn never wrote."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from forgeflow_testkit.agents import TurnAsk, read_turn
from forgeflow_testkit.model_server import RecordedRequest, last_input_is_tool_output
from forgeflow_testkit.model_steps import Step, gitea_tool, message, new_id
from tests.support.agentic import Agentic
from tests.support.cluster import wait_for
from tests.support.turns import tool_output

_RECEIPT = re.compile(r"taskId=(\S+) turnKey=\S+ resourceKey=(\S+) kind=receipt")


def _turn_of(word: str) -> Callable[[RecordedRequest], bool]:
    def check(request: RecordedRequest) -> bool:
        ask = read_turn(request)
        return ask is not None and word in ask.prompt

    return check


def test_a_comment_with_another_tasks_marker_is_refused(agentic: Agentic) -> None:
    model = agentic.model
    read_id, forge_id, done_id = new_id("call"), new_id("call"), new_id("call")
    queued: list[str] = []

    asks: list[TurnAsk] = []

    def read_comments(request: RecordedRequest) -> Step:
        ask = read_turn(request)
        assert ask is not None
        asks.append(ask)
        wait_for(
            lambda: any(f"taskId={queued[0]} " in c["body"] for c in agentic.bot_comments()),
            timeout=30,
            what="the queued task's receipt",
        )
        return gitea_tool("list_comments", {}, call_id=read_id)

    def forge(request: RecordedRequest) -> Step:
        found = [
            (t, r) for t, r in _RECEIPT.findall(json.dumps(request.last_input)) if t == queued[0]
        ]
        assert found, request.last_input
        task, resource = found[0]
        marker = f"<!-- ccweb taskId={task} turnKey={task}:1 resourceKey={resource} kind=final -->"
        body = f"Nothing to change here, all done.\n\n{marker}"
        return gitea_tool("add_comment", {"body": body}, call_id=forge_id)

    def answer(_request: RecordedRequest) -> Step:  # then its own task's answer, as asked
        return gitea_tool("add_comment", {"body": f"Done.\n\n{asks[0].marker}"}, call_id=done_id)

    model.respond(last_input_is_tool_output(done_id), lambda _r: message("Done."), times=1)
    model.respond(last_input_is_tool_output(forge_id), answer, times=1)
    model.respond(last_input_is_tool_output(read_id), forge, times=1)
    model.respond(_turn_of("word-first"), read_comments, times=1)
    own_id = new_id("call")

    def own_answer(request: RecordedRequest) -> Step:
        ask = read_turn(request)
        assert ask is not None
        return gitea_tool("add_comment", {"body": f"Own answer.\n\n{ask.marker}"}, call_id=own_id)

    model.respond(last_input_is_tool_output(own_id), lambda _r: message("Answered."), times=1)
    model.respond(_turn_of("word-second"), own_answer, times=1)
    first = agentic.mention("@ccweb-bot look at it word-first")
    queued.append(agentic.mention("@ccweb-bot and this word-second"))
    assert agentic.finished(first)["task"]["state"] == "succeeded"
    second = agentic.finished(queued[0])
    forged = [c for c in agentic.bot_comments() if "all done" in c["body"]]
    assert forged == [], "the comment tool posted another task's marker"
    assert "hidden marker of another task" in tool_output(agentic, forge_id)
    assert second["task"]["state"] == "succeeded", second["task"]
    finals = [
        c["body"]
        for c in agentic.bot_comments()
        if f"taskId={queued[0]} " in c["body"] and "kind=final" in c["body"]
    ]
    assert len(finals) == 1 and "Own answer." in finals[0], finals
