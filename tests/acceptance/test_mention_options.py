"""Per-mention options and the conversation's images (#25 items 4 and 5), with the real
codex app-server, the scripted model and the Gitea emulator."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from forgeflow_testkit.agents import answering_agent
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from forgeflow_testkit.model_server import RecordedRequest, ScriptedModel
from forgeflow_testkit.model_steps import Reply, ShellCall, delay, message, new_id
from tests.support.agentic import Agentic, start_agentic
from tests.support.cluster import wait_for
from tests.support.world import BOT


@pytest.fixture
def optioned(
    gitea: GiteaEmulator,
    model: ScriptedModel,
    tmp_path: Path,
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Agentic]:
    yield from start_agentic(
        gitea, model, tmp_path, sqlite_url, monkeypatch, allowed_models="other-model"
    )


def _png(pixel: bytes = b"\xff\x00\x00") -> bytes:
    """A real 1×1 PNG of one ``pixel`` (signature, IHDR, IDAT, IEND)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00" + pixel)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


def _images(request: RecordedRequest) -> list[str]:
    """The image URLs of the request's user messages (Responses API ``input_image``)."""
    found = []
    for item in request.input:
        if item.get("type") == "message" and item.get("role") == "user":
            for part in item.get("content") or []:
                if isinstance(part, dict) and part.get("type") == "input_image":
                    found.append(str(part.get("image_url")))
    return found


def _receipt(agentic: Agentic) -> str:
    receipts = [c for c in agentic.bot_comments() if "kind=receipt" in c["body"]]
    assert len(receipts) == 1, receipts
    return str(receipts[0]["body"])


def test_the_chosen_model_reaches_the_model_and_the_receipt_shows_it(optioned: Agentic) -> None:
    agentic = optioned
    answering_agent(agentic.model)
    task_id = agentic.mention("@ccweb-bot --model other-model --max-tokens 100000 explain it")
    done = agentic.finished(task_id)
    assert done["task"]["state"] == "succeeded", (done["task"], agentic.model.errors)
    assert done["task"]["model"] == "other-model" and done["task"]["maxTokens"] == 100000
    requests = agentic.model.requests
    assert requests and all(r.body.get("model") == "other-model" for r in requests)
    # The instruction the agent got is the text after the options.
    assert "explain it" in requests[0].texts("user")[-1]
    assert "--max-tokens" not in requests[0].texts("user")[-1]
    body = _receipt(agentic)
    assert "模型 / model: `other-model`" in body and "上限 / cap: 100000 tokens" in body


def test_a_cap_that_is_exceeded_stops_the_task(optioned: Agentic) -> None:
    agentic = optioned
    # The first answer costs 110 tokens (the scripted usage) and runs a command; codex
    # reports them as it asks for the next answer, which the model holds back: the cap
    # of 50 is over while the turn still runs, and forgeflow interrupts it.
    call_id = new_id("call")
    agentic.model.enqueue(Reply.of(ShellCall("true", call_id=call_id)))
    agentic.model.after_tool_output(delay(60, message("never")), call_id=call_id)
    task_id = agentic.mention("@ccweb-bot --max-tokens 50 run the slow thing")
    done = agentic.finished(task_id, timeout=40)
    task = done["task"]
    assert task["state"] == "failed" and task["errorCode"] == "budget_exceeded", task
    assert "token cap of 50 tokens" in task["executionError"]
    assert task["inputTokens"] + task["outputTokens"] >= 50
    assert done["turns"][0]["status"] == "interrupted"
    notice = wait_for(
        lambda: next((c for c in agentic.bot_comments() if "kind=result" in c["body"]), None),
        what="the failure notice",
    )
    assert "token cap of 50 tokens for this task" in notice["body"]
    assert not [c for c in agentic.bot_comments() if "kind=final" in c["body"]]


def test_unknown_and_disallowed_options_are_answered_once_without_a_turn(
    optioned: Agentic,
) -> None:
    agentic = optioned
    comment = agentic.gitea.post_comment(
        "acme",
        "widget",
        agentic.issue,
        author="alice",
        body="@ccweb-bot --model huge --frobnicate yes fix it",
    )
    answer: dict[str, Any] = json.loads(agentic.gitea.delivery_of_comment(comment["id"]).response)
    assert answer["status"] == "rejected" and answer["reason"] == "invalid_options"
    reply = wait_for(
        lambda: next(iter(agentic.bot_comments()), None), what="the answer to the options"
    )
    body = reply["body"]
    assert "unknown option `--frobnicate`" in body
    assert "--model `huge` is not allowed" in body
    assert "`scripted-model`, `other-model`" in body and "--max-tokens N" in body
    assert agentic.detail(answer["taskId"])["task"]["state"] == "rejected"
    assert [c["user"]["login"] for c in agentic.bot_comments()] == [BOT]
    # A cap above the repository's budget is refused the same way, naming the budget.
    with agentic.ff.admin() as admin:
        r = admin.put(
            "/api/gitea-workflow/repos/default:acme/widget/budget",
            json={"requestId": "b1", "dailyTokens": 5000},
        )
        assert r.status_code == 200
    over = agentic.gitea.post_comment(
        "acme", "widget", agentic.issue, author="alice", body="@ccweb-bot --max-tokens 9000 go"
    )
    refused = json.loads(agentic.gitea.delivery_of_comment(over["id"]).response)
    assert refused["reason"] == "invalid_options"
    second = wait_for(
        lambda: (found := agentic.bot_comments())[1:] and found[1], what="the second answer"
    )
    assert "--max-tokens 9000 is over the repository's token budget" in second["body"]
    assert "from 1 to 5000" in second["body"]
    assert agentic.model.requests == []


def test_an_image_attached_to_the_issue_reaches_the_model(optioned: Agentic) -> None:
    agentic = optioned
    png = _png()
    agentic.gitea.attach("acme", "widget", agentic.issue, name="shot.png", data=png, author="alice")
    # Not an image, whatever its name says: never handed over.
    agentic.gitea.attach(
        "acme", "widget", agentic.issue, name="fake.png", data=b"%PDF-1.7", author="alice"
    )
    answering_agent(agentic.model)
    task_id = agentic.mention("@ccweb-bot what is in the screenshot?")
    done = agentic.finished(task_id)
    assert done["task"]["state"] == "succeeded", (done["task"], agentic.model.errors)
    first = agentic.model.requests[0]
    assert _images(first) == ["data:image/png;base64," + base64.b64encode(png).decode()]
    skipped = [e["metadata"] for e in done["audit"] if e["action"] == "prompt.image_skipped"]
    assert skipped == [
        {"name": "fake.png", "where": "issue", "why": "not an image (its first bytes)"}
    ]
    # The next mention on the same thread: the issue's image was sent already (it is
    # in the thread's history once), a comment's new one is sent with this turn.
    later = _png(b"\x00\x00\xff")
    note = agentic.gitea.post_comment(
        "acme", "widget", agentic.issue, author="alice", body="another screenshot"
    )
    agentic.gitea.attach(
        "acme",
        "widget",
        agentic.issue,
        name="b.png",
        data=later,
        author="alice",
        comment_id=int(note["id"]),
    )
    count = len(agentic.model.requests)
    second = agentic.mention("@ccweb-bot and this one?")
    assert agentic.finished(second)["task"]["state"] == "succeeded"
    sent = _images(agentic.model.requests[count])
    urls = ["data:image/png;base64," + base64.b64encode(p).decode() for p in (png, later)]
    assert sent == urls  # the first from the history, the second new
