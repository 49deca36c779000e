"""The delivery log of pipeline webhook triggers under
``/api/pipelines/triggers/{triggerId}/deliveries``: a page of calls, one call with its
kept body, and the replay of an accepted one as a new run. Mounted on
:data:`forgeflow.api.pipelines.router` (its prefix, bearer auth and error answers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy import Connection

from forgeflow.api import schemas as m
from forgeflow.api.control import ControlBody
from forgeflow.api.errors import ApiError
from forgeflow.api.inputs import MAX_INT64
from forgeflow.api.pipeline_common import control, missing, services
from forgeflow.pipelines import deliveries, views
from forgeflow.pipelines.runs import PipelineError
from forgeflow.tasks import controls

router = APIRouter()


class Delivery(BaseModel):
    deliveryId: str
    triggerId: str
    templateKey: str
    receivedAt: str
    status: Literal["accepted", "duplicate", "refused"]
    reason: str | None = Field(description="the refusal's error code; duplicate_delivery")
    responseCode: int
    callKey: str | None = Field(description="the call's delivery header (or body hash)")
    runId: str | None = Field(description="the run started (accepted) or found (duplicate)")
    bodyBytes: int
    replayable: bool
    expiresAt: str


class DeliveryPage(BaseModel):
    trigger: dict[str, Any]
    items: list[Delivery]
    total: int
    limit: int
    offset: int
    nextOffset: int | None


class DeliveryAnswer(BaseModel):
    delivery: dict[str, Any] = Field(description="a Delivery with its kept body")


class Replayed(m.ControlEcho):
    run: m.RunSummary
    created: bool
    deliveryId: str


_PATH = "/triggers/{triggerId}/deliveries"


async def _read(request: Request, fn: Callable[[Connection], dict[str, Any]]) -> dict[str, Any]:
    try:
        return await services(request).store.read(fn)
    except PipelineError as exc:
        raise ApiError(exc.status, exc.code, exc.message) from None


@router.get(
    _PATH,
    response_model=None,
    responses={
        200: m.answer(DeliveryPage, "a page of the trigger's calls, newest first"),
        404: missing("trigger_not_found"),
    },
)
async def list_deliveries(
    request: Request,
    triggerId: str,
    status: Literal["accepted", "duplicate", "refused"] | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_INT64)] = 0,
) -> dict[str, Any]:
    """Every call of a webhook trigger: accepted, duplicate or refused (with its reason)."""
    return await _read(request, lambda c: deliveries.page_json(c, triggerId, status, limit, offset))


@router.get(
    _PATH + "/{deliveryId}",
    response_model=None,
    responses={
        200: m.answer(DeliveryAnswer, "the call, with its body when it was kept"),
        404: missing("trigger_not_found", "delivery_not_found"),
    },
)
async def get_delivery(request: Request, triggerId: str, deliveryId: str) -> dict[str, Any]:
    """One call; an accepted call's body is kept up to 256 KiB, a refused one's never."""

    def _one(conn: Connection) -> dict[str, Any]:
        deliveries.webhook_trigger(conn, triggerId)
        row = deliveries.get_delivery(conn, triggerId, deliveryId)
        return {"delivery": deliveries.delivery_json(row)}

    return await _read(request, _one)


@router.post(
    _PATH + "/{deliveryId}/replay",
    responses={
        201: m.answer(Replayed, "a new run from the delivery's body"),
        404: missing("trigger_not_found", "delivery_not_found", "template_not_found"),
        409: m.error(
            "delivery_not_replayable, delivery_body_not_kept, trigger_disabled, "
            "template_disabled or request_id_conflict"
        ),
    },
    status_code=201,
)
async def replay_delivery(
    request: Request, triggerId: str, deliveryId: str, body: ControlBody
) -> JSONResponse:
    """Start a new run from an accepted call's body; one run per ``requestId``."""

    def _replay(conn: Connection, req: controls.ControlRequest) -> controls.Outcome:
        started = deliveries.replay(
            conn, triggerId, deliveryId, actor=req.actor, request_id=req.request_id
        )
        run = views.run_json(started.run, state=False)
        return 201, {"run": run, "created": started.created, "deliveryId": deliveryId}

    target = f"{triggerId}/{deliveryId}"
    return await control(request, body, "pipeline.webhook.replay", target, _replay)
