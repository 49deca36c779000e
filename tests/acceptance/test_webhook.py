"""The webhook through Gitea's own delivery path: a mention becomes one queued task, other
comments none; a delivery is verified, deduplicated and answered with a stable code."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import httpx
from sqlalchemy import func, select

from forgeflow.store.bookkeeping_schema import audit_events
from forgeflow.store.schema import repositories, tasks, webhook_deliveries
from forgeflow_testkit.gitea_emulator import Delivery
from tests.support.forgeflow import WEBHOOK_SECRET
from tests.support.world import BOT, World


def _count(world: World, table: Any, *where: Any) -> int:
    return int(
        world.ff.services.store.db.read_sync(
            lambda c: c.execute(select(func.count()).select_from(table).where(*where)).scalar_one()
        )
    )


def _say(world: World, body: str, *, author: str = "alice", index: int | None = None) -> Delivery:
    """Posts a comment and returns ITS delivery: the newest one may be a bot's comment."""
    comment = world.gitea.post_comment(
        "acme", "widget", index or world.issue, author=author, body=body
    )
    return world.gitea.delivery_of_comment(comment["id"])


def test_mention_on_issue_creates_a_queued_task(world: World) -> None:
    d = _say(world, "@ccweb-bot please fix the flaky test")
    assert d.status_code == 202, d.response
    answer = json.loads(d.response)
    assert answer["state"] == "queued"
    assert answer["deliveryId"] == d.delivery_id
    task = world.ff.services.store.db.read_sync(
        lambda c: c.execute(select(tasks).where(tasks.c.task_id == answer["taskId"])).one()
    )
    assert task.instruction == "please fix the flaky test"
    assert task.resource_key == f"default:acme/widget:issue:{world.issue}"
    assert task.author == "alice"
    assert task.state_version == 2
    # Only the hash of the raw body is kept.
    row = world.ff.services.store.db.read_sync(
        lambda c: c.execute(select(webhook_deliveries)).one()
    )
    assert row.payload_hash == "sha256:" + hashlib.sha256(d.body).hexdigest()


def test_mention_on_pull_request_is_a_pull_request_task(world: World) -> None:
    d = _say(world, "@ccweb-bot review this", index=world.pull)
    assert d.status_code == 202, d.response
    task_id = json.loads(d.response)["taskId"]
    task = world.ff.services.store.db.read_sync(
        lambda c: c.execute(select(tasks).where(tasks.c.task_id == task_id)).one()
    )
    assert task.resource_key == f"default:acme/widget:pull_request:{world.pull}"
    # Gitea's comment payload carries no head/base; the worker reads them from the API.
    assert task.refs is None


def test_comments_that_must_not_trigger(world: World) -> None:
    g = world.gitea
    g.post_comment("acme", "widget", world.issue, author="alice", body="no mention at all")
    g.post_comment(
        "acme",
        "widget",
        world.issue,
        author="alice",
        body="`@ccweb-bot` in code and me@ccweb-bot.example",
    )
    g.post_comment("acme", "widget", world.issue, author=BOT, body="@ccweb-bot talking to myself")
    c = g.post_comment("acme", "widget", world.issue, author="alice", body="plain")
    g.edit_comment("acme", "widget", c["id"], body="@ccweb-bot edited in later")
    statuses = [(d.status_code, json.loads(d.response)) for d in g.deliveries]
    assert [s for s, _ in statuses] == [200] * 5
    assert [b["reason"] for _, b in statuses] == [
        "no_mention",
        "no_mention",
        "bot_comment",
        "no_mention",
        "action_edited",
    ]
    assert _count(world, tasks) == 0


def test_bad_signature_is_401_with_no_business_row(world: World) -> None:
    comment = world.gitea.post_comment("acme", "widget", world.issue, author="alice", body="hi")
    payload = world.gitea.comment_payload("acme", "widget", world.issue, comment, sender="alice")
    payload["comment"]["body"] = "@ccweb-bot forged"
    headers, body = world.gitea.build_delivery(
        "acme", "widget", "issue_comment", payload, secret="wrong-secret"
    )
    before = _count(world, webhook_deliveries)
    r = httpx.post(world.ff.webhook_url, content=body, headers=headers)
    assert r.status_code == 401
    assert r.json()["error"] == "invalid_signature"
    stripped = {k: v for k, v in headers.items() if "signature" not in k.lower()}
    assert httpx.post(world.ff.webhook_url, content=body, headers=stripped).status_code == 401
    assert _count(world, webhook_deliveries) == before
    assert _count(world, tasks) == 0
    # One row per source and interval: the second refusal from this address is counted
    # (its count is written when the interval is over), not written as a row of its own.
    assert _count(world, audit_events, audit_events.c.error_code == "invalid_signature") == 1


