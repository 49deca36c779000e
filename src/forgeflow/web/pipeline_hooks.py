"""The delivery log of a pipeline webhook trigger (``/ui/pipelines/triggers/{id}``) and
the replay of an accepted call as a new run.

The replay goes through :func:`forgeflow.tasks.controls.run` with the action and target
of ``POST /api/pipelines/triggers/{id}/deliveries/{deliveryId}/replay``, so a
``requestId`` means the same thing on both.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from sqlalchemy import Connection

from forgeflow.domain.json import JsonObject
from forgeflow.pipelines import deliveries, views
from forgeflow.pipelines.runs import PipelineError
from forgeflow.store import audit
from forgeflow.tasks import controls
from forgeflow.web.actions import run_control
from forgeflow.web.contexts import Params, PipelineTriggerPage
from forgeflow.web.pages import Offset, opt, paging
from forgeflow.web.render import PAGE_SIZE, UiRoute, render, services
from forgeflow.web.security import (
    NotFound,
    Posted,
    UiSession,
    require_operator,
    require_operator_post,
)

router = APIRouter(prefix="/ui/pipelines", route_class=UiRoute, include_in_schema=False)
Session = Annotated[UiSession, Depends(require_operator)]
Post = Annotated[Posted, Depends(require_operator_post)]


@router.get("/triggers/{trigger_id}")
async def trigger_page(
    request: Request,
    session: Session,
    trigger_id: str,
    status: str | None = None,
    offset: Offset = 0,
) -> Response:
    chosen = opt(status)  # an unknown status shows every call rather than none
    params: Params = {"status": chosen if chosen in deliveries.STATUSES else None}

    def _read(conn: Connection) -> tuple[str, PipelineTriggerPage] | None:
        stamp = audit.change_marker(conn)
        try:
            data = deliveries.page_json(conn, trigger_id, params["status"], PAGE_SIZE, offset)
        except PipelineError:
            return None
        total, trigger, items = data["total"], data["trigger"], data["items"]
        assert isinstance(trigger, dict) and isinstance(items, list)  # page_json's shape
        page = PipelineTriggerPage(
            trigger=trigger,
            items=[i for i in items if isinstance(i, dict)],
            page=paging(offset, total if isinstance(total, int) else 0),
            params=params,
            statuses=list(deliveries.STATUSES),
            body_kept=deliveries.BODY_KEPT,
        )
        return stamp, page

    found = await services(request).store.read(_read)
    if found is None:
        raise NotFound(f"no webhook trigger {trigger_id}")
    stamp, page = found
    return render(request, "pipeline_trigger.html", page, session=session, stamp=stamp)


@router.post("/triggers/{trigger_id}/deliveries/{delivery_id}/replay")
async def replay(request: Request, posted: Post, trigger_id: str, delivery_id: str) -> Response:
    def _replay(conn: Connection, req: controls.ControlRequest) -> controls.Outcome:
        try:
            started = deliveries.replay(
                conn, trigger_id, delivery_id, actor=req.actor, request_id=req.request_id
            )
        except PipelineError as exc:
            return exc.status, {"error": exc.code, "message": exc.message}
        run = views.run_json(started.run, state=False)
        return 201, {"run": run, "created": started.created, "deliveryId": delivery_id}

    def _said(body: JsonObject) -> str:
        return f"Delivery {delivery_id} replayed as run {views.answer_field(body, 'run', 'runId')}."

    def _run_page(body: JsonObject) -> str | None:
        run_id = views.answer_field(body, "run", "runId")
        return f"/ui/pipelines/runs/{run_id}" if run_id else None

    action, target = "pipeline.webhook.replay", f"{trigger_id}/{delivery_id}"
    return await run_control(
        request, posted, action, target, _replay, describe=_said, goto=_run_page
    )
