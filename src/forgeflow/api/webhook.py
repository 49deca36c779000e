"""``POST /api/gitea/webhook``: the raw body goes to the ingress untouched."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from forgeflow.services import Services

router = APIRouter()


@router.post(
    "/api/gitea/webhook",
    status_code=202,
    responses={
        200: {"description": "duplicate or ignored delivery"},
        400: {"description": "invalid_payload"},
        401: {"description": "invalid_signature"},
        409: {"description": "repository_disabled"},
        503: {"description": "not_configured, gitea_unavailable or store_unavailable"},
    },
    tags=["webhook"],
)
async def gitea_webhook(request: Request) -> JSONResponse:
    """Receive a Gitea/Forgejo webhook delivery (ARCHITECTURE §6.1)."""
    services: Services = request.app.state.services
    body = await request.body()
    reply = await services.ingress.handle(request.headers, body)
    services.metrics.deliveries.labels(reply.outcome).inc()
    return JSONResponse(reply.body, status_code=reply.status_code)
