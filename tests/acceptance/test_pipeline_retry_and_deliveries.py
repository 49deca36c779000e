"""Through the real HTTP API: retrying a failed run (only its failed steps run again,
once per requestId, interrupted ``idempotent: false`` steps need a confirmation), and
the delivery log of a pipeline webhook trigger with the replay of an accepted call."""

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
from tests.support.forgeflow import Running, run_forgeflow
from tests.support.pipelines import fails_once


@pytest.fixture
def ff(tmp_path: Path, db_url: str) -> Iterator[Running]:
    with run_forgeflow(tmp_path / "ff", db_url, role=Role.ALL, poll_seconds=0.2) as running:
        yield running


def _finished(admin: httpx.Client, run_id: str, timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run: dict[str, Any] = admin.get(f"/api/pipelines/runs/{run_id}").json()["run"]
        if run["status"] != "running":
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} still running")


def _wait_suspended(admin: httpx.Client, run_id: str, step: str) -> None:
    deadline = time.monotonic() + 15
    while True:
        run = admin.get(f"/api/pipelines/runs/{run_id}").json()["run"]
        if _steps(run)[step]["status"] == "suspended":
            return
        assert time.monotonic() < deadline, f"{step} never suspended"
        time.sleep(0.1)


def _steps(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["stepId"]: s for s in run["steps"] if s["itemIndex"] is None}


FLAKY: dict[str, Any] = {
    "key": "flaky_once",
    "name": "Fails once",
    "enabled": True,
    "nodes": [
        {"id": "t", "kind": "trigger"},
        *fails_once(),
        {"id": "end", "kind": "terminal"},
    ],
    "edges": [
        {"from": "t", "to": "count"},
        {"from": "count", "to": "shaky"},
        {"from": "shaky", "to": "end"},
    ],
    "triggers": [{"type": "manual"}],
}


