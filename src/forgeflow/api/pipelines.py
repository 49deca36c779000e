"""Pipeline templates and runs under ``/api/pipelines`` (DESIGN "Pipelines"), bearer auth.

Definitions are accepted as YAML (``Content-Type: application/yaml`` or ``text/yaml``)
or JSON. Control requests carry ``{"requestId", "reason", "operator"}``; a repeated
``requestId`` returns the first answer and does nothing again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy import Connection

from forgeflow.api import schemas as m
from forgeflow.api.auth import require_admin
from forgeflow.api.control import ControlBody
from forgeflow.api.errors import ApiError
from forgeflow.api.inputs import MAX_INT64, Text, no_nul_parameters
from forgeflow.pipelines import runs, steps, templates, views
from forgeflow.pipelines.definition import (
    DefinitionError,
    Loaded,
    load_definition,
    parse_document,
)
from forgeflow.pipelines.kinds import NODE_ROW, RunStatus
from forgeflow.pipelines.runs import PipelineError
from forgeflow.services import Services
from forgeflow.store import audit
from forgeflow.store import pipeline_templates as tpl
from forgeflow.store import pipelines as q
from forgeflow.store import triggers as tq
from forgeflow.tasks import controls

router = APIRouter(
    prefix="/api/pipelines",
    dependencies=[Depends(require_admin), Depends(no_nul_parameters)],
    tags=["pipelines"],
    responses=m.ADMIN_ERRORS,
)

# The answers each route adds to ADMIN_ERRORS (docs/api.md, docs/pipelines.md).
_CONFLICT = m.error("request_id_conflict: the requestId was used for another action")
_DOC_ERRORS: m.Responses = {
    400: m.error("invalid_definition (errors lists the problems), key_mismatch"),
    409: m.error("template_exists, stale_version"),
    413: m.error("document_too_large: a definition is at most 1 MiB"),
}


def _missing(*codes: str) -> dict[str, Any]:
    return m.error(f"{', '.join(codes)}, or {m.UNMATCHED}")


def _switched(what: str, *codes: str) -> m.Responses:
    return {
        200: m.answer(m.TemplateSwitchAnswer, f"the template {what}, with its triggers"),
        404: _missing(*codes),
        409: _CONFLICT,
    }


MAX_DOCUMENT = 1024 * 1024
_YAML_TYPES = ("application/yaml", "text/yaml", "application/x-yaml", "text/x-yaml")
_DOCUMENT = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "application/yaml": {"schema": {"type": "string"}},
            "text/yaml": {"schema": {"type": "string"}},
        },
    }
}


class RunBody(BaseModel):
    requestId: Text = Field(min_length=1, max_length=200)
    inputs: dict[str, Any] = Field(default_factory=dict)
    reason: Text | None = Field(default=None, max_length=2000)
    operator: str | None = Field(
        default=None, min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.@-]+$"
    )


class DecisionBody(ControlBody):
    itemIndex: int | None = Field(default=None, ge=0)


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def _bodies(request: Request) -> frozenset[str] | None:
    engine = _services(request).pipelines
    return engine.registry.keys() if engine is not None else None


def _wake(request: Request) -> None:
    engine = _services(request).pipelines
    if engine is not None:
        engine.wake()


def _error(exc: PipelineError) -> controls.Outcome:
    return exc.status, {"error": exc.code, "message": exc.message, **exc.extra}


async def _document(request: Request) -> Loaded:
    raw = await request.body()
    if len(raw) > MAX_DOCUMENT:
        raise ApiError(413, "document_too_large", "a definition is at most 1 MiB")
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    try:
        data = parse_document(raw, yaml_format=media in _YAML_TYPES)
        return load_definition(data, bodies=_bodies(request))
    except DefinitionError as exc:
        raise ApiError(400, exc.code, str(exc), errors=exc.errors) from None


async def _control(
    request: Request,
    body: ControlBody | RunBody,
    action: str,
    target: str,
    fn: Callable[[Connection, controls.ControlRequest], controls.Outcome],
) -> JSONResponse:
    req = controls.ControlRequest(body.requestId, body.operator or "admin", body.reason)

    def _guarded(conn: Connection, r: controls.ControlRequest) -> controls.Outcome:
        try:
            return fn(conn, r)
        except PipelineError as exc:
            return _error(exc)

    status, payload = await _services(request).store.write(
        lambda c: controls.run(c, req, action, target, _guarded)
    )
    _wake(request)
    return JSONResponse(payload, status_code=status)


async def _write(request: Request, fn: Callable[[Connection], Any]) -> Any:
    try:
        return await _services(request).store.write(fn)
    except PipelineError as exc:
        raise ApiError(exc.status, exc.code, exc.message, **exc.extra) from None


# -- templates --------------------------------------------------------------------------


@router.get(
    "/templates", response_model=None, responses={200: m.answer(m.TemplateList, "templates")}
)
async def list_templates(request: Request) -> dict[str, Any]:
    def _read(conn: Connection) -> list[dict[str, Any]]:
        return [
            views.template_json(row, tpl.list_triggers(conn, row["key"]), full=False)
            for row in tpl.list_definitions(conn)
        ]

    return {"items": await _services(request).store.read(_read)}


@router.post(
    "/templates",
    status_code=201,
    openapi_extra=_DOCUMENT,
    responses={201: m.answer(m.TemplateAnswer, "created, with load warnings"), **_DOC_ERRORS},
)
async def create_template(request: Request) -> JSONResponse:
    """Create a template from a YAML or JSON definition; load warnings come back."""
    loaded = await _document(request)
    row = await _write(request, lambda c: templates.create(c, loaded, actor="admin"))
    triggers = await _services(request).store.read(lambda c: tpl.list_triggers(c, row["key"]))
    body = {"template": views.template_json(row, triggers), "warnings": loaded.warnings}
    return JSONResponse(body, status_code=201)


@router.get(
    "/templates/{key}",
    response_model=None,
    responses={
        200: m.answer(m.TemplateAnswer, "the template"),
        404: _missing("template_not_found"),
    },
)
async def get_template(request: Request, key: str) -> dict[str, Any]:
    def _read(conn: Connection) -> tuple[Any, list[Any]] | None:
        row = tpl.get_definition(conn, key)
        return None if row is None else (row, tpl.list_triggers(conn, key))

    found = await _services(request).store.read(_read)
    if found is None:
        raise ApiError(404, "template_not_found", f"no pipeline template {key}")
    row, triggers = found
    try:
        warnings = load_definition(row["definition"], bodies=_bodies(request)).warnings
    except DefinitionError as exc:  # stored by an older version with other rules
        warnings = exc.errors
    return {"template": views.template_json(row, triggers), "warnings": warnings}


@router.put(
    "/templates/{key}",
    openapi_extra=_DOCUMENT,
    responses={
        200: m.answer(m.TemplateAnswer, "replaced"),
        201: m.answer(m.TemplateAnswer, "created"),
        404: m.error(m.UNMATCHED),
        **_DOC_ERRORS,
    },
)
async def put_template(request: Request, key: str) -> JSONResponse:
    """Replace a template's definition (creating it when missing). The enable switch
    is kept unless the document says ``enabled``."""
    loaded = await _document(request)
    explicit = "enabled" in loaded.definition.model_fields_set

    def _put(conn: Connection) -> tuple[int, Any]:
        if tpl.get_definition(conn, key) is None:
            if loaded.definition.key != key:
                raise PipelineError(
                    "key_mismatch", f"the document's key is not {key!r}", status=400
                )
            return 201, templates.create(conn, loaded, actor="admin")
        enabled = loaded.definition.enabled if explicit else None
        return 200, templates.replace(conn, key, loaded, actor="admin", enabled=enabled)

    status, row = await _write(request, _put)
    triggers = await _services(request).store.read(lambda c: tpl.list_triggers(c, key))
    body = {"template": views.template_json(row, triggers), "warnings": loaded.warnings}
    return JSONResponse(body, status_code=status)


def _switch(key: str, enabled: bool) -> Callable[[Connection, controls.ControlRequest], Any]:
    def _apply(conn: Connection, req: controls.ControlRequest) -> controls.Outcome:
        row = templates.set_enabled(conn, key, enabled, actor=req.actor)
        return 200, views.template_json(row, tpl.list_triggers(conn, key))

    return _apply


@router.post("/templates/{key}/enable", responses=_switched("enabled", "template_not_found"))
async def enable_template(request: Request, key: str, body: ControlBody) -> JSONResponse:
    return await _control(request, body, "pipeline.template.enable", key, _switch(key, True))


@router.post("/templates/{key}/disable", responses=_switched("disabled", "template_not_found"))
async def disable_template(request: Request, key: str, body: ControlBody) -> JSONResponse:
    """Refuse new runs of the template; runs under way go on."""
    return await _control(request, body, "pipeline.template.disable", key, _switch(key, False))


def _trigger_switch(
    key: str, trigger_id: str, enabled: bool
) -> Callable[[Connection, controls.ControlRequest], Any]:
    def _apply(conn: Connection, req: controls.ControlRequest) -> controls.Outcome:
        templates.require(conn, key)
        row = tq.get(conn, trigger_id)
        if row is None or row["template_key"] != key:
            raise PipelineError(
                "trigger_not_found", f"template {key} has no trigger {trigger_id}", status=404
            )
        if tq.set_enabled(conn, trigger_id, enabled):
            audit.append(
                conn,
                audit.AuditEvent(
                    action=f"pipeline.trigger.{'enable' if enabled else 'disable'}",
                    actor=req.actor,
                    metadata={"templateKey": key, "triggerId": trigger_id},
                ),
            )
        return 200, views.template_json(templates.require(conn, key), tpl.list_triggers(conn, key))

    return _apply


@router.post(
    "/templates/{key}/triggers/{triggerId}/enable",
    responses=_switched("", "template_not_found", "trigger_not_found"),
)
async def enable_trigger(
    request: Request, key: str, triggerId: str, body: ControlBody
) -> JSONResponse:
    """Switch one trigger on (a schedule then counts from now). The template stays the
    switch: a trigger of a disabled template still starts nothing."""
    fn = _trigger_switch(key, triggerId, True)
    response = await _control(request, body, "pipeline.trigger.enable", f"{key}/{triggerId}", fn)
    _wake_triggers(request)
    return response


@router.post(
    "/templates/{key}/triggers/{triggerId}/disable",
    responses=_switched("", "template_not_found", "trigger_not_found"),
)
async def disable_trigger(
    request: Request, key: str, triggerId: str, body: ControlBody
) -> JSONResponse:
    """Switch one trigger off; a schedule forgets its next fire time."""
    fn = _trigger_switch(key, triggerId, False)
    response = await _control(request, body, "pipeline.trigger.disable", f"{key}/{triggerId}", fn)
    _wake_triggers(request)
    return response


def _wake_triggers(request: Request) -> None:
    loops = _services(request).triggers
    if loops is not None:
        loops.wake()


@router.post(
    "/templates/{key}/runs",
    status_code=201,
    responses={
        201: m.answer(m.RunStarted, "started (created: false when this requestId started it)"),
        400: m.error("invalid_inputs (errors lists them) or invalid_request"),
        404: _missing("template_not_found"),
        409: m.error("template_disabled, manual_trigger_missing or request_id_conflict"),
    },
)
async def start_run(request: Request, key: str, body: RunBody) -> JSONResponse:
    """Manual start: inputs are checked against the template's declared inputs."""

    def _start(conn: Connection, req: controls.ControlRequest) -> controls.Outcome:
        templates.require(conn, key)
        if not templates.has_manual_trigger(conn, key):
            raise PipelineError(
                "manual_trigger_missing",
                f"template {key} has no enabled manual trigger; it cannot be run by hand",
            )
        started = templates.start(
            conn,
            key,
            trigger_type="manual",
            inputs=body.inputs,
            dedupe_key=f"request:{body.requestId}",
            actor=req.actor,
        )
        return 201, {"run": views.run_json(started.run), "created": started.created}

    return await _control(request, body, "pipeline.run.start", key, _start)


