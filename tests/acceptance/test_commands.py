"""Comment commands through the real webhook path: stop, status, new session."""

from __future__ import annotations

import json
import time
from typing import Any

from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.cluster import wait_for
from tests.support.forgeflow import Running
from tests.support.world import BOT

Worker = tuple[GiteaEmulator, Running]


def _say(gitea: GiteaEmulator, index: int, text: str, author: str = "alice") -> dict[str, Any]:
    comment = gitea.post_comment("acme", "widget", index, author=author, body=text)
    d = gitea.delivery_of_comment(comment["id"])
    body: dict[str, Any] = json.loads(d.response)
    body["_status"] = d.status_code
    body["_comment"] = comment["id"]
    return body


def _detail(ff: Running, task_id: str) -> dict[str, Any]:
    with ff.admin() as admin:
        detail: dict[str, Any] = admin.get(f"/api/gitea-workflow/tasks/{task_id}").json()
        return detail


def _bot(gitea: GiteaEmulator, index: int) -> list[str]:
    return [c["body"] for c in gitea.comments("acme", "widget", index) if c["user"]["login"] == BOT]


def _tasks(ff: Running) -> list[dict[str, Any]]:
    with ff.admin() as admin:
        items: list[dict[str, Any]] = admin.get(
            "/api/gitea-workflow/tasks", params={"limit": 200}
        ).json()["items"]
        return items


def test_stop_cancels_a_queued_task(worker: Worker) -> None:
    gitea, ff = worker
    issue = gitea.add_issue("acme", "widget", title="t", author="alice")
    with ff.admin() as admin:
        admin.post("/api/gitea-workflow/control/pause", json={"requestId": "p"})
    task = _say(gitea, issue, "@ccweb-bot do the thing")["taskId"]
    other = gitea.add_issue("acme", "widget", title="u", author="alice")
    behind = _say(gitea, other, "@ccweb-bot after it")["taskId"]
    assert _detail(ff, task)["queuePosition"] == 0
    assert _detail(ff, behind)["queuePosition"] == 1
    # The one receipt says how many wait ahead; the queue moving posts nothing more.
    wait_for(lambda: any("1 task(s) ahead" in b for b in _bot(gitea, other)))
    answer = _say(gitea, issue, "@ccweb-bot stop")
    assert answer["_status"] == 200 and answer["reason"] == "command_stop"
    assert answer["taskId"] == task and answer["state"] == "cancelled"
    detail = _detail(ff, task)
    assert detail["task"]["state"] == "cancelled"
    stop = [e for e in detail["audit"] if e["action"] == "command.stop"]
    assert stop and stop[0]["actor"] == "gitea:user:alice"
    assert len(_tasks(ff)) == 2  # the command is not a task
    wait_for(lambda: any("kind=result" in b for b in _bot(gitea, issue)))


def test_stop_aborts_a_running_turn(worker: Worker) -> None:
    gitea, ff = worker
    ff.services.runtime.turn_seconds = 30  # type: ignore[union-attr]
    issue = gitea.add_issue("acme", "widget", title="t", author="alice")
    task = _say(gitea, issue, "@ccweb-bot long job")["taskId"]
    wait_for(lambda: _detail(ff, task)["task"]["state"] == "running")
    assert _say(gitea, issue, "@ccweb-bot stop")["state"] == "aborting"
    wait_for(lambda: _detail(ff, task)["task"]["state"] == "aborted", timeout=15)


def test_status_answers_once_without_starting_the_agent(worker: Worker) -> None:
    gitea, ff = worker
    issue = gitea.add_issue("acme", "widget", title="t", author="alice")
    task = _say(gitea, issue, "@ccweb-bot fix")["taskId"]
    wait_for(lambda: _detail(ff, task)["terminal"])
    asked = _say(gitea, issue, "@ccweb-bot status")
    wait_for(lambda: any("status: succeeded" in b for b in _bot(gitea, issue)))
    status = [b for b in _bot(gitea, issue) if "status:" in b]
    assert len(status) == 1 and "tokens so far: 100 in, 20 out" in status[0]
    # Replaying the command does not answer twice.
    replay = gitea.redeliver(gitea.delivery_of_comment(asked["_comment"]))
    assert json.loads(replay.response)["status"] == "duplicate"
    ff.services.scheduler.wake()  # type: ignore[union-attr]
    time.sleep(1.0)
    assert len([b for b in _bot(gitea, issue) if "status:" in b]) == 1
    assert len(_tasks(ff)) == 1
    assert len(_detail(ff, task)["turns"]) == 1


def test_new_session_starts_a_fresh_thread(worker: Worker) -> None:
    gitea, ff = worker
    issue = gitea.add_issue("acme", "widget", title="t", author="alice")
    first = _say(gitea, issue, "@ccweb-bot one")["taskId"]
    wait_for(lambda: _detail(ff, first)["terminal"])
    answer = _say(gitea, issue, "@ccweb-bot new session")
    assert answer["reason"] == "command_new_session"
    second = _say(gitea, issue, "@ccweb-bot two")["taskId"]
    wait_for(lambda: _detail(ff, second)["terminal"])
    threads = [_detail(ff, t)["task"]["threadId"] for t in (first, second)]
    assert threads[0] and threads[1] and threads[0] != threads[1]
    with ff.admin() as admin:
        closed = admin.get("/api/gitea-workflow/audit", params={"action": "session.close"}).json()
    assert len(closed["items"]) == 1


def test_commands_need_the_trigger_permission(worker: Worker) -> None:
    gitea, ff = worker
    gitea.add_user("mallory")
    gitea.set_permission("acme", "widget", "mallory", "read")
    issue = gitea.add_issue("acme", "widget", title="t", author="alice")
    with ff.admin() as admin:
        admin.post("/api/gitea-workflow/control/pause", json={"requestId": "p"})
    task = _say(gitea, issue, "@ccweb-bot work")["taskId"]
    answer = _say(gitea, issue, "@ccweb-bot stop", author="mallory")
    assert answer["status"] == "rejected" and answer["reason"] == "insufficient_permission"
    assert _detail(ff, task)["task"]["state"] == "queued"


def test_the_ui_shows_the_queue_position(worker: Worker) -> None:
    import httpx

    from tests.support.forgeflow import ADMIN_TOKEN

    gitea, ff = worker
    issue = gitea.add_issue("acme", "widget", title="t", author="alice")
    with ff.admin() as admin:
        admin.post("/api/gitea-workflow/control/pause", json={"requestId": "p"})
    _say(gitea, issue, "@ccweb-bot first")
    other = gitea.add_issue("acme", "widget", title="u", author="alice")
    behind = _say(gitea, other, "@ccweb-bot second")["taskId"]
    with httpx.Client(base_url=ff.url, follow_redirects=True) as ui:
        login = ui.get("/ui/login")
        token = login.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        ui.post("/ui/login", data={"token": ADMIN_TOKEN, "operator": "ops", "csrf": token})
        page = ui.get(f"/ui/tasks/{behind}")
    assert page.status_code == 200
    assert "1 ahead in the queue" in page.text
