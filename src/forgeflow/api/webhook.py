"""``POST /api/gitea/webhook``: the raw body goes to the ingress untouched.

The route is declared on FastAPI (OpenAPI, and any request the fast path below does not
take), but the server answers it through :class:`WebhookFastPath`, a pure ASGI layer in
front of FastAPI: it is the one route every mention takes, and FastAPI's routing,
middleware and dependency solving cost about as much CPU per delivery as the ingress's
own work (docs/BENCHMARKS.md, "Ingest").
"""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from forgeflow.api.errors import error_body
from forgeflow.api.schemas import WebhookReply, answer, error
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
    """Receive a Gitea/Forgejo webhook delivery (ARCHITECTURE §6.1)."""
    status, body = await _answer(request.app.state.services, request.headers, await request.body())
    return JSONResponse(body, status_code=status)


async def _answer(services: Services, headers: Headers, body: bytes) -> tuple[int, Any]:
    try:
        reply = await services.ingress.handle(headers, body)
    except StoreUnavailable:
        services.metrics.deliveries.labels("unavailable").inc()
        return 503, error_body("store_unavailable", "the database is unavailable; retry")
    services.metrics.deliveries.labels(reply.outcome).inc()
    return reply.status_code, reply.body


class WebhookFastPath:
    """Answers ``POST /api/gitea/webhook`` itself, hands everything else to ``app``."""

    def __init__(self, app: ASGIApp, services: Services) -> None:
        self.app = app
        self.services = services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the sender is gone: nothing was read, nothing is done
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        status, answer_body = await _answer(self.services, Headers(scope=scope), b"".join(chunks))
        payload = json.dumps(answer_body, ensure_ascii=False, separators=(",", ":")).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
        self.services.metrics.request_latency.labels("POST", PATH, str(status)).observe(
            time.perf_counter() - start
        )
