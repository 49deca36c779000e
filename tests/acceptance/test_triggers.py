"""Pipeline triggers through forgeflow's public surface, on real sockets.

Every one of the 16 domain event types starts a run of a template that listens to it,
each produced by a real action: a Gitea emulator delivery, a real task going through
the scheduler, a budget crossed by the scripted agent's token usage, a session closed
by ``@bot new session``. And ``POST /webhooks/{token}`` with its HMAC, dedupe and
refusals.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from forgeflow.config import Role
from forgeflow.domain.events import EVENT_TYPES, PAYLOAD_FIELDS
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.cluster import wait_for
from tests.support.forgeflow import Running, run_forgeflow
from tests.support.worker import start_worker
from tests.support.world import BOT

REPO = "default:acme/widget"


@pytest.fixture
def ff_with_gitea(
    gitea: GiteaEmulator, tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[GiteaEmulator, Running]]:
    # Turns long enough that a second mention is still queued when it is cancelled.
    for gitea_, ff in start_worker(gitea, tmp_path, db_url, monkeypatch, turn_seconds="1.5"):
        gitea_.add_user("mallory")
        gitea_.set_permission("acme", "widget", "mallory", "read")
        yield gitea_, ff


def _listener(event_type: str) -> dict[str, Any]:
    return {
        "key": f"on_{event_type}",
        "name": f"on {event_type}",
        "enabled": True,
        "nodes": [{"id": "t", "kind": "trigger"}, {"id": "end", "kind": "terminal"}],
        "edges": [{"from": "t", "to": "end"}],
        "triggers": [{"type": "event", "eventType": event_type}],
    }


def _runs(admin: httpx.Client, key: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = admin.get(
        "/api/pipelines/runs", params={"templateKey": key}
    ).json()["items"]
    return items


def _mention(gitea: GiteaEmulator, repo: str, index: int, text: str) -> dict[str, Any]:
    comment = gitea.post_comment("acme", repo, index, author="alice", body=text)
    body: dict[str, Any] = json.loads(gitea.delivery_of_comment(comment["id"]).response)
    return body


def _task_state(admin: httpx.Client, task_id: str) -> str:
    return str(admin.get(f"/api/gitea-workflow/tasks/{task_id}").json()["task"]["state"])


def test_every_domain_event_type_starts_a_run(ff_with_gitea: tuple[GiteaEmulator, Running]) -> None:
    gitea, ff = ff_with_gitea
    assert len(EVENT_TYPES) == 16
    with ff.admin() as admin:
        # The shipped templates would answer some of these events too: keep them out.
        for t in admin.get("/api/pipelines/templates").json()["items"]:
            if t["enabled"]:
                body = {"requestId": f"off-{t['key']}", "reason": "test"}
                admin.post(f"/api/pipelines/templates/{t['key']}/disable", json=body)
        for event_type in EVENT_TYPES:
            r = admin.post("/api/pipelines/templates", json=_listener(event_type))
            assert r.status_code == 201, r.text

        # Tasks: created, completed (and every status change), a repository added, a
        # budget crossed by the agent's 120 tokens, a queued one cancelled.
        issue = gitea.add_issue("acme", "widget", title="Flaky test", author="alice")
        first = _mention(gitea, "widget", issue, "@ccweb-bot fix it")["taskId"]
        second = _mention(gitea, "widget", issue, "@ccweb-bot and this")["taskId"]
        r = admin.post(
            f"/api/gitea-workflow/tasks/{second}/cancel", json={"requestId": "c1", "reason": "t"}
        )
        assert r.status_code == 200, r.text
        r = admin.put(
            f"/api/gitea-workflow/repos/{REPO}/budget",
            json={"requestId": "b1", "dailyTokens": 150, "reason": "pilot"},
        )
        assert r.status_code == 200, r.text
        wait_for(lambda: _task_state(admin, first) == "succeeded", what="task succeeded")
        _mention(gitea, "widget", issue, "@ccweb-bot new session")
        # A task that fails: gadget cannot be cloned.
        gitea.fail_next("*", r"^/acme/gadget\.git/", status=401, count=50)
        broken = gitea.add_issue("acme", "gadget", title="t", author="alice")
        failing = _mention(gitea, "gadget", broken, "@ccweb-bot go")["taskId"]
        wait_for(lambda: _task_state(admin, failing) == "failed", what="task failed")

        # Gitea: an issue assigned to the bot, a comment without a mention, a pull
        # request published, pushed to and merged, a fork's pull request, a release.
        gitea.edit_issue("acme", "widget", issue, by="alice", assignees=[BOT])
        gitea.post_comment("acme", "widget", issue, author="alice", body="just a note")
        gitea.push_branch("acme", "widget", "feature", {"f.txt": "x\n"}, base="main")
        pull = gitea.add_pull("acme", "widget", title="Feature", head="feature", author="alice")
        gitea.push_branch("acme", "widget", "feature", {"f.txt": "y\n"})
        gitea.merge_pull("acme", "widget", pull, merger="alice")
        gitea.add_repo("mallory", "widget", fork_of=("acme", "widget"))
        gitea.push_branch("mallory", "widget", "fix", {"fix.txt": "1\n"}, base="main")
        external = gitea.add_pull(
            "acme",
            "widget",
            title="Drive-by",
            head="fix",
            head_repo=("mallory", "widget"),
            author="mallory",
        )
        gitea.add_release("acme", "widget", tag="v1.0.0", author="alice")
        assert all(d.ok for d in gitea.deliveries), [d.response for d in gitea.deliveries]

        def _all_started() -> bool:
            return all(_runs(admin, f"on_{e}") for e in EVENT_TYPES)

        try:
            wait_for(_all_started, timeout=60, what="a run of every listening template")
        finally:
            missing = [e for e in EVENT_TYPES if not _runs(admin, f"on_{e}")]
            assert missing == []
        for event_type in EVENT_TYPES:
            run_id = _runs(admin, f"on_{event_type}")[0]["runId"]
            run = admin.get(f"/api/pipelines/runs/{run_id}").json()["run"]
            assert (run["triggerType"], run["eventType"]) == ("event", event_type)
            event = run["state"]["event"]
            assert set(PAYLOAD_FIELDS[event_type]) <= set(event), (event_type, event)
            if event_type not in ("SessionClosed",):
                assert event["repoKey"] in (REPO, "default:acme/gadget"), event
        external_runs = _runs(admin, "on_ExternalPrDetected")
        assert len(external_runs) == 1
        detail = admin.get(f"/api/pipelines/runs/{external_runs[0]['runId']}").json()["run"]
        assert detail["state"]["event"]["number"] == external
        assert detail["state"]["event"]["headRepo"] == "mallory/widget"
        published = [
            admin.get(f"/api/pipelines/runs/{r['runId']}").json()["run"]["state"]["event"]
            for r in _runs(admin, "on_PullRequestPublished")
        ]
        assert sorted((e["number"], e["fork"]) for e in published) == [
            (pull, False),
            (external, True),
        ]
        merged = _runs(admin, "on_PrMerged")
        assert len(merged) == 1
        comments = [
            admin.get(f"/api/pipelines/runs/{r['runId']}").json()["run"]["state"]["event"]
            for r in _runs(admin, "on_CommentCreated")
        ]
        # Three mentions, one "new session", one note; never the bot's own replies.
        assert all(c["author"] == "alice" for c in comments)
        assert sorted(c["mentionsBot"] for c in comments) == [False, True, True, True, True]

        # A redelivered Gitea delivery emits nothing again.
        before = len(_runs(admin, "on_ReleasePublished"))
        release = next(d for d in gitea.deliveries if d.event_type == "release")
        again = httpx.post(ff.webhook_url, content=release.body, headers=release.headers)
        assert again.status_code == 200 and again.json()["status"] == "duplicate"
        assert len(_runs(admin, "on_ReleasePublished")) == before == 1


# -- POST /webhooks/{token} ---------------------------------------------------------------------

HOOKED = {
    "key": "hooked",
    "name": "Started from outside",
    "enabled": True,
    "inputs": [{"name": "ticket", "type": "integer", "required": True}],
    "nodes": [{"id": "t", "kind": "trigger"}, {"id": "end", "kind": "terminal"}],
    "edges": [{"from": "t", "to": "end"}],
    "triggers": [{"type": "webhook"}, {"type": "manual"}],
}


@pytest.fixture
def ff(tmp_path: Path, db_url: str) -> Iterator[Running]:
    with run_forgeflow(tmp_path / "ff", db_url, role=Role.ALL, poll_seconds=0.2) as running:
        yield running


def _sign(token: str, body: bytes) -> dict[str, str]:
    digest = hmac.new(token.encode(), body, hashlib.sha256).hexdigest()
    return {"X-Hub-Signature-256": f"sha256={digest}", "Content-Type": "application/json"}


def test_webhook_trigger_over_http(ff: Running) -> None:
    with ff.admin() as admin:
        created = admin.post("/api/pipelines/templates", json=HOOKED).json()["template"]
        hook = next(t for t in created["triggers"] if t["type"] == "webhook")
        path = hook["webhookPath"]
        token = path.removeprefix("/webhooks/")
        url = ff.url + path
        body = json.dumps({"ticket": 42, "source": "ci"}).encode()

        r = httpx.post(url, content=body, headers={**_sign(token, body), "Idempotency-Key": "a"})
        assert r.status_code == 202, r.text
        run_id = r.json()["runId"]
        assert r.json() == {
            "runId": run_id,
            "templateKey": "hooked",
            "status": "started",
            "deliveryId": r.json()["deliveryId"],
        }
        run = admin.get(f"/api/pipelines/runs/{run_id}").json()["run"]
        assert run["triggerType"] == "webhook" and run["inputs"] == {"ticket": 42}
        assert run["state"]["event"]["source"] == "ci"

        again = httpx.post(
            url, content=body, headers={**_sign(token, body), "Idempotency-Key": "a"}
        )
        assert (again.status_code, again.json()["runId"], again.json()["status"]) == (
            200,
            run_id,
            "duplicate",
        )
        # No delivery header: the body itself identifies the call.
        other = json.dumps({"inputs": {"ticket": 7}}).encode()
        first = httpx.post(url, content=other, headers=_sign(token, other))
        repeat = httpx.post(url, content=other, headers=_sign(token, other))
        assert (first.status_code, repeat.status_code) == (202, 200)
        assert first.json()["runId"] == repeat.json()["runId"] != run_id

        bad = httpx.post(
            url, content=body, headers={**_sign("wrong", body), "Idempotency-Key": "b"}
        )
        assert (bad.status_code, bad.json()["error"]) == (401, "invalid_signature")
        unsigned = httpx.post(url, content=body)
        assert unsigned.status_code == 401
        unknown = httpx.post(ff.url + "/webhooks/nope", content=body, headers=_sign("nope", body))
        assert (unknown.status_code, unknown.json()["error"]) == (404, "trigger_not_found")
        invalid = json.dumps({"ticket": "many"}).encode()
        r = httpx.post(url, content=invalid, headers=_sign(token, invalid))
        assert (r.status_code, r.json()["error"]) == (400, "invalid_inputs")
        r = httpx.post(url, content=b"[1]", headers=_sign(token, b"[1]"))
        assert (r.status_code, r.json()["error"]) == (400, "invalid_payload")

        rejected = admin.get(
            "/api/gitea-workflow/audit", params={"action": "pipeline.webhook.reject"}
        ).json()["items"]
        # One row per reason and source (the trigger) per interval: the second unverified
        # call is counted, and its count written when the interval is over.
        assert len(rejected) == 1
        assert rejected[0]["errorCode"] == "invalid_signature"
        assert rejected[0]["metadata"]["source"] == hook["triggerId"]
        assert token not in json.dumps(rejected)

        admin.post("/api/pipelines/templates/hooked/disable", json={"requestId": "d1"})
        fresh = json.dumps({"ticket": 1}).encode()
        r = httpx.post(url, content=fresh, headers=_sign(token, fresh))
        assert (r.status_code, r.json()["error"]) == (409, "template_disabled")
        # A repeat of a call that already started its run still answers with it.
        r = httpx.post(url, content=body, headers={**_sign(token, body), "Idempotency-Key": "a"})
        assert (r.status_code, r.json()["runId"]) == (200, run_id)
        # A manual start of the disabled template refuses just as clearly.
        r = admin.post(
            "/api/pipelines/templates/hooked/runs",
            json={"requestId": "m1", "inputs": {"ticket": 1}},
        )
        assert (r.status_code, r.json()["error"]) == (409, "template_disabled")

        admin.post("/api/pipelines/templates/hooked/enable", json={"requestId": "e1"})
        r = admin.post(
            f"/api/pipelines/templates/hooked/triggers/{hook['triggerId']}/disable",
            json={"requestId": "td1"},
        )
        assert r.status_code == 200, r.text
        r = httpx.post(url, content=fresh, headers=_sign(token, fresh))
        assert (r.status_code, r.json()["error"]) == (409, "trigger_disabled")

        spec = httpx.get(ff.url + "/openapi.json").json()["paths"]["/webhooks/{token}"]["post"]
        assert {"200", "202", "400", "401", "404", "409", "413"} <= set(spec["responses"])
        assert any(p["name"] == "x-hub-signature-256" for p in spec["parameters"])


def test_schedule_triggers_are_switched_on_through_the_api(ff: Running) -> None:
    doc = {
        **HOOKED,
        "key": "sweep",
        "inputs": [],
        "triggers": [{"type": "schedule", "schedule": "every:1", "enabled": False}],
    }
    with ff.admin() as admin:
        template = admin.post("/api/pipelines/templates", json=doc).json()["template"]
        (trigger,) = template["triggers"]
        assert (trigger["enabled"], trigger["nextFireAt"]) == (False, None)
        r = admin.post(
            f"/api/pipelines/templates/sweep/triggers/{trigger['triggerId']}/enable",
            json={"requestId": "on"},
        )
        assert r.status_code == 200 and r.json()["triggers"][0]["enabled"] is True
        wait_for(lambda: len(_runs(admin, "sweep")) >= 2, timeout=15, what="two scheduled runs")
        r = admin.post(
            f"/api/pipelines/templates/sweep/triggers/{trigger['triggerId']}/disable",
            json={"requestId": "off"},
        )
        assert r.json()["triggers"][0]["nextFireAt"] is None
        r = admin.post(
            "/api/pipelines/templates/sweep/triggers/trg-none/enable", json={"requestId": "x"}
        )
        assert (r.status_code, r.json()["error"]) == (404, "trigger_not_found")


def test_a_replayed_trigger_call_starts_nothing(ff: Running) -> None:
    """The same body and signature under new delivery headers is the first call's
    duplicate; a timestamped call outside the clock tolerance is refused; timestamped
    calls with identical bodies at different times are distinct calls."""
    with ff.admin() as admin:
        created = admin.post("/api/pipelines/templates", json=HOOKED).json()["template"]
        hook = next(t for t in created["triggers"] if t["type"] == "webhook")
        token = hook["webhookPath"].removeprefix("/webhooks/")
        url = ff.url + hook["webhookPath"]
        body = json.dumps({"ticket": 5}).encode()
        first = httpx.post(
            url, content=body, headers={**_sign(token, body), "X-Gitea-Delivery": "1"}
        )
        assert first.status_code == 202, first.text
        for header in ("X-Gitea-Delivery", "X-GitHub-Delivery", "Idempotency-Key"):
            replay = httpx.post(url, content=body, headers={**_sign(token, body), header: "new"})
            assert (replay.status_code, replay.json()["status"]) == (200, "duplicate")
            assert replay.json()["runId"] == first.json()["runId"]

        def stamped(at: int) -> dict[str, str]:
            signed = f"{at}.".encode() + body
            return {**_sign(token, signed), "X-Forgeflow-Timestamp": str(at)}

        now = int(time.time())
        stale = httpx.post(url, content=body, headers=stamped(now - 3600))
        assert (stale.status_code, stale.json()["error"]) == (401, "stale_timestamp")
        a = httpx.post(url, content=body, headers=stamped(now))
        b = httpx.post(url, content=body, headers=stamped(now + 1))
        assert (a.status_code, b.status_code) == (202, 202)
        assert len({a.json()["runId"], b.json()["runId"], first.json()["runId"]}) == 3
        again = httpx.post(url, content=body, headers={**stamped(now), "Idempotency-Key": "x"})
        assert (again.status_code, again.json()["runId"]) == (200, a.json()["runId"])
        # The timestamp is signed: moving it breaks the signature.
        moved = {**stamped(now), "X-Forgeflow-Timestamp": str(now + 2)}
        assert httpx.post(url, content=body, headers=moved).status_code == 401
