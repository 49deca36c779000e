"""The intake's outcomes as HTTP (api/webhook.py): the spec's codes and bodies, from
outcomes alone (the acceptance tests send real deliveries through the same map)."""

from __future__ import annotations

from forgeflow.api.webhook import reply_to
from forgeflow.domain.intake import (
    BadSignature,
    DeliveryRecord,
    NoSecret,
    Recorded,
    Refused,
)


def _refused(kind: str, code: str) -> Refused:
    return Refused(kind, code, "why", "d1", "issue_comment", "sha256:x")  # type: ignore[arg-type]


def test_refusals_and_the_door() -> None:
    assert (reply_to(NoSecret()).status_code, reply_to(NoSecret()).body) == (
        503,
        {"error": "not_configured", "message": "FORGEFLOW_WEBHOOK_SECRET is not set"},
    )
    bad = reply_to(BadSignature())
    assert (bad.status_code, bad.label) == (401, "unauthorized")
    assert bad.body == {"error": "invalid_signature", "message": "signature missing or invalid"}
    invalid = reply_to(_refused("invalid", "invalid_payload"))
    assert (invalid.status_code, invalid.label) == (400, "invalid")
    assert invalid.body == {"error": "invalid_payload", "message": "why"}
    for kind, code in (("unavailable", "gitea_unavailable"), ("not_configured", "not_configured")):
        reply = reply_to(_refused(kind, code))
        assert (reply.status_code, reply.label, reply.body["error"]) == (503, kind, code)


def test_recorded_deliveries() -> None:
    new = reply_to(Recorded(DeliveryRecord("d1", "accepted", 202, "t1", "queued")))
    assert (new.status_code, new.label) == (202, "accepted")
    assert new.body == {"deliveryId": "d1", "taskId": "t1", "state": "queued"}
    command = reply_to(
        Recorded(DeliveryRecord("d2", "accepted", 200, "t1", "running", "command_status"))
    )
    assert (command.status_code, command.label) == (200, "command")
    assert command.body == {
        "deliveryId": "d2",
        "status": "accepted",
        "reason": "command_status",
        "taskId": "t1",
        "state": "running",
    }
    repeat = reply_to(
        Recorded(DeliveryRecord("d1", "accepted", 202, "t1", "queued", duplicate=True))
    )
    assert (repeat.status_code, repeat.label) == (200, "duplicate")
    assert repeat.body == {
        "deliveryId": "d1",
        "status": "duplicate",
        "taskId": "t1",
        "state": "queued",
        "originalStatus": "accepted",
    }
    disabled = reply_to(
        Recorded(DeliveryRecord("d3", "rejected", 409, reason="repository_disabled"))
    )
    assert disabled.status_code == 409 and disabled.body["error"] == "repository_disabled"
    refused = reply_to(
        Recorded(DeliveryRecord("d4", "rejected", 200, "t4", "rejected", "budget_exceeded"))
    )
    assert (refused.status_code, refused.label) == (200, "rejected")
    assert refused.body == {
        "deliveryId": "d4",
        "status": "rejected",
        "reason": "budget_exceeded",
        "taskId": "t4",
        "state": "rejected",
    }
