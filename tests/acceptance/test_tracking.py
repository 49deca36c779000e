"""The receipt as a tracking comment and the reaction at once (#25), with the real codex
app-server, the scripted model and the Gitea emulator."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from forgeflow_testkit.agents import read_turn
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from forgeflow_testkit.model_server import RecordedRequest, ScriptedModel, last_input_is_tool_output
from forgeflow_testkit.model_steps import Reply, Step, gitea_comment, message
from tests.support.agentic import Agentic, start_agentic
from tests.support.cluster import wait_for


@pytest.fixture
def tracked(
    gitea: GiteaEmulator,
    model: ScriptedModel,
    tmp_path: Path,
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Agentic]:
    yield from start_agentic(
        gitea, model, tmp_path, sqlite_url, monkeypatch, tracking_edit_seconds=0.2
    )


def slow_answering_agent(model: ScriptedModel) -> None:
    """Each turn: after a pause, the answer through the Gitea tool, then a closing
    message. (The pinned codex answers ``update_plan`` with "unsupported call" for this
    model, so the plan's checklist is tested on the notification's shape in
    tests/test_tracking.py, not here.)"""

    def start(request: RecordedRequest) -> Step:
        ask = read_turn(request)
        assert ask is not None
        body = f"Here is my answer.\n\n{ask.marker}"
        return Reply.of(gitea_comment(ask.owner, ask.repo, ask.number, body), delay=0.6)

    model.respond(last_input_is_tool_output(), lambda _r: message("Posted my answer."))
    model.respond(lambda r: read_turn(r) is not None, start)


def _receipt(agentic: Agentic) -> dict[str, object]:
    receipts = [c for c in agentic.bot_comments() if "kind=receipt" in c["body"]]
    assert len(receipts) == 1, receipts
    return receipts[0]


def test_reaction_first_then_the_receipt_tracks_the_turn(tracked: Agentic) -> None:
    agentic = tracked
    slow_answering_agent(agentic.model)
    task_id = agentic.mention("@ccweb-bot please explain the flaky test")
    done = agentic.finished(task_id)
    assert done["task"]["state"] == "succeeded", (done["task"], agentic.model.errors)
    mention = next(
        c for c in agentic.gitea.comments("acme", "widget", agentic.issue) if "explain" in c["body"]
    )
    # The mention got 👀 from the bot before the turn's first model request.
    reactions = agentic.gitea.reactions_on(comment_id=int(mention["id"]))
    assert [r.content for r in reactions] == ["eyes"]
    first_request = agentic.model.requests[0].received_at + (time.time() - time.monotonic())
    assert reactions[0].created.astimezone(UTC) < datetime.fromtimestamp(first_request, UTC)
    # One receipt, edited: during the turn it showed the plan as a checklist and no
    # outcome; at the end the outcome and the tokens.
    receipt = _receipt(agentic)
    body = wait_for(
        lambda: "结果 / outcome" in (b := str(_receipt(agentic)["body"])) and b,
        timeout=20,
        what="the final edit of the receipt",
    )
    history = agentic.gitea.comment_history(int(str(receipt["id"])))
    assert history[0].startswith("giteabot: 已收到")
    assert all(b.startswith("giteabot: 已收到") and "kind=receipt" in b for b in history)
    # During the turn: what the agent did (its Gitea tool call) and the tokens so far,
    # no outcome yet; every edit kept the receipt's marker.
    during = [b for b in history if "now: `gitea.add_comment`" in b and "outcome" not in b]
    assert during and any("tokens:" in b for b in during)
    assert "answered below" in body and "tokens:" in body
    assert history[-1] == body  # nothing went out after the final edit
    # The answer is still its own comment.
    kinds = sorted(c["body"].rsplit("kind=", 1)[1] for c in agentic.bot_comments())
    assert kinds == ["final -->", "receipt -->"]


def test_refused_reactions_cost_nothing_else(tracked: Agentic) -> None:
    agentic = tracked
    agentic.gitea.allow_reactions("+1", "-1")  # no eyes on this instance
    slow_answering_agent(agentic.model)
    task_id = agentic.mention("@ccweb-bot please explain the flaky test")
    assert agentic.finished(task_id)["task"]["state"] == "succeeded"
    mention = next(
        c for c in agentic.gitea.comments("acme", "widget", agentic.issue) if "explain" in c["body"]
    )
    assert agentic.gitea.reactions_on(comment_id=int(mention["id"])) == []
    body = wait_for(
        lambda: "结果 / outcome" in (b := str(_receipt(agentic)["body"])) and b,
        timeout=20,
        what="the final edit of the receipt",
    )
    assert "answered below" in body
