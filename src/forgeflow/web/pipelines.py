"""Pipeline pages: templates (with their triggers and a manual start form), runs, and a
run's DAG, state bag and approval gates.

Controls go through :func:`forgeflow.tasks.controls.run` with the same action names and
targets as ``/api/pipelines``, so a ``requestId`` means the same thing on both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from sqlalchemy import Connection

from forgeflow.domain.json import JsonObject
from forgeflow.domain.pipeline_records import PipelineStep
from forgeflow.pipelines import retry, runs, steps, templates, views
from forgeflow.pipelines.definition import DefinitionError, load_definition
from forgeflow.pipelines.kinds import NODE_ROW, SETTLED_STEP_STATUSES, RunStatus
from forgeflow.pipelines.runs import PipelineError
from forgeflow.pipelines.steps import APPROVAL
from forgeflow.redaction import redact
from forgeflow.store import audit
from forgeflow.store import pipeline_templates as tpl
from forgeflow.store import pipelines as q
from forgeflow.tasks import controls
from forgeflow.web.actions import run_control
from forgeflow.web.contexts import (
    PipelineRunPage,
    PipelineRunsPage,
    PipelinesPage,
    PipelineTemplatePage,
)
from forgeflow.web.dag import layout
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
RUN_STATUSES = [s.value for s in RunStatus]
Fn = Callable[[Connection, controls.ControlRequest], controls.Outcome]


def run_marker(conn: Connection, run_id: str) -> str:
    """The audit marker plus the run's and its steps' versions: steps move unaudited."""
    run = q.get_run(conn, run_id)
    rows = q.steps_of(conn, run_id) if run is not None else []
    versions = sum(int(r.version) for r in rows)
    return f"{audit.change_marker(conn)}:{run.version if run else 0}.{versions}.{len(rows)}"


def _bodies(request: Request) -> frozenset[str] | None:
    engine = services(request).pipelines
    return engine.registry.keys() if engine is not None else None


@router.get("")
async def template_list(request: Request, session: Session) -> Response:
    def _read(conn: Connection) -> tuple[str, PipelinesPage]:
        stamp = audit.change_marker(conn)
        rows = [
            views.template_json(row, tpl.list_triggers(conn, row.key), full=False)
            for row in tpl.list_definitions(conn)
        ]
        return stamp, PipelinesPage(rows=rows)

    stamp, page = await services(request).store.read(_read)
    return render(request, "pipelines.html", page, session=session, stamp=stamp)


@router.get("/templates/{key}")
async def template_page(request: Request, session: Session, key: str) -> Response:
    bodies = _bodies(request)

    def _read(conn: Connection) -> tuple[str, PipelineTemplatePage] | None:
        stamp = audit.change_marker(conn)
        row = tpl.get_definition(conn, key)
        if row is None:
            return None
        recent, total = q.list_runs(conn, template_key=key, limit=10)
        try:
            warnings = load_definition(row.definition, bodies=bodies).warnings
        except DefinitionError as exc:
            warnings = exc.errors
        template = views.template_json(row, tpl.list_triggers(conn, key))
        definition = template["definition"]
        assert isinstance(definition, dict)  # template_json(full=True) carries it
        page = PipelineTemplatePage(
            template=template,
            definition=definition,
            dag=layout(definition),
            warnings=warnings,
            recent=[views.run_json(r, state=False) for r in recent],
            total_runs=total,
            manual=templates.has_manual_trigger(conn, key),
        )
        return stamp, page

    found = await services(request).store.read(_read)
    if found is None:
        raise NotFound(f"no pipeline template {key}")
    stamp, page = found
    return render(request, "pipeline_template.html", page, session=session, stamp=stamp)


@router.get("/runs")
async def run_list(
    request: Request,
    session: Session,
    template: str | None = None,
    status: str | None = None,
    offset: Offset = 0,
) -> Response:
    chosen = opt(status)  # an unknown status shows every run rather than none
    params = {"template": opt(template), "status": chosen if chosen in RUN_STATUSES else None}

    def _read(conn: Connection) -> tuple[str, PipelineRunsPage]:
        stamp = audit.change_marker(conn)
        rows, total = q.list_runs(
            conn,
            template_key=params["template"],
            status=params["status"],
            limit=PAGE_SIZE,
            offset=offset,
        )
        page = PipelineRunsPage(
            rows=[views.run_json(r, state=False) for r in rows],
            page=paging(offset, total),
            keys=[d.key for d in tpl.list_definitions(conn)],
            params=params,
            statuses=RUN_STATUSES,
        )
        return stamp, page

    stamp, page = await services(request).store.read(_read)
    return render(request, "pipeline_runs.html", page, session=session, stamp=stamp)


def _awaits_approval(step: PipelineStep) -> bool:
    return step.status == "suspended" and (step.suspend or {}).get("reason") == APPROVAL


def _node_view(steps: list[PipelineStep]) -> tuple[dict[str, str], dict[str, str]]:
    """Each node's status (its own row) and a short note (forEach items, gates)."""
    status: dict[str, str] = {}
    items: dict[str, list[str]] = {}
    note: dict[str, str] = {}
    for s in steps:
        if s.item_index == NODE_ROW:
            status[s.step_id] = s.status
            if _awaits_approval(s):
                note[s.step_id] = "awaiting approval"
        else:
            items.setdefault(s.step_id, []).append(s.status)
    for step_id, states in items.items():
        done = sum(1 for x in states if x in SETTLED_STEP_STATUSES)
        note[step_id] = f"{done}/{len(states)} items"
    return status, note


