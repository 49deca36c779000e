"""Pipeline runs under ``/api/pipelines/runs``: list, read, cancel, and the decisions
of approval gates. Mounted on :data:`forgeflow.api.pipelines.router`, whose prefix,
bearer auth and shared error answers apply to every route here.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import Field
from sqlalchemy import Connection

from forgeflow.api import schemas as m
from forgeflow.api.control import ControlBody
from forgeflow.api.errors import ApiError
from forgeflow.api.inputs import MAX_INT64
from forgeflow.api.pipeline_common import CONFLICT, Change, control, missing, services
from forgeflow.pipelines import retry, runs, steps, views
from forgeflow.pipelines.kinds import NODE_ROW, RunStatus
from forgeflow.store import pipelines as q
from forgeflow.tasks import controls

router = APIRouter()


class DecisionBody(ControlBody):
    itemIndex: int | None = Field(default=None, ge=0)


@router.get("/runs", response_model=None, responses={200: m.answer(m.RunPage, "a page of runs")})
async def list_runs(
    request: Request,
    templateKey: str | None = None,
    status: RunStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_INT64)] = 0,
) -> dict[str, Any]:
    rows, total = await services(request).store.read(
        lambda c: q.list_runs(
            c,
            template_key=templateKey,
            status=status.value if status else None,
            limit=limit,
            offset=offset,
        )
    )
    return {
        "items": [views.run_json(r, state=False) for r in rows],
        "total": total,
        "limit": limit,
        "offset": offset,
        "nextOffset": offset + len(rows) if offset + len(rows) < total else None,
    }


@router.get(
    "/runs/{runId}",
    response_model=None,
    responses={200: m.answer(m.RunAnswer, "the run"), 404: missing("run_not_found")},
)
async def get_run(request: Request, runId: str) -> dict[str, Any]:
    """A run with its step states and its state bag."""

    def _read(conn: Connection) -> dict[str, Any] | None:
        row = q.get_run(conn, runId)
        return None if row is None else views.run_json(row, q.steps_of(conn, runId))

    found = await services(request).store.read(_read)
    if found is None:
        raise ApiError(404, "run_not_found", f"no run {runId}")
    return {"run": found}


@router.post(
    "/runs/{runId}/cancel",
    responses={
        200: m.answer(m.RunCancelled, "cancelled (or already finished)"),
        404: missing("run_not_found"),
        409: CONFLICT,
    },
)
async def cancel_run(request: Request, runId: str, body: ControlBody) -> JSONResponse:
    """Pending and runnable steps are skipped; running and suspended ones cancelled."""

    def _cancel(conn: Connection, req: controls.ControlRequest) -> controls.Outcome:
        row = runs.cancel_run(conn, runId, actor=req.actor, reason=req.reason)
        return 200, {"run": views.run_json(row, state=False)}

    return await control(request, body, "pipeline.run.cancel", runId, _cancel)


class RetryBody(ControlBody):
    confirmInterrupted: bool = Field(
        default=False,
        description="run again the interrupted steps declared idempotent: false",
    )


class RunRetried(m.ControlEcho):
    run: m.RunSummary
    steps: list[str] = Field(description="the steps taken back (forEach items as step#i)")


@router.post(
    "/runs/{runId}/retry",
    responses={
        200: m.answer(RunRetried, "the run runs again from its failed steps"),
        404: missing("run_not_found"),
        409: m.error(
            "run_not_retryable (not failed or cancelled), interrupted_needs_confirmation "
            "(steps names them), nothing_to_retry or request_id_conflict"
        ),
    },
)
async def retry_run(request: Request, runId: str, body: RetryBody) -> JSONResponse:
    """Run a failed or cancelled run's failed, cancelled and skipped-by-failure steps
    again; succeeded steps keep their outputs and their state-bag writes."""

    def _retry(conn: Connection, req: controls.ControlRequest) -> controls.Outcome:
        return retry.answer(conn, runId, actor=req.actor, confirm=body.confirmInterrupted)

    return await control(request, body, "pipeline.run.retry", runId, _retry)


def _decision(run_id: str, step_id: str, body: DecisionBody, approve: bool) -> Change:
    def _apply(conn: Connection, req: controls.ControlRequest) -> controls.Outcome:
        index = NODE_ROW if body.itemIndex is None else body.itemIndex
        return steps.decide(
            conn, run_id, step_id, index, approve=approve, actor=req.actor, reason=req.reason
        )

    return _apply


def _decision_route(verb: str, approve: bool, description: str) -> None:
    """``POST /runs/{runId}/steps/{stepId}/approve`` and ``…/reject``: one route each,
    the same but for the decision."""
    action = f"pipeline.step.{verb}"

    async def decide(request: Request, runId: str, stepId: str, body: DecisionBody) -> JSONResponse:
        target = f"{runId}/{stepId}/{body.itemIndex}"
        return await control(request, body, action, target, _decision(runId, stepId, body, approve))

    router.add_api_route(
        f"/runs/{{runId}}/steps/{{stepId}}/{verb}",
        decide,
        methods=["POST"],
        name=f"{verb}_step",
        description=description,
        responses={
            200: m.answer(m.Decision, "approved" if approve else "rejected"),
            404: missing("run_not_found", "step_not_found"),
            409: m.error("step_not_awaiting_approval or request_id_conflict"),
        },
    )


_decision_route(
    "approve",
    True,
    "Approve a suspended gate step (``human.gate``, ``orchestration.awaitApproval``).",
)
_decision_route("reject", False, "Reject a suspended gate step: it fails with ``gate_rejected``.")