# -- runs -------------------------------------------------------------------------------


@router.get("/runs", response_model=None, responses={200: m.answer(m.RunPage, "a page of runs")})
async def list_runs(
    request: Request,
    templateKey: str | None = None,
    status: RunStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_INT64)] = 0,
) -> dict[str, Any]:
    rows, total = await _services(request).store.read(
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
    responses={200: m.answer(m.RunAnswer, "the run"), 404: _missing("run_not_found")},
)
async def get_run(request: Request, runId: str) -> dict[str, Any]:
    """A run with its step states and its state bag."""

    def _read(conn: Connection) -> dict[str, Any] | None:
        row = q.get_run(conn, runId)
        return None if row is None else views.run_json(row, q.steps_of(conn, runId))

    found = await _services(request).store.read(_read)
    if found is None:
        raise ApiError(404, "run_not_found", f"no run {runId}")
    return {"run": found}


@router.post(
    "/runs/{runId}/cancel",
    responses={
        200: m.answer(m.RunCancelled, "cancelled (or already finished)"),
        404: _missing("run_not_found"),
        409: _CONFLICT,
    },
)
async def cancel_run(request: Request, runId: str, body: ControlBody) -> JSONResponse:
    """Pending and runnable steps are skipped; running and suspended ones cancelled."""

    def _cancel(conn: Connection, req: controls.ControlRequest) -> controls.Outcome:
        row = runs.cancel_run(conn, runId, actor=req.actor, reason=req.reason)
        return 200, {"run": views.run_json(row, state=False)}

    return await _control(request, body, "pipeline.run.cancel", runId, _cancel)