@router.get("/runs/{run_id}")
async def run_page(request: Request, session: Session, run_id: str) -> Response:
    def _read(conn: Connection) -> tuple[str, PipelineRunPage] | None:
        stamp = run_marker(conn, run_id)
        row = q.get_run(conn, run_id)
        if row is None:
            return None
        rows = q.steps_of(conn, run_id)
        definition: JsonObject = redact(row.definition)
        status, note = _node_view(rows)
        page = PipelineRunPage(
            run=views.run_json(row, rows),
            definition=definition,
            children=[views.run_json(c, state=False) for c in q.child_runs(conn, run_id)],
            interrupted=retry.interrupted(row, rows),
            dag=layout(definition, status, note),
            gates=[views.step_json(s) for s in rows if _awaits_approval(s)],
            stamp_url=f"/ui/live?run={run_id}",
        )
        return stamp, page

    found = await services(request).store.read(_read)
    if found is None:
        raise NotFound(f"no run {run_id}")
    stamp, page = found
    return render(request, "pipeline_run.html", page, session=session, stamp=stamp)


# -- controls ---------------------------------------------------------------------------


def _guarded(fn: Fn) -> Fn:
    def _apply(conn: Connection, req: controls.ControlRequest) -> controls.Outcome:
        try:
            return fn(conn, req)
        except PipelineError as exc:
            return exc.status, {"error": exc.code, "message": exc.message, **exc.extra}

    return _apply


def _switch(key: str, enabled: bool) -> Fn:
    def _apply(conn: Connection, req: controls.ControlRequest) -> controls.Outcome:
        row = templates.set_enabled(conn, key, enabled, actor=req.actor)
        return 200, views.template_json(row, tpl.list_triggers(conn, key))

    return _guarded(_apply)


def _switched(body: JsonObject) -> str:
    return f"Template {body.get('key')} is {'enabled' if body.get('enabled') else 'disabled'}."


@router.post("/templates/{key}/enable")
async def enable_template(request: Request, posted: Post, key: str) -> Response:
    fn = _switch(key, True)
    action = "pipeline.template.enable"
    return await run_control(request, posted, action, key, fn, describe=_switched)


@router.post("/templates/{key}/disable")
async def disable_template(request: Request, posted: Post, key: str) -> Response:
    fn = _switch(key, False)
    action = "pipeline.template.disable"
    return await run_control(request, posted, action, key, fn, describe=_switched)


