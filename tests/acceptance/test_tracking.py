"""The receipt as a tracking comment and the reaction at once (#25), with the real codex
app-server, the scripted model and the Gitea emulator."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from forgeflow.domain.prices import Price, Prices, Usage
from forgeflow_testkit.agents import TurnAsk, read_turn
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from forgeflow_testkit.model_server import RecordedRequest, ScriptedModel, last_input_is_tool_output
from forgeflow_testkit.model_steps import Reply, Step, ToolCall, gitea_comment, message
from forgeflow_testkit.model_steps import Usage as ModelUsage
from tests.support.agentic import Agentic, start_agentic
from tests.support.cluster import wait_for
from tests.support.forgeflow import ADMIN_TOKEN


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


# Per million tokens, in EUR (the currency label is a setting).
PRICES = {"scripted-model": {"input": 3000, "output": 15000, "cached_input": 300}}


@pytest.fixture
def priced(
    gitea: GiteaEmulator,
    model: ScriptedModel,
    tmp_path: Path,
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Agentic]:
    yield from start_agentic(
        gitea,
        model,
        tmp_path,
        sqlite_url,
        monkeypatch,
        tracking_edit_seconds=0.2,
        prices=PRICES,
        price_currency="EUR",
    )


def slow_answering_agent(model: ScriptedModel, *, cached: bool = False) -> None:
    """Each turn: after a pause, the answer through the Gitea tool, then a closing
    message (no plan: see :func:`planning_agent` for the checklist)."""

    def start(request: RecordedRequest) -> Step:
        ask = read_turn(request)
        assert ask is not None
        body = f"Here is my answer.\n\n{ask.marker}"
        usage = ModelUsage(1000, cached_input_tokens=400, output_tokens=50) if cached else None
        call = gitea_comment(ask.owner, ask.repo, ask.number, body)
        return Reply.of(call, usage=usage, delay=0.6)

    closing = ModelUsage(2000, cached_input_tokens=1500, output_tokens=20) if cached else None
    model.respond(
        last_input_is_tool_output(), lambda _r: message("Posted my answer.", usage=closing)
    )
    model.respond(lambda r: read_turn(r) is not None, start)


PLAN_CALL = "call_plan_scripted"
PLAN = [
    {"step": "Read the issue and the failing test", "status": "completed"},
    {"step": "Find why the test is flaky", "status": "completed"},
    {"step": "Explain the cause on the issue", "status": "in_progress"},
]


def planning_agent(model: ScriptedModel) -> None:
    """Each turn: the plan through codex's ``update_plan`` tool (two steps done, one in
    progress), then after a pause the answer through the Gitea tool, then a closing
    message. The tool is codex's own: the script fails the turn if codex did not offer
    it (ToolCall.resolve), and codex answers a call it did not offer "unsupported call"."""

    asks: list[TurnAsk] = []  # the turn's prompt: only its first request ends with it

    def plan(request: RecordedRequest) -> Step:
        ask = read_turn(request)
        assert ask is not None
        asks.append(ask)
        return ToolCall("update_plan", {"plan": PLAN}, call_id=PLAN_CALL)

    def answer(_request: RecordedRequest) -> Step:
        ask = asks[-1]
        body = f"Here is my answer.\n\n{ask.marker}"
        return Reply.of(gitea_comment(ask.owner, ask.repo, ask.number, body), delay=0.8)

    # Checked in order: the plan's result, then the Gitea tool's, then the turn's start.
    model.respond(last_input_is_tool_output(PLAN_CALL), answer)
    model.respond(last_input_is_tool_output(), lambda _r: message("Posted my answer."))
    model.respond(lambda r: read_turn(r) is not None, plan)


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


def test_the_receipt_shows_the_agents_plan_as_a_checklist_during_the_turn(
    tracked: Agentic,
) -> None:
    agentic = tracked
    planning_agent(agentic.model)
    task_id = agentic.mention("@ccweb-bot please explain the flaky test")
    done = agentic.finished(task_id)
    assert done["task"]["state"] == "succeeded", (done["task"], agentic.model.errors)
    # forgeflow's config gave the agent codex's plan tool, and codex ran it: its result,
    # not "unsupported call", went back to the model.
    turn_requests = [r for r in agentic.model.requests if read_turn(r) is not None]
    assert turn_requests and all(r.tool("update_plan") for r in turn_requests)
    outputs = [o for r in agentic.model.requests for o in r.function_call_outputs()]
    plan_output = next(o for o in outputs if o.get("call_id") == PLAN_CALL)
    assert "unsupported" not in str(plan_output.get("output"))
    body = _final_receipt(agentic)
    receipt_id = int(str(_receipt(agentic)["id"]))
    history = agentic.gitea.comment_history(receipt_id)
    checklist = (
        "- [x] Read the issue and the failing test\n"
        "- [x] Find why the test is flaky\n"
        "- [ ] Explain the cause on the issue"
    )
    # An edit during the turn showed the plan as the checklist, with no outcome yet;
    # the final edit came after it, with the outcome.
    during = [i for i, b in enumerate(history) if checklist in b and "outcome" not in b]
    assert during, history
    assert history[-1] == body and during[-1] < len(history) - 1
    assert "answered below" in body and "tokens:" in body
    assert "- [" not in body  # the outcome replaces the checklist
    assert all(b.startswith("giteabot: 已收到") and "kind=receipt" in b for b in history)
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


def _final_receipt(agentic: Agentic) -> str:
    body: str = wait_for(
        lambda: "结果 / outcome" in (b := str(_receipt(agentic)["body"])) and b,
        timeout=20,
        what="the final edit of the receipt",
    )
    return body


@contextmanager
def _signed_in(agentic: Agentic) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=agentic.ff.url, timeout=30) as client:
        form = client.get("/ui/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf is not None
        r = client.post(
            "/ui/login", data={"csrf": csrf.group(1), "token": ADMIN_TOKEN, "operator": "ops"}
        )
        assert r.status_code == 303, r.text
        yield client


def test_with_prices_the_final_receipt_and_the_task_page_show_the_cost(priced: Agentic) -> None:
    agentic = priced
    slow_answering_agent(agentic.model, cached=True)
    task_id = agentic.mention("@ccweb-bot please explain the flaky test")
    task = agentic.finished(task_id)["task"]
    assert task["state"] == "succeeded", (task, agentic.model.errors)
    # Codex reported the cached part of the input apart (input_tokens_details), and
    # forgeflow kept it: only the two scripted replies had cached tokens.
    assert task["cachedInputTokens"] == 400 + 1500
    assert task["inputTokens"] >= 3000 and task["outputTokens"] >= 70
    used = Usage(task["inputTokens"], task["outputTokens"], task["cachedInputTokens"])
    price = Price(Decimal(3000), Decimal(15000), Decimal(300))
    expected = Prices({"scripted-model": price}, currency="EUR").shown("scripted-model", used)
    assert expected is not None and expected.endswith(" EUR")
    # (3000 - 1900) x 3000 + 1900 x 300 + 70 x 15000 per million = 4.92 for the scripted
    # replies alone; any other request codex made adds to it, never takes away.
    assert Decimal(expected.split()[0]) >= Decimal("4.92")
    body = _final_receipt(agentic)
    assert f"tokens: {task['inputTokens']} in, {task['outputTokens']} out" in body
    assert f"费用 / cost: {expected}" in body
    # During the turn no cost was shown (it is the final edit's).
    receipt_id = int(str(_receipt(agentic)["id"]))
    assert all("cost" not in b for b in agentic.gitea.comment_history(receipt_id)[:-1])
    with _signed_in(agentic) as client:
        page = client.get(f"/ui/tasks/{task_id}")
    assert page.status_code == 200
    assert f'<dd id="task-cost">{expected}</dd>' in page.text
    assert f"{task['inputTokens']} in (1900 cached)" in page.text


def test_without_prices_the_final_receipt_shows_tokens_and_no_cost(tracked: Agentic) -> None:
    agentic = tracked
    slow_answering_agent(agentic.model, cached=True)
    task_id = agentic.mention("@ccweb-bot please explain the flaky test")
    task = agentic.finished(task_id)["task"]
    assert task["state"] == "succeeded", (task, agentic.model.errors)
    body = _final_receipt(agentic)
    assert f"tokens: {task['inputTokens']} in, {task['outputTokens']} out" in body
    assert "cost" not in body and "费用" not in body
    with _signed_in(agentic) as client:
        page = client.get(f"/ui/tasks/{task_id}")
    assert page.status_code == 200 and 'id="task-cost"' not in page.text