def test_retry_a_failed_run_over_http(ff: Running) -> None:
    with ff.admin() as admin:
        assert admin.post("/api/pipelines/templates", json=FLAKY).status_code == 201
        started = admin.post("/api/pipelines/templates/flaky_once/runs", json={"requestId": "s1"})
        run_id = started.json()["run"]["runId"]
        failed = _finished(admin, run_id)
        assert (failed["status"], failed["errorCode"]) == ("failed", "script_failed")
        counted = failed["state"]["counted"]
        assert counted["stdout"].strip() == "1"

        body = {"requestId": "r1", "operator": "alice", "reason": "flake"}
        r = admin.post(f"/api/pipelines/runs/{run_id}/retry", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["steps"] == ["shaky", "end"]
        assert r.json()["run"]["status"] == "running"
        again = admin.post(f"/api/pipelines/runs/{run_id}/retry", json=body)
        assert again.status_code == 200 and again.json()["replayed"] is True

        done = _finished(admin, run_id)
        assert done["status"] == "succeeded", done["error"]
        steps = _steps(done)
        assert steps["count"]["attempt"] == 1 and steps["shaky"]["attempt"] == 2
        # The succeeded step did not run again: its output and write are the first ones.
        assert done["state"]["counted"] == counted
        assert done["state"]["shaky"]["stdout"].strip() == "fine"

        r = admin.post(f"/api/pipelines/runs/{run_id}/retry", json={"requestId": "r2"})
        assert (r.status_code, r.json()["error"]) == (409, "run_not_retryable")
        assert "succeeded" in r.json()["message"]
        r = admin.post("/api/pipelines/runs/run-nope/retry", json={"requestId": "r3"})
        assert (r.status_code, r.json()["error"]) == (404, "run_not_found")
        r = admin.post(f"/api/pipelines/runs/{run_id}/cancel", json={"requestId": "r1"})
        assert (r.status_code, r.json()["error"]) == (409, "request_id_conflict")

        audit = admin.get(
            "/api/gitea-workflow/audit", params={"action": "pipeline.run.retry"}
        ).json()["items"]
        assert len(audit) == 1
        assert audit[0]["actor"] == "admin:alice"
        assert audit[0]["metadata"]["steps"] == ["shaky", "end"]


GATED: dict[str, Any] = {
    "key": "gated_once",
    "name": "A gate that must not run twice unasked",
    "enabled": True,
    "nodes": [
        {"id": "t", "kind": "trigger"},
        {"id": "gate", "kind": "listen", "bodyKey": "human.gate", "extras": {"idempotent": False}},
        {"id": "end", "kind": "terminal"},
    ],
    "edges": [{"from": "t", "to": "gate"}, {"from": "gate", "to": "end"}],
    "triggers": [{"type": "manual"}],
}


def test_an_interrupted_non_idempotent_step_needs_confirm_interrupted(ff: Running) -> None:
    with ff.admin() as admin:
        assert admin.post("/api/pipelines/templates", json=GATED).status_code == 201
        r = admin.post("/api/pipelines/templates/gated_once/runs", json={"requestId": "g1"})
        run_id = r.json()["run"]["runId"]
        _wait_suspended(admin, run_id, "gate")
        r = admin.post(f"/api/pipelines/runs/{run_id}/cancel", json={"requestId": "c1"})
        assert r.json()["run"]["status"] == "cancelled"

        r = admin.post(f"/api/pipelines/runs/{run_id}/retry", json={"requestId": "n1"})
        assert r.status_code == 409
        assert (r.json()["error"], r.json()["steps"]) == (
            "interrupted_needs_confirmation",
            ["gate"],
        )
        assert admin.get(f"/api/pipelines/runs/{run_id}").json()["run"]["status"] == "cancelled"
        r = admin.post(
            f"/api/pipelines/runs/{run_id}/retry",
            json={"requestId": "n2", "confirmInterrupted": True},
        )
        assert r.status_code == 200, r.text
        _wait_suspended(admin, run_id, "gate")
        r = admin.post(f"/api/pipelines/runs/{run_id}/steps/gate/approve", json={"requestId": "a1"})
        assert r.status_code == 200, r.text
        assert _finished(admin, run_id)["status"] == "succeeded"


HOOKED: dict[str, Any] = {
    "key": "hooked_log",
    "name": "Started from outside",
    "enabled": True,
    "inputs": [{"name": "ticket", "type": "integer", "required": True}],
    "nodes": [{"id": "t", "kind": "trigger"}, {"id": "end", "kind": "terminal"}],
    "edges": [{"from": "t", "to": "end"}],
    "triggers": [{"type": "webhook"}],
}


def _sign(token: str, body: bytes) -> dict[str, str]:
    digest = hmac.new(token.encode(), body, hashlib.sha256).hexdigest()
    return {"X-Hub-Signature-256": f"sha256={digest}", "Content-Type": "application/json"}


def _five_calls(ff: Running, admin: httpx.Client) -> tuple[str, str, dict[str, Any]]:
    """Accepted, duplicate, then refused three ways (an oversize body is refused by the
    bounds middleware before its token is looked up, so it is not logged): the log's
    URL, the token and the first call's answer."""
    created = admin.post("/api/pipelines/templates", json=HOOKED).json()["template"]
    hook = created["triggers"][0]
    token = hook["webhookPath"].removeprefix("/webhooks/")
    url = ff.url + hook["webhookPath"]
    good = json.dumps({"ticket": 42, "note": "from ci"}).encode()
    secret_body = json.dumps({"ticket": 1, "canary": "refused-body-canary"}).encode()
    headers = {**_sign(token, good), "X-Gitea-Delivery": "d1"}
    first = httpx.post(url, content=good, headers=headers)
    assert first.status_code == 202
    assert httpx.post(url, content=good, headers=headers).status_code == 200
    bad = httpx.post(url, content=secret_body, headers={**_sign("wrong", secret_body)})
    assert bad.status_code == 401
    wrong = json.dumps({"ticket": "many", "canary": "refused-body-canary"}).encode()
    assert httpx.post(url, content=wrong, headers=_sign(token, wrong)).status_code == 400
    huge = b"{" + b" " * (1024 * 1024) + b"}"
    too_large = httpx.post(url, content=huge, headers=_sign(token, huge))
    assert (too_large.status_code, too_large.json()["error"]) == (413, "payload_too_large")
    return f"/api/pipelines/triggers/{hook['triggerId']}/deliveries", token, first.json()


def test_every_call_is_logged_without_its_secrets(ff: Running) -> None:
    with ff.admin() as admin:
        base, token, first = _five_calls(ff, admin)
        page = admin.get(base).json()
        assert page["total"] == 4 and page["trigger"]["templateKey"] == "hooked_log"
        got = [(d["status"], d["reason"], d["responseCode"]) for d in page["items"]]
        assert got == [
            ("refused", "invalid_inputs", 400),
            ("refused", "invalid_signature", 401),
            ("duplicate", "duplicate_delivery", 200),
            ("accepted", None, 202),
        ]
        accepted = page["items"][-1]
        assert accepted["runId"] == first["runId"] == page["items"][-2]["runId"]
        assert accepted["deliveryId"] == first["deliveryId"]
        assert accepted["callKey"] == "x-gitea-delivery:d1" and accepted["replayable"]
        text = json.dumps(page)
        for leaked in (token, "sha256=", "refused-body-canary"):
            assert leaked not in text
        for d in page["items"][:2]:
            one = admin.get(f"{base}/{d['deliveryId']}").json()["delivery"]
            assert one["body"] is None and not one["replayable"]
            assert "refused-body-canary" not in json.dumps(one)
        one = admin.get(f"{base}/{accepted['deliveryId']}").json()["delivery"]
        assert one["body"] == {"ticket": 42, "note": "from ci"}

        paged = admin.get(base, params={"limit": 1, "offset": 1, "status": "refused"}).json()
        assert (paged["total"], len(paged["items"]), paged["nextOffset"]) == (2, 1, None)
        assert admin.get(base, params={"limit": 2}).json()["nextOffset"] == 2
        r = admin.get("/api/pipelines/triggers/nope/deliveries")
        assert (r.status_code, r.json()["error"]) == (404, "trigger_not_found")


def test_an_accepted_delivery_is_replayed_once_per_request_id(ff: Running) -> None:
    with ff.admin() as admin:
        base, _, first = _five_calls(ff, admin)
        items = admin.get(base).json()["items"]
        replay = f"{base}/{first['deliveryId']}/replay"
        r = admin.post(replay, json={"requestId": "p1", "operator": "bob"})
        assert r.status_code == 201, r.text
        new_run = r.json()["run"]["runId"]
        assert new_run != first["runId"]
        again = admin.post(replay, json={"requestId": "p1", "operator": "bob"})
        assert again.json()["run"]["runId"] == new_run and again.json()["replayed"] is True
        other = admin.post(replay, json={"requestId": "p2"}).json()["run"]["runId"]
        assert other not in (new_run, first["runId"])
        run = _finished(admin, new_run)
        assert run["inputs"] == {"ticket": 42} and run["state"]["event"]["note"] == "from ci"
        assert run["createdBy"] == "admin:bob"

        r = admin.post(f"{base}/{items[0]['deliveryId']}/replay", json={"requestId": "p3"})
        assert (r.status_code, r.json()["error"]) == (409, "delivery_not_replayable")
        r = admin.post(f"{base}/dlv-nope/replay", json={"requestId": "p4"})
        assert (r.status_code, r.json()["error"]) == (404, "delivery_not_found")
        audit = admin.get(
            "/api/gitea-workflow/audit", params={"action": "pipeline.webhook.replay"}
        ).json()["items"]
        assert [(e["actor"], e["metadata"]["runId"]) for e in audit] == [
            ("admin:bob", new_run),
            ("admin:admin", other),
        ]
