"""AC-10 (API side) and AC-11: control flags, idempotent requests, 409s and the audit."""

from __future__ import annotations

import json

import httpx

from tests.support.world import World


def _mention(world: World, text: str = "@ccweb-bot go", index: int | None = None) -> str:
    comment = world.gitea.post_comment(
        "acme", "widget", index or world.issue, author="alice", body=text
    )
    d = world.gitea.delivery_of_comment(comment["id"])
    assert d.status_code == 202, d.response
    task_id: str = json.loads(d.response)["taskId"]
    return task_id


def test_every_control_route_needs_the_token(world: World) -> None:
    url = world.ff.url + "/api/gitea-workflow"
    allowed = world.ff.settings.auth_failures_allowed
    attempts = 0
    for method, path in [
        ("GET", "/overview"),
        ("GET", "/tasks"),
        ("GET", "/audit"),
        ("POST", "/control/pause"),
        ("POST", "/tasks/x/cancel"),
    ]:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
            r = httpx.request(method, url + path, headers=headers, json={"requestId": "a"})
            attempts += 1
            # Past the allowance of failures per address, attempts are refused unchecked.
            expected = (401, "unauthorized") if attempts <= allowed else (429, "too_many_attempts")
            assert (r.status_code, r.json()["error"]) == expected, (method, path, headers)


def test_pause_resume_is_idempotent_and_records_the_operator(world: World) -> None:
    with world.ff.admin() as admin:
        r = admin.post(
            "/api/gitea-workflow/control/pause",
            json={"requestId": "p-1", "reason": "upgrade", "operator": "alice"},
        )
        assert r.status_code == 200
        assert r.json()["globalPaused"] is True and r.json()["operator"] == "admin:alice"
        again = admin.post(
            "/api/gitea-workflow/control/pause",
            json={"requestId": "p-1", "reason": "upgrade", "operator": "alice"},
        )
        assert again.status_code == 200 and again.json()["replayed"] is True
        assert again.json()["version"] == r.json()["version"]
        ov = admin.get("/api/gitea-workflow/overview").json()
        assert ov["globalPaused"] is True and ov["pauseReason"] == "upgrade"
        conflict = admin.post("/api/gitea-workflow/control/resume", json={"requestId": "p-1"})
        assert conflict.status_code == 409 and conflict.json()["error"] == "request_id_conflict"
        admin.post("/api/gitea-workflow/control/resume", json={"requestId": "p-2"})
        assert admin.get("/api/gitea-workflow/overview").json()["globalPaused"] is False
        events = admin.get("/api/gitea-workflow/audit", params={"action": "control.pause"}).json()
        assert [e["actor"] for e in events["items"]] == ["admin:alice"]


def test_control_body_is_validated(world: World) -> None:
    with world.ff.admin() as admin:
        r = admin.post("/api/gitea-workflow/control/pause", json={"reason": "x"})
        assert r.status_code == 400
        assert r.json()["error"] == "invalid_request" and "requestId" in r.json()["message"]
        r = admin.get("/api/gitea-workflow/tasks", params={"state": "exploded"})
        assert r.status_code == 400 and "state" in r.json()["message"]


def test_cancel_queued_then_409_for_terminal(world: World) -> None:
    task_id = _mention(world)
    with world.ff.admin() as admin:
        r = admin.post(
            f"/api/gitea-workflow/tasks/{task_id}/cancel",
            json={"requestId": "c-1", "reason": "not needed"},
        )
        assert r.status_code == 200
        assert r.json()["state"] == "cancelled" and r.json()["changed"] is True
        again = admin.post(f"/api/gitea-workflow/tasks/{task_id}/cancel", json={"requestId": "c-2"})
        assert again.status_code == 200 and again.json()["changed"] is False
        abort = admin.post(f"/api/gitea-workflow/tasks/{task_id}/abort", json={"requestId": "a-1"})
        assert abort.status_code == 409
        assert abort.json()["error"] == "invalid_state" and abort.json()["state"] == "cancelled"
        missing = admin.post("/api/gitea-workflow/tasks/nope/cancel", json={"requestId": "c-3"})
        assert missing.status_code == 404


