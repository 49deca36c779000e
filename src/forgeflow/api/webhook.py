"""``POST /api/gitea/webhook``: the raw body goes to the ingress untouched, and the
ingress's outcome (domain/intake.py) comes back as the status code and body of the
spec (docs/api.md), here and only here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from forgeflow.api.errors import error_body
from forgeflow.api.schemas import WebhookReply, answer, error
from forgeflow.domain.intake import (
    BadSignature,
    DeliveryRecord,
    NoSecret,
    Outcome,
    Recorded,
    Refused,
)
from forgeflow.services import Services
from forgeflow.store import StoreUnavailable

PATH = "/api/gitea/webhook"
router = APIRouter()


@router.post(
    PATH,
    status_code=202,
    response_model=None,
    responses={
        200: answer(WebhookReply, "duplicate, ignored, rejected or a comment command"),
        202: answer(WebhookReply, "a new mention was accepted: {deliveryId, taskId, state}"),
        400: error("invalid_payload"),
        401: error("invalid_signature"),
        409: error("repository_disabled"),
        503: error(
            "not_configured, permission_check_forbidden, gitea_unavailable or store_unavailable"
        ),
    },
    # The raw body is read and verified by the ingress; declared so clients see it.
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    },
    tags=["webhook"],
)
async def gitea_webhook(request: Request) -> JSONResponse:
    """Receive a Gitea/Forgejo webhook delivery: verified, deduplicated, accepted."""
    services: Services = request.app.state.services
    try:
        source = request.client.host if request.client else "-"
        outcome = await services.ingress.handle(request.headers, await request.body(), source)
    except StoreUnavailable:
        services.metrics.deliveries.labels("unavailable").inc()
        body = error_body("store_unavailable", "the database is unavailable; retry")
        return JSONResponse(body, status_code=503)
    reply = reply_to(outcome)
    if isinstance(outcome, Refused):
        await services.ingress.record_refusal(outcome, reply.status_code)
    services.metrics.deliveries.labels(reply.label).inc()
    return JSONResponse(reply.body, status_code=reply.status_code)


@dataclass(frozen=True, slots=True)
class Reply:
    status_code: int
    body: dict[str, Any]
    label: str  # metrics: accepted|command|duplicate|ignored|rejected|invalid|unauthorized|…


def reply_to(outcome: Outcome) -> Reply:
    """The answer to an outcome: Gitea retries a 5xx, never a 4xx or a 2xx."""
    match outcome:
        case NoSecret():
            body = error_body("not_configured", "FORGEFLOW_WEBHOOK_SECRET is not set")
            return Reply(503, body, "not_configured")
        case BadSignature():
            body = error_body("invalid_signature", "signature missing or invalid")
            return Reply(401, body, "unauthorized")
        case Refused(kind=kind, code=code, message=message):
            return Reply(400 if kind == "invalid" else 503, error_body(code, message), kind)
        case Recorded(record=record):
            return _recorded(record, command=outcome.is_command)


def _recorded(r: DeliveryRecord, *, command: bool) -> Reply:
    if r.duplicate:
        body: dict[str, Any] = {
            "deliveryId": r.delivery_id,
            "status": "duplicate",
            "taskId": r.task_id,
            "state": r.task_state,
        }
        if r.status != "duplicate":
            body["originalStatus"] = r.status
        if r.reason:
            body["reason"] = r.reason
        return Reply(200, body, "duplicate")
    if command:
        body = {
            "deliveryId": r.delivery_id,
            "status": "accepted",
            "reason": r.reason,
            "taskId": r.task_id,
            "state": r.task_state,
        }
        return Reply(200, body, "command")
    if r.status == "accepted":
        body = {"deliveryId": r.delivery_id, "taskId": r.task_id, "state": r.task_state}
        return Reply(202, body, "accepted")
    if r.status == "rejected" and r.reason == "repository_disabled":
        body = {
            "error": "repository_disabled",
            "deliveryId": r.delivery_id,
            "message": "the repository is disabled by an administrator",
        }
        return Reply(409, body, "rejected")
    body = {"deliveryId": r.delivery_id, "status": r.status, "reason": r.reason}
    if r.task_id:
        body.update(taskId=r.task_id, state=r.task_state)
    return Reply(200, body, r.status)