def test_each_signature_header_is_accepted(world: World) -> None:
    comment = world.gitea.post_comment("acme", "widget", world.issue, author="alice", body="hi")
    for i, flavour in enumerate(["gitea", "forgejo", "hub"]):
        payload = world.gitea.comment_payload(
            "acme",
            "widget",
            world.issue,
            {**comment, "id": comment["id"] * 1000 + i},
            sender="alice",
        )
        payload["comment"]["body"] = f"@ccweb-bot try {flavour}"
        headers, body = world.gitea.build_delivery(
            "acme",
            "widget",
            "issue_comment",
            payload,
            secret=WEBHOOK_SECRET,
            flavour="forgejo" if flavour == "forgejo" else "gitea",
        )
        if flavour == "hub":
            headers = {
                k: v
                for k, v in headers.items()
                if k.lower() not in ("x-gitea-signature", "x-gogs-signature")
            }
            headers["X-Hub-Signature-256"] = (
                "sha256=" + hmac.new(WEBHOOK_SECRET.encode(), body, hashlib.sha256).hexdigest()
            )
        r = httpx.post(world.ff.webhook_url, content=body, headers=headers)
        assert r.status_code == 202, (flavour, r.text)


def test_same_delivery_twice_returns_the_original(world: World) -> None:
    first = _say(world, "@ccweb-bot go")
    again = httpx.post(world.ff.webhook_url, content=first.body, headers=first.headers)
    assert again.status_code == 200
    body = again.json()
    assert body["status"] == "duplicate"
    assert body["taskId"] == json.loads(first.response)["taskId"]
    assert body["state"] == "queued"
    assert _count(world, tasks) == 1


def test_replay_with_a_new_delivery_id_creates_nothing(world: World) -> None:
    first = _say(world, "@ccweb-bot go")
    replay = world.gitea.redeliver(first)
    assert replay.delivery_id != first.delivery_id
    assert replay.status_code == 200
    assert json.loads(replay.response)["taskId"] == json.loads(first.response)["taskId"]
    assert _count(world, tasks) == 1
    assert _count(world, webhook_deliveries, webhook_deliveries.c.status == "duplicate") == 1


def test_incomplete_payload_is_400(world: World) -> None:
    comment = world.gitea.post_comment("acme", "widget", world.issue, author="alice", body="x")
    payload = world.gitea.comment_payload("acme", "widget", world.issue, comment, sender="alice")
    del payload["issue"]
    headers, body = world.gitea.build_delivery(
        "acme", "widget", "issue_comment", payload, secret=WEBHOOK_SECRET
    )
    r = httpx.post(world.ff.webhook_url, content=body, headers=headers)
    assert r.status_code == 400
    assert r.json() == {"error": "invalid_payload", "message": "missing field issue.number"}
    headers, body = world.gitea.build_delivery(
        "acme", "widget", "issue_comment", payload, secret=WEBHOOK_SECRET
    )
    garbage = b"{not json"
    headers["X-Gitea-Signature"] = hmac.new(
        WEBHOOK_SECRET.encode(), garbage, hashlib.sha256
    ).hexdigest()
    headers.pop("X-Hub-Signature-256", None)
    r = httpx.post(world.ff.webhook_url, content=garbage, headers=headers)
    assert r.status_code == 400 and r.json()["error"] == "invalid_payload"
    assert _count(world, tasks) == 0
    # Both refusals are in the deliveries and the audit, with their code, not their body.
    refused = _refusals(world)
    assert [(d["event_type"], d["response_code"], d["reason"]) for d in refused] == [
        ("issue_comment", 400, "invalid_payload")
    ] * 2
    assert _count(world, audit_events, audit_events.c.error_code == "invalid_payload") == 2


def _refusals(world: World) -> list[dict[str, Any]]:
    rows = world.ff.services.store.db.read_sync(
        lambda c: c.execute(
            select(webhook_deliveries).where(webhook_deliveries.c.status == "rejected")
        ).all()
    )
    return [dict(r._mapping) for r in rows]