def _decision(run_id: str, step_id: str, body: DecisionBody, approve: bool) -> Any:
    def _apply(conn: Connection, req: controls.ControlRequest) -> controls.Outcome:
        index = NODE_ROW if body.itemIndex is None else body.itemIndex
        return steps.decide(
            conn, run_id, step_id, index, approve=approve, actor=req.actor, reason=req.reason
        )

    return _apply


@router.post(
    "/runs/{runId}/steps/{stepId}/approve",
    responses={
        200: m.answer(m.Decision, "approved"),
        404: _missing("run_not_found", "step_not_found"),
        409: m.error("step_not_awaiting_approval or request_id_conflict"),
    },
)
async def approve_step(
    request: Request, runId: str, stepId: str, body: DecisionBody
) -> JSONResponse:
    """Approve a suspended gate step (``human.gate``, ``orchestration.awaitApproval``)."""
    target = f"{runId}/{stepId}/{body.itemIndex}"
    fn = _decision(runId, stepId, body, True)
    return await _control(request, body, "pipeline.step.approve", target, fn)


@router.post(
    "/runs/{runId}/steps/{stepId}/reject",
    responses={
        200: m.answer(m.Decision, "rejected"),
        404: _missing("run_not_found", "step_not_found"),
        409: m.error("step_not_awaiting_approval or request_id_conflict"),
    },
)
async def reject_step(
    request: Request, runId: str, stepId: str, body: DecisionBody
) -> JSONResponse:
    """Reject a suspended gate step: it fails with ``gate_rejected``."""
    target = f"{runId}/{stepId}/{body.itemIndex}"
    fn = _decision(runId, stepId, body, False)
    return await _control(request, body, "pipeline.step.reject", target, fn)
