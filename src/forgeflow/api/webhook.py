"""``POST /api/gitea/webhook``: the raw body goes to the ingress untouched."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

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
    """Receive a Gitea/Forgejo webhook delivery: verified, deduplicated, accepted."""
    services: Services = request.app.state.services
    try:
        source = request.client.host if request.client else "-"
        reply = await services.ingress.handle(request.headers, await request.body(), source)
    except StoreUnavailable:
        services.metrics.deliveries.labels("unavailable").inc()
        body = error_body("store_unavailable", "the database is unavailable; retry")
        return JSONResponse(body, status_code=503)
    services.metrics.deliveries.labels(reply.outcome).inc()
    return JSONResponse(reply.body, status_code=reply.status_code)
