"""A command's comment gets the bot's reaction once the command is done (#25), through
the real webhook path, the outbox and the Gitea emulator."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select, update

from forgeflow.store.bookkeeping_schema import comments
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.acceptance.test_commands import _detail, _say
from tests.support.cluster import wait_for
from tests.support.forgeflow import Running
from tests.support.world import BOT

Worker = tuple[GiteaEmulator, Running]


def _bot_comments(gitea: GiteaEmulator, index: int) -> list[dict[str, Any]]:
    return [c for c in gitea.comments("acme", "widget", index) if c["user"]["login"] == BOT]


def _reacted(gitea: GiteaEmulator, comment_id: int, bot_id: int) -> list[str]:
    return [r.content for r in gitea.reactions_on(comment_id=comment_id) if r.user_id == bot_id]


def test_status_gets_plus_one_after_its_answer(worker: Worker) -> None:
    gitea, ff = worker
    issue = gitea.add_issue("acme", "widget", title="t", author="alice")
    task = _say(gitea, issue, "@ccweb-bot fix")["taskId"]
    wait_for(lambda: _detail(ff, task)["terminal"])
    asked = _say(gitea, issue, "@ccweb-bot status")
    answer = wait_for(
        lambda: next((c for c in _bot_comments(gitea, issue) if "status:" in c["body"]), None)
    )
    bot_id = int(answer["user"]["id"])
    wait_for(lambda: _reacted(gitea, asked["_comment"], bot_id) == ["+1"], what="the +1")
    # The reaction came once the answer was out, not before.
    reaction = gitea.reactions_on(comment_id=asked["_comment"])[0]
    answers = [c for c in _bot_comments(gitea, issue) if "status:" in c["body"]]
    assert len(answers) == 1
    posted = datetime.fromisoformat(str(answers[0]["created_at"]))
    assert reaction.created >= posted


def test_stop_gets_plus_one(worker: Worker) -> None:
    gitea, ff = worker
    issue = gitea.add_issue("acme", "widget", title="t", author="alice")
    with ff.admin() as admin:
        admin.post("/api/gitea-workflow/control/pause", json={"requestId": "p"})
    task = _say(gitea, issue, "@ccweb-bot do the thing")["taskId"]
    receipt = wait_for(lambda: next(iter(_bot_comments(gitea, issue)), None))
    bot_id = int(receipt["user"]["id"])
    stop = _say(gitea, issue, "@ccweb-bot stop")
    assert stop["state"] == "cancelled"
    wait_for(lambda: _reacted(gitea, stop["_comment"], bot_id) == ["+1"], what="the +1")
    assert _detail(ff, task)["task"]["state"] == "cancelled"
    # A second stop stops nothing: it is handled, but says so with "confused".
    again = _say(gitea, issue, "@ccweb-bot stop")
    wait_for(lambda: _reacted(gitea, again["_comment"], bot_id) == ["confused"])


def test_refused_reactions_still_answer_the_command(worker: Worker) -> None:
    gitea, ff = worker
    gitea.allow_reactions("eyes")  # this instance has no +1
    issue = gitea.add_issue("acme", "widget", title="t", author="alice")
    task = _say(gitea, issue, "@ccweb-bot fix")["taskId"]
    wait_for(lambda: _detail(ff, task)["terminal"])
    asked = _say(gitea, issue, "@ccweb-bot status")
    wait_for(lambda: any("status: succeeded" in c["body"] for c in _bot_comments(gitea, issue)))
    stop = _say(gitea, issue, "@ccweb-bot stop")
    assert stop["_status"] == 200 and stop["reason"] == "command_stop"
    # The refusal is recorded (not retried every round) and adds no reaction.
    wait_for(lambda: _refused(ff, task) >= 2, what="both refusals recorded")
    assert gitea.reactions_on(comment_id=asked["_comment"]) == []
    assert gitea.reactions_on(comment_id=stop["_comment"]) == []
    assert len([c for c in _bot_comments(gitea, issue) if "status:" in c["body"]]) == 1


def _refused(ff: Running, task_id: str) -> int:
    audit = _detail(ff, task_id)["audit"]
    return sum(
        1
        for e in audit
        if e["action"] == "comment.result"
        and (e.get("metadata") or {}).get("how") == "reaction_refused"
    )


def _reaction_row(ff: Running, comment_id: int) -> str | None:
    key = f"cmd:default:acme/widget:{comment_id}:reaction"
    row = ff.services.store.db.read_sync(  # type: ignore[union-attr]
        lambda c: c.execute(select(comments.c.status).where(comments.c.comment_key == key)).first()
    )
    return None if row is None else str(row[0])


def test_a_crash_after_the_reaction_sends_it_again_harmlessly(worker: Worker) -> None:
    gitea, ff = worker
    issue = gitea.add_issue("acme", "widget", title="t", author="alice")
    asked = _say(gitea, issue, "@ccweb-bot new session")
    assert asked["reason"] == "command_new_session"
    wait_for(lambda: _reaction_row(ff, asked["_comment"]) == "sent", what="the reaction sent")
    assert [r.content for r in gitea.reactions_on(comment_id=asked["_comment"])] == ["+1"]
    # The crash: the reaction reached Gitea, its record did not (the row is pending again).
    key = f"cmd:default:acme/widget:{asked['_comment']}:reaction"
    ff.services.store.db.write_sync(  # type: ignore[union-attr]
        lambda c: c.execute(
            update(comments).where(comments.c.comment_key == key).values(status="pending")
        )
    )
    ff.services.scheduler.wake()  # type: ignore[union-attr]
    wait_for(lambda: _reaction_row(ff, asked["_comment"]) == "sent", what="the resend recorded")
    assert [r.content for r in gitea.reactions_on(comment_id=asked["_comment"])] == ["+1"]