def test_an_empty_comment_delivery_is_kept_under_its_event(world: World) -> None:
    headers, body = world.gitea.build_delivery(
        "acme", "widget", "issue_comment", {}, secret=WEBHOOK_SECRET
    )
    r = httpx.post(world.ff.webhook_url, content=body, headers=headers)
    assert r.status_code == 400
    assert r.json() == {"error": "invalid_payload", "message": "missing field action"}
    [row] = _refusals(world)
    assert row["event_type"] == "issue_comment" and row["reason"] == "invalid_payload"
    assert row["delivery_id"] == headers["X-Gitea-Delivery"]
    with world.ff.admin() as admin:
        [event] = admin.get(
            "/api/gitea-workflow/audit", params={"action": "webhook.reject"}
        ).json()["items"]
    assert event["errorCode"] == "invalid_payload"
    assert event["metadata"] == {"eventType": "issue_comment", "responseCode": 400}


def test_commenter_without_write_is_rejected(world: World) -> None:
    d = _say(world, "@ccweb-bot delete everything", author="mallory")
    assert d.status_code == 200
    answer = json.loads(d.response)
    assert answer["status"] == "rejected" and answer["reason"] == "insufficient_permission"
    assert _count(world, tasks, tasks.c.state == "rejected") == 1
    assert _count(world, tasks, tasks.c.state == "queued") == 0
    assert _count(world, audit_events, audit_events.c.error_code == "insufficient_permission") == 1


def test_first_mention_registers_the_repository_once(world: World) -> None:
    for n in range(3):
        world.gitea.post_comment(
            "acme", "widget", world.issue, author="alice", body=f"@ccweb-bot task {n}"
        )
    assert _count(world, repositories) == 1
    assert _count(world, audit_events, audit_events.c.action == "repository.register") == 1
    assert _count(world, tasks, tasks.c.state == "queued") == 3


def test_disabled_repository_is_409(world: World) -> None:
    world.gitea.post_comment("acme", "widget", world.issue, author="alice", body="@ccweb-bot one")
    with world.ff.admin() as admin:
        r = admin.post(
            "/api/gitea-workflow/repos/default:acme/widget/disable",
            json={"requestId": "r1", "reason": "maintenance"},
        )
        assert r.status_code == 200 and r.json()["status"] == "disabled"
    d = _say(world, "@ccweb-bot two")
    assert d.status_code == 409
    assert json.loads(d.response)["error"] == "repository_disabled"
    assert _count(world, tasks) == 1


def test_unconfigured_secret_is_503(gitea: Any, tmp_path: Any, sqlite_url: str) -> None:
    from tests.support.forgeflow import run_forgeflow

    with run_forgeflow(tmp_path / "ff", sqlite_url, webhook_secret=None) as ff:
        r = httpx.post(ff.webhook_url, content=b"{}", headers={"X-Gitea-Event": "issue_comment"})
        assert r.status_code == 503
        assert r.json()["error"] == "not_configured"


def test_bot_that_cannot_read_permissions_is_a_clear_503(world: World) -> None:
    world.gitea.set_permission("acme", "widget", BOT, "write")
    d = _say(world, "@ccweb-bot go")
    assert d.status_code == 503
    answer = json.loads(d.response)
    assert answer["error"] == "permission_check_forbidden"
    assert "admin" in answer["message"]
    assert _count(world, tasks) == 0
    # Recorded with its code and Gitea's delivery id; the comment's text is nowhere.
    [row] = _refusals(world)
    assert (row["response_code"], row["reason"]) == (503, "permission_check_forbidden")
    assert row["delivery_id"] == d.delivery_id and row["comment_id"] is None
    assert _count(world, audit_events, audit_events.c.error_code == "permission_check_forbidden")
    # Given admin access, Gitea's redelivery of the same delivery is handled afresh.
    world.gitea.set_permission("acme", "widget", BOT, "admin")
    again = world.gitea.redeliver(d, new_id=False)
    assert again.status_code == 202, again.response
    assert _count(world, tasks, tasks.c.state == "queued") == 1


def test_permission_is_not_needed_when_configured_so(
    gitea: Any, tmp_path: Any, sqlite_url: str
) -> None:
    from tests.support.forgeflow import run_forgeflow

    gitea.add_user("bob")
    gitea.add_repo("acme", "open", private=False)
    issue = gitea.add_issue("acme", "open", title="t", author="bob")
    with run_forgeflow(tmp_path / "ff", sqlite_url, trigger_permission="none") as ff:
        gitea.add_hook("acme", "open", url=ff.webhook_url, secret=WEBHOOK_SECRET)
        hi = gitea.post_comment("acme", "open", issue, author="bob", body="@ccweb-bot hi")
        assert gitea.delivery_of_comment(hi["id"]).status_code == 202


