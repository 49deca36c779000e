"""Pipeline templates and runs under ``/api/pipelines``, bearer auth. The routes of
templates and their triggers are here, those of runs in :mod:`forgeflow.api.pipeline_runs`.

Definitions are accepted as YAML (``Content-Type: application/yaml`` or ``text/yaml``)
or JSON. Control requests carry ``{"requestId", "reason", "operator"}``; a repeated
``requestId`` returns the first answer and does nothing again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy import Connection

from forgeflow.api import pipeline_hooks, pipeline_runs
from forgeflow.api import schemas as m
from forgeflow.api.auth import require_admin
from forgeflow.api.control import ControlBody
from forgeflow.api.errors import ApiError
from forgeflow.api.inputs import Text, no_nul_parameters
from forgeflow.api.pipeline_common import CONFLICT, bodies, control, missing, services, write
from forgeflow.domain.pipeline_records import PipelineTemplate, PipelineTrigger
from forgeflow.pipelines import templates, views
from forgeflow.pipelines.definition import (
    DefinitionError,
    Loaded,
    load_definition,
    parse_document,
)
from forgeflow.pipelines.runs import PipelineError
from forgeflow.store import audit
from forgeflow.store import pipeline_templates as tpl
from forgeflow.store import triggers as tq
from forgeflow.tasks import controls

router = APIRouter(
    prefix="/api/pipelines",
    dependencies=[Depends(require_admin), Depends(no_nul_parameters)],
    tags=["pipelines"],
    responses=m.ADMIN_ERRORS,
)

_DOC_ERRORS: m.Responses = {
    400: m.error("invalid_definition (errors lists the problems), key_mismatch"),
    409: m.error("template_exists, stale_version"),
    413: m.error("document_too_large: a definition is at most 1 MiB"),
}


def _switched(what: str, *codes: str) -> m.Responses:
    return {
        200: m.answer(m.TemplateSwitchAnswer, f"the template {what}, with its triggers"),
        404: missing(*codes),
        409: CONFLICT,
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


async def _document(request: Request) -> Loaded:
    raw = await request.body()
    if len(raw) > MAX_DOCUMENT:
        raise ApiError(413, "document_too_large", "a definition is at most 1 MiB")
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    try:
        data = parse_document(raw, yaml_format=media in _YAML_TYPES)
        return load_definition(data, bodies=bodies(request))
    except DefinitionError as exc:
        raise ApiError(400, exc.code, str(exc), errors=exc.errors) from None


# -- templates --------------------------------------------------------------------------


@router.get(
    "/templates", response_model=None, responses={200: m.answer(m.TemplateList, "templates")}
)
async def list_templates(request: Request) -> dict[str, Any]:
    def _read(conn: Connection) -> list[dict[str, Any]]:
        return [
            views.template_json(row, tpl.list_triggers(conn, row.key), full=False)
            for row in tpl.list_definitions(conn)
        ]

    return {"items": await services(request).store.read(_read)}


@router.post(
    "/templates",
    status_code=201,
    openapi_extra=_DOCUMENT,
    responses={201: m.answer(m.TemplateAnswer, "created, with load warnings"), **_DOC_ERRORS},
)
async def create_template(request: Request) -> JSONResponse:
    """Create a template from a YAML or JSON definition; load warnings come back."""
    loaded = await _document(request)
    row = await write(request, lambda c: templates.create(c, loaded, actor="admin"))
    triggers = await services(request).store.read(lambda c: tpl.list_triggers(c, row.key))
    body = {"template": views.template_json(row, triggers), "warnings": loaded.warnings}
    return JSONResponse(body, status_code=201)


@router.get(
    "/templates/{key}",
    response_model=None,
    responses={
        200: m.answer(m.TemplateAnswer, "the template"),
        404: missing("template_not_found"),
    },
)
async def get_template(request: Request, key: str) -> dict[str, Any]:
    def _read(conn: Connection) -> tuple[PipelineTemplate, list[PipelineTrigger]] | None:
        row = tpl.get_definition(conn, key)
        return None if row is None else (row, tpl.list_triggers(conn, key))

    found = await services(request).store.read(_read)
    if found is None:
        raise ApiError(404, "template_not_found", f"no pipeline template {key}")
    row, triggers = found
    try:
        warnings = load_definition(row.definition, bodies=bodies(request)).warnings
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

    def _put(conn: Connection) -> tuple[int, PipelineTemplate]:
        if tpl.get_definition(conn, key) is None:
            if loaded.definition.key != key:
                raise PipelineError(
                    "key_mismatch", f"the document's key is not {key!r}", status=400
                )
            return 201, templates.create(conn, loaded, actor="admin")
        enabled = loaded.definition.enabled if explicit else None
        return 200, templates.replace(conn, key, loaded, actor="admin", enabled=enabled)

    status, row = await write(request, _put)
    triggers = await services(request).store.read(lambda c: tpl.list_triggers(c, key))
    body = {"template": views.template_json(row, triggers), "warnings": loaded.warnings}
    return JSONResponse(body, status_code=status)


def _switch(key: str, enabled: bool) -> Callable[[Connection, controls.ControlRequest], Any]:
    def _apply(conn: Connection, req: controls.ControlRequest) -> controls.Outcome:
        row = templates.set_enabled(conn, key, enabled, actor=req.actor)
        return 200, views.template_json(row, tpl.list_triggers(conn, key))

    return _apply


@router.post("/templates/{key}/enable", responses=_switched("enabled", "template_not_found"))
async def enable_template(request: Request, key: str, body: ControlBody) -> JSONResponse:
    return await control(request, body, "pipeline.template.enable", key, _switch(key, True))


@router.post("/templates/{key}/disable", responses=_switched("disabled", "template_not_found"))
async def disable_template(request: Request, key: str, body: ControlBody) -> JSONResponse:
    """Refuse new runs of the template; runs under way go on."""
    return await control(request, body, "pipeline.template.disable", key, _switch(key, False))


def _trigger_switch(
    key: str, trigger_id: str, enabled: bool
) -> Callable[[Connection, controls.ControlRequest], Any]:
    def _apply(conn: Connection, req: controls.ControlRequest) -> controls.Outcome:
        templates.require(conn, key)
        row = tq.get(conn, trigger_id)
        if row is None or row.template_key != key:
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
    response = await control(request, body, "pipeline.trigger.enable", f"{key}/{triggerId}", fn)
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
    response = await control(request, body, "pipeline.trigger.disable", f"{key}/{triggerId}", fn)
    _wake_triggers(request)
    return response


def _wake_triggers(request: Request) -> None:
    loops = services(request).triggers
    if loops is not None:
        loops.wake()


@router.post(
    "/templates/{key}/runs",
    status_code=201,
    responses={
        201: m.answer(m.RunStarted, "started (created: false when this requestId started it)"),
        400: m.error("invalid_inputs (errors lists them) or invalid_request"),
        404: missing("template_not_found"),
        409: m.error("template_disabled, manual_trigger_missing or request_id_conflict"),
    },
)
async def start_run(request: Request, key: str, body: RunBody) -> JSONResponse:
    """Manual start: inputs are checked against the template's declared inputs."""

    def _start(conn: Connection, req: controls.ControlRequest) -> controls.Outcome:
        started = templates.start_manual(
            conn, key, inputs=body.inputs, dedupe_key=f"request:{body.requestId}", actor=req.actor
        )
        return 201, {"run": views.run_json(started.run), "created": started.created}

    return await control(request, body, "pipeline.run.start", key, _start)


# Last, so the runs' routes follow the templates' in the OpenAPI document as before.
router.include_router(pipeline_runs.router)
router.include_router(pipeline_hooks.router)