@router.post("/templates/{key}/runs")
async def start_run(request: Request, posted: Post, key: str) -> Response:
    """Manual start from the form of declared inputs (text, parsed by declared type)."""
    inputs: JsonObject = {
        name.removeprefix("in."): value
        for name, value in posted.form.items()
        if name.startswith("in.") and value.strip() != ""
    }
    request_id = posted.form.get("requestId", "")

    def _start(conn: Connection, req: controls.ControlRequest) -> controls.Outcome:
        started = templates.start_manual(
            conn,
            key,
            inputs=inputs,
            dedupe_key=f"request:{request_id}",
            actor=req.actor,
            coerce_text=True,
        )
        return 201, {"run": views.run_json(started.run), "created": started.created}

    def _run_page(body: JsonObject) -> str | None:
        run_id = views.answer_field(body, "run", "runId")
        return f"/ui/pipelines/runs/{run_id}" if run_id else None

    def _started(body: JsonObject) -> str:
        return f"Run {views.answer_field(body, 'run', 'runId')} started."

    return await run_control(
        request,
        posted,
        "pipeline.run.start",
        key,
        _guarded(_start),
        describe=_started,
        goto=_run_page,
    )


@router.post("/runs/{run_id}/cancel")
async def cancel_run(request: Request, posted: Post, run_id: str) -> Response:
    def _cancel(conn: Connection, req: controls.ControlRequest) -> controls.Outcome:
        row = runs.cancel_run(conn, run_id, actor=req.actor, reason=req.reason)
        return 200, {"run": views.run_json(row, state=False)}

    def _said(body: JsonObject) -> str:
        return f"Run {run_id} is {views.answer_field(body, 'run', 'status')}."

    fn = _guarded(_cancel)
    return await run_control(request, posted, "pipeline.run.cancel", run_id, fn, describe=_said)


@router.post("/runs/{run_id}/retry")
async def retry_run(request: Request, posted: Post, run_id: str) -> Response:
    """The run page's Retry: its confirmation checkbox is ``confirmInterrupted``."""
    confirm = posted.form.get("confirmInterrupted") == "yes"

    def _retry(conn: Connection, req: controls.ControlRequest) -> controls.Outcome:
        return retry.answer(conn, run_id, actor=req.actor, confirm=confirm)

    def _said(body: JsonObject) -> str:
        taken = body.get("steps")
        names = [str(s) for s in taken] if isinstance(taken, list) else []
        return f"Run {run_id} runs again: {', '.join(names)}."

    fn = _guarded(_retry)
    return await run_control(request, posted, "pipeline.run.retry", run_id, fn, describe=_said)


async def _decide(
    request: Request, posted: Posted, run_id: str, step_id: str, approve: bool
) -> Response:
    raw = posted.form.get("itemIndex", "").strip()
    item = int(raw) if raw.isdigit() else None
    index = NODE_ROW if item is None else item

    def _apply(conn: Connection, req: controls.ControlRequest) -> controls.Outcome:
        return steps.decide(
            conn, run_id, step_id, index, approve=approve, actor=req.actor, reason=req.reason
        )

    def _said(body: JsonObject) -> str:
        return f"Step {step_id} {body.get('decision')}; the run is {body.get('runStatus')}."

    action = f"pipeline.step.{'approve' if approve else 'reject'}"
    target = f"{run_id}/{step_id}/{item}"
    return await run_control(request, posted, action, target, _guarded(_apply), describe=_said)


@router.post("/runs/{run_id}/steps/{step_id}/approve")
async def approve_step(request: Request, posted: Post, run_id: str, step_id: str) -> Response:
    return await _decide(request, posted, run_id, step_id, True)


@router.post("/runs/{run_id}/steps/{step_id}/reject")
async def reject_step(request: Request, posted: Post, run_id: str, step_id: str) -> Response:
    return await _decide(request, posted, run_id, step_id, False)