def test_nul_in_a_signed_comment_is_400_not_500(world: World) -> None:
    comment = world.gitea.post_comment("acme", "widget", world.issue, author="alice", body="x")
    payload = world.gitea.comment_payload("acme", "widget", world.issue, comment, sender="alice")
    payload["comment"]["body"] = "@ccweb-bot do \x00 this"
    headers, body = world.gitea.build_delivery(
        "acme", "widget", "issue_comment", payload, secret=WEBHOOK_SECRET
    )
    r = httpx.post(world.ff.webhook_url, content=body, headers=headers)
    assert r.status_code == 400
    assert r.json()["message"] == "field comment.body contains a NUL character"


def test_pull_request_comment_from_gitea_1_9_is_a_pull_request_task(world: World) -> None:
    """Gitea 1.9 sent no is_pull and no X-Gitea-Event-Type: only the issue's non-null
    pull_request says the comment is on a pull request."""
    g = world.gitea
    found = {}
    for index, kind in ((world.pull, "pull_request"), (world.issue, "issue")):
        comment = g.post_comment("acme", "widget", index, author="alice", body="no mention")
        mention = {**comment, "id": comment["id"] * 1000, "body": "@ccweb-bot look at this"}
        headers, body = g.gitea_1_9_comment_delivery(
            "acme", "widget", index, mention, sender="alice", secret=WEBHOOK_SECRET
        )
        payload = json.loads(body)
        assert "is_pull" not in payload and "pull_request" not in payload
        assert "X-Gitea-Event-Type" not in headers and headers["X-Gitea-Event"] == "issue_comment"
        meta = payload["issue"]["pull_request"]
        assert meta == ({"merged": False, "merged_at": None} if kind == "pull_request" else None)
        r = httpx.post(world.ff.webhook_url, content=body, headers=headers)
        assert r.status_code == 202, r.text
        found[kind] = r.json()["taskId"]
    for kind, task_id in found.items():
        task = world.ff.services.store.db.read_sync(
            lambda c, t=task_id: c.execute(select(tasks).where(tasks.c.task_id == t)).one()
        )
        number = world.pull if kind == "pull_request" else world.issue
        assert task.resource_key == f"default:acme/widget:{kind}:{number}"
        assert task.instruction == "look at this"
    # Gitea 1.9 put the hook's secret in every body: forgeflow keeps it nowhere.
    rows = world.ff.services.store.db.read_sync(
        lambda c: [
            *c.execute(select(tasks)).all(),
            *c.execute(select(webhook_deliveries)).all(),
            *c.execute(select(audit_events)).all(),
        ]
    )
    assert WEBHOOK_SECRET not in repr(rows)


def test_review_comment_from_gitea_1_10_to_1_19_0_is_read_as_a_review(world: World) -> None:
    """Gitea 1.10 to 1.19.0 sent a review submitted as "Comment" under the comment event
    types with a pull-request payload and no comment: read as the review it is, whose
    line comments are looked up for a mention (docs/reviews.md "Review threads"). One
    with no mention anywhere is ignored with 200 and Gitea does not mark the delivery
    failed; one whose summary mentions the bot is a task of the pull request."""
    g = world.gitea
    headers, body = g.build_delivery(
        "acme", "widget", "push", {"ref": "refs/heads/main"}, secret=WEBHOOK_SECRET
    )
    other = httpx.post(world.ff.webhook_url, content=body, headers=headers)
    assert other.status_code == 200 and other.json()["reason"] == "event_not_handled"
    for with_type in (True, False):
        headers, body = g.review_comment_delivery(
            "acme",
            "widget",
            world.pull,
            reviewer="alice",
            content="Is this right?",
            secret=WEBHOOK_SECRET,
            event_type_header=with_type,
        )
        payload = json.loads(body)
        assert payload["action"] == "reviewed" and "comment" not in payload
        event = "issue_comment" if with_type else "pull_request_comment"
        assert headers["X-Gitea-Event"] == event
        r = httpx.post(world.ff.webhook_url, content=body, headers=headers)
        assert r.status_code == 200, r.text
        expected = {**other.json(), "reason": "no_mention"}
        assert r.json() == {**expected, "deliveryId": headers["X-Gitea-Delivery"]}
    assert _count(world, tasks) == 0
    headers, body = g.review_comment_delivery(
        "acme",
        "widget",
        world.pull,
        reviewer="alice",
        content="@ccweb-bot is this right?",
        secret=WEBHOOK_SECRET,
        event_type_header=False,
    )
    r = httpx.post(world.ff.webhook_url, content=body, headers=headers)
    assert r.status_code == 202, r.text
    assert _count(world, tasks) == 1
    assert (
        _count(
            world,
            webhook_deliveries,
            webhook_deliveries.c.event_type == "pull_request_review_comment",
        )
        == 3
    )