def test_abort_of_a_queued_task_is_409_with_its_state(world: World) -> None:
    task_id = _mention(world)
    with world.ff.admin() as admin:
        r = admin.post(f"/api/gitea-workflow/tasks/{task_id}/abort", json={"requestId": "a-9"})
        assert r.status_code == 409 and r.json()["state"] == "queued"


def test_task_list_filters_and_pages(world: World) -> None:
    ids = [_mention(world, f"@ccweb-bot n{i}") for i in range(3)]
    pr_task = _mention(world, "@ccweb-bot pr", index=world.pull)
    with world.ff.admin() as admin:
        page = admin.get("/api/gitea-workflow/tasks", params={"limit": 2}).json()
        assert page["total"] == 4 and len(page["items"]) == 2 and page["nextOffset"] == 2
        rest = admin.get("/api/gitea-workflow/tasks", params={"limit": 2, "offset": 2}).json()
        assert rest["nextOffset"] is None
        seen = {t["taskId"] for t in page["items"] + rest["items"]}
        assert seen == {*ids, pr_task}
        by_resource = admin.get(
            "/api/gitea-workflow/tasks",
            params={"resourceKey": f"default:acme/widget:pull_request:{world.pull}"},
        ).json()
        assert [t["taskId"] for t in by_resource["items"]] == [pr_task]
        by_repo = admin.get(
            "/api/gitea-workflow/tasks",
            params={"repoKey": "default:acme/widget", "state": "queued"},
        ).json()
        assert by_repo["total"] == 4


def test_task_detail_and_audit_chain(world: World) -> None:  # AC-11
    task_id = _mention(world)
    delivery_id = next(
        d.delivery_id for d in world.gitea.deliveries if f'"{task_id}"' in d.response
    )
    with world.ff.admin() as admin:
        detail = admin.get(f"/api/gitea-workflow/tasks/{task_id}").json()
        assert detail["task"]["state"] == "queued"
        assert detail["turns"] == [] and detail["comments"] == []
        accept = [e for e in detail["audit"] if e["action"] == "webhook.accept"]
        assert len(accept) == 1
        e = accept[0]
        assert (e["fromState"], e["toState"], e["deliveryId"]) == (
            "received",
            "queued",
            delivery_id,
        )
        assert e["actor"] == "gitea:user:alice" and e["commentId"] is not None
        for key in (
            "eventId",
            "taskId",
            "sessionKey",
            "actor",
            "action",
            "fromState",
            "toState",
            "deliveryId",
            "turnId",
            "commentId",
            "errorCode",
            "timestamp",
        ):
            assert key in e
        session = detail["task"]["sessionKey"]
        by_session = admin.get("/api/gitea-workflow/audit", params={"sessionKey": session}).json()
        assert {x["eventId"] for x in by_session["items"]} >= {e["eventId"]}
        by_repo = admin.get(
            "/api/gitea-workflow/audit", params={"repoKey": "default:acme/widget"}
        ).json()
        assert any(x["action"] == "repository.register" for x in by_repo["items"])
        future = admin.get(
            "/api/gitea-workflow/audit", params={"taskId": task_id, "since": "2999-01-01T00:00:00Z"}
        ).json()
        assert future["items"] == []
        past = admin.get(
            "/api/gitea-workflow/audit", params={"taskId": task_id, "until": "2000-01-01T00:00:00Z"}
        ).json()
        assert past["items"] == []
        jsonl = admin.get(
            "/api/gitea-workflow/audit", params={"taskId": task_id, "format": "jsonl"}
        )
        lines = [json.loads(x) for x in jsonl.text.splitlines()]
        assert [x["eventId"] for x in lines] == [x["eventId"] for x in detail["audit"]]
        bad = admin.get("/api/gitea-workflow/audit", params={"since": "yesterday"})
        assert bad.status_code == 400


def test_operations_endpoints(world: World) -> None:
    _mention(world)
    assert httpx.get(world.ff.url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(world.ff.url + "/readyz")
    assert ready.status_code == 200 and ready.json()["migrations"] is True
    metrics = httpx.get(world.ff.url + "/metrics").text
    assert 'forgeflow_webhook_deliveries_total{status="accepted"} 1.0' in metrics
    assert 'forgeflow_tasks{state="queued"} 1.0' in metrics
    assert "forgeflow_http_request_duration_seconds_bucket" in metrics
    assert httpx.get(world.ff.url + "/openapi.json").json()["info"]["title"] == "forgeflow"
