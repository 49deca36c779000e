"""``POST /webhooks/{token}``: an external system starts a pipeline run (spec PIPELINES
"Điều gì khởi chạy một lần chạy", trigger type webhook).

The token names one webhook trigger row and is also the HMAC key: the request carries
``X-Hub-Signature-256: sha256=<hex>`` = HMAC-SHA256(raw body, token). An unknown token
is 404; a missing or wrong signature 401, logged and audited by trigger id (never the
token) and not recorded anywhere it could be replayed from. A call is identified by
``X-Gitea-Delivery``, ``X-GitHub-Delivery`` or ``Idempotency-Key`` (else by the hash of
its body): a repeat answers 200 with the run the first call started. Every call that
names a trigger is logged (:mod:`forgeflow.pipelines.deliveries`). The JSON object
body is the run's ``event``; its ``inputs`` object (or its top-level values named like
the template's inputs) are the run's inputs.

Replays: the delivery headers are not signed, so a call is also identified by the
digest of what is signed; an accepted call blocks the same signed content for
``trigger_replay_window_seconds``. A sender that can add ``X-Forgeflow-Timestamp: <unix
seconds>`` signs ``<timestamp>.<body>`` instead of the body, and a call whose timestamp
is more than ``trigger_timestamp_tolerance_seconds`` away from now is refused
(401 ``stale_timestamp``): identical bodies sent at different times then stay distinct
calls, and a captured call is useless after the tolerance (docs/pipelines.md).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from dataclasses import replace
from datetime import timedelta
from typing import Annotated, Any, Literal

import structlog
from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import Connection

from forgeflow.gitea.webhook import InvalidPayload, parse_json
from forgeflow.pipelines import deliveries
from forgeflow.pipelines.runs import PipelineError
from forgeflow.rejections import Rejection
from forgeflow.services import Services
from forgeflow.store import triggers as tq

log = structlog.get_logger("forgeflow.api.hooks")
router = APIRouter(tags=["webhook"])

TIMESTAMP = "x-forgeflow-timestamp"
# Tokens are minted by ``secrets.token_urlsafe``; anything else cannot name a trigger
# (and a NUL or an overlong value never reaches the database).
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,100}$")


class WebhookRun(BaseModel):
    runId: str
    templateKey: str
    status: Literal["started", "duplicate"]
    deliveryId: str


class WebhookError(BaseModel):
    error: str
    message: str


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": code, "message": message}, status_code=status)


def signed_content(body: bytes, timestamp: str | None) -> bytes:
    """What the signature covers: the body, or ``<timestamp>.<body>`` when timestamped."""
    return body if timestamp is None else timestamp.encode("ascii") + b"." + body


def signature_valid(token: str, body: bytes, header: str | None) -> bool:
    """``sha256=<hex>`` of HMAC-SHA256(body, token), compared in constant time."""
    if not header or not header.startswith("sha256="):
        return False
    expected = hmac.new(token.encode("utf-8"), body, hashlib.sha256).hexdigest()
    given = header.removeprefix("sha256=").strip().lower().encode("utf-8", "replace")
    return hmac.compare_digest(given, expected.encode("ascii"))  # bytes: non-ASCII is wrong


def _delivery(request: Request, body: bytes | None) -> str | None:
    """The identity of a call: its delivery header, else (``body`` given: a verified
    call) the hash of what it signed."""
    for name in ("x-gitea-delivery", "x-github-delivery", "idempotency-key"):
        value = request.headers.get(name, "").strip()
        if value:
            return f"{name}:{value}"
    return None if body is None else f"body:{hashlib.sha256(body).hexdigest()}"


_ERR = {"model": WebhookError}


@router.post(
    "/webhooks/{token}",
    status_code=202,
    response_model=WebhookRun,
    responses={
        200: {"model": WebhookRun, "description": "a repeated call: the run the first one started"},
        202: {"model": WebhookRun, "description": "the run was started"},
        400: {**_ERR, "description": "invalid_payload or invalid_inputs"},
        401: {**_ERR, "description": "invalid_signature or stale_timestamp"},
        404: {**_ERR, "description": "trigger_not_found"},
        409: {**_ERR, "description": "template_disabled, trigger_disabled or no_start_node"},
        413: {**_ERR, "description": "payload_too_large"},
        503: {**_ERR, "description": "store_unavailable"},
    },
    openapi_extra={
        "requestBody": {
            "required": False,
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    },
)
async def pipeline_webhook(
    request: Request,
    token: str,
    x_hub_signature_256: Annotated[
        str | None, Header(description="sha256=<hex>: HMAC-SHA256 of the body, keyed by the token")
    ] = None,
    idempotency_key: Annotated[
        str | None, Header(description="identifies a call; repeats start nothing")
    ] = None,
) -> Any:
    """Start a run of the template whose webhook trigger this token names."""
    services: Services = request.app.state.services
    trigger = (
        await services.store.read(lambda c: tq.by_token(c, token)) if _TOKEN.match(token) else None
    )
    if trigger is None:
        return _error(404, "trigger_not_found", "no webhook trigger has this token")
    body = await request.body()
    settings = services.settings
    retention = timedelta(days=settings.delivery_retention_days)
    # A refused call is logged by the caller's delivery header only, never its body.
    call = deliveries.Call(
        trigger,
        retention,
        len(body),
        _delivery(request, None),
        replay_window=timedelta(seconds=settings.trigger_replay_window_seconds),
    )
    limit = settings.trigger_max_body_bytes
    if len(body) > limit:  # the bounds middleware refuses it first; kept for direct use
        message = f"a webhook body is at most {limit} bytes"
        return await _refuse(services, call, 413, "payload_too_large", message)
    stamp = request.headers.get(TIMESTAMP)
    if stamp is not None and not _fresh(stamp, settings.trigger_timestamp_tolerance_seconds):
        message = f"{TIMESTAMP} is not unix seconds within the allowed clock skew of now"
        return await _refuse(services, call, 401, "stale_timestamp", message, "stale")
    signed = signed_content(body, stamp)
    if not signature_valid(token, signed, x_hub_signature_256):
        log.warning("pipeline.webhook.invalid_signature", trigger_id=trigger.trigger_id)
        reason = "missing" if not x_hub_signature_256 else "mismatch"
        message = "X-Hub-Signature-256 missing or invalid"
        return await _refuse(services, call, 401, "invalid_signature", message, reason)
    try:
        payload: dict[str, Any] = parse_json(body) if body.strip() else {}
    except InvalidPayload as exc:
        return await _refuse(services, call, 400, "invalid_payload", str(exc))
    call = replace(call, body_digest=hashlib.sha256(signed).hexdigest())
    return await _fire(services, call, _delivery(request, signed), payload)


def _fresh(stamp: str, tolerance: int) -> bool:
    """A timestamp header of unix seconds within ``tolerance`` of now."""
    if not stamp.isascii() or not stamp.isdigit() or len(stamp) > 12:
        return False
    return abs(time.time() - int(stamp)) <= tolerance


async def _refuse(
    services: Services,
    call: deliveries.Call,
    status: int,
    code: str,
    message: str,
    signature: str | None = None,
    extra: dict[str, Any] | None = None,
) -> JSONResponse:
    """Answer a refused call and log it; the answer does not depend on the log's write."""

    if signature is not None:  # an unverified call: audited one row per interval, counted
        source = str(call.trigger.trigger_id)
        await services.rejections.record(Rejection("pipeline.webhook.reject", code, source))

    def _log(conn: Connection) -> None:
        deliveries.record(conn, call, "refused", status, reason=code)

    try:
        await services.store.write(_log)
    except Exception:
        log.exception("pipeline.webhook.log_failed", trigger_id=call.trigger.trigger_id)
    return JSONResponse({"error": code, "message": message, **(extra or {})}, status_code=status)


async def _fire(
    services: Services, call: deliveries.Call, key: str | None, payload: dict[str, Any]
) -> JSONResponse:
    """Start the run of a verified call; ``key`` identifies it (a refusal is still
    logged by ``call``'s header-only key)."""
    trigger_id = call.trigger.trigger_id
    verified = replace(call, call_key=key)
    try:
        started, delivery_id = await services.store.write(
            lambda c: deliveries.fire(c, verified, payload)
        )
    except PipelineError as exc:
        log.info("pipeline.webhook.refused", trigger_id=trigger_id, code=exc.code)
        return await _refuse(services, call, exc.status, exc.code, exc.message, extra=exc.extra)
    if started.created and services.pipelines is not None:
        services.pipelines.wake()
    run = started.run
    log.info("pipeline.webhook", trigger_id=trigger_id, run_id=run.run_id, created=started.created)
    answer = WebhookRun(
        runId=run.run_id,
        templateKey=run.template_key,
        status="started" if started.created else "duplicate",
        deliveryId=delivery_id,
    )
    return JSONResponse(answer.model_dump(), status_code=202 if started.created else 200)
