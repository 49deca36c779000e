"""What the admin pages fetch besides pages: the change marker that live regions poll,
the audit export, and the packaged CSS and JavaScript."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from functools import partial
from importlib import resources
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from forgeflow.store import audit, tasks
from forgeflow.web import access
from forgeflow.web.pages import audit_params, marker, task_marker
from forgeflow.web.pipelines import run_marker
from forgeflow.web.render import UiRoute, services
from forgeflow.web.security import NotFound, UiSession, require_operator, require_session

router = APIRouter(prefix="/ui", route_class=UiRoute, include_in_schema=False)
assets = APIRouter(prefix="/ui/static", include_in_schema=False)
Session = Annotated[UiSession, Depends(require_session)]
Operator = Annotated[UiSession, Depends(require_operator)]

EXPORT_BATCH = 1000
_ASSETS = {"app.css": "text/css; charset=utf-8", "live.js": "text/javascript; charset=utf-8"}


@router.get("/live")
async def live(
    request: Request, session: Session, run: str | None = None, task: str | None = None
) -> JSONResponse:
    """The change marker: a page refreshes its live regions when it moves. A run page
    adds its run, whose steps change without audit events; a task page its transcript."""
    store = services(request).store
    scoped = not session.operator_rights
    if task is not None:
        if scoped:  # a Gitea user follows only a task of a repository they can read
            found = await store.read(lambda c: tasks.get(c, task))
            if found is None:
                raise NotFound(f"no task {task}")
            await access.require_read(request, session, found.repo_key, f"no task {task}")
        stamp = await store.read(partial(task_marker, task_id=task, scoped=scoped))
    elif run is not None:
        if scoped:
            raise NotFound("no page has this address")
        stamp = await store.read(partial(run_marker, run_id=run))
    else:
        visible = await access.readable(request, session)
        stamp = await store.read(lambda c: marker(c, visible))
    return JSONResponse({"stamp": stamp})


@router.get("/audit/export.jsonl")
async def audit_export(
    request: Request,
    _session: Operator,
    task: str | None = None,
    session_key: Annotated[str | None, Query(alias="session")] = None,
    repo: str | None = None,
    action: str | None = None,
    since: str | None = None,
    until: str | None = None,
) -> Response:
    """Every matching event as JSON lines, oldest first, read in batches."""
    _params, q, error = audit_params(task, session_key, repo, action, since, until)
    if error:
        raise NotFound(error)
    store = services(request).store

    async def _lines() -> AsyncIterator[str]:
        after: int | None = None
        while True:
            batch = replace(q, after_seq=after, limit=EXPORT_BATCH)
            events = await store.read(partial(audit.query, q=batch))
            for event in events:
                yield json.dumps(event.json(), ensure_ascii=False) + "\n"
            if len(events) < EXPORT_BATCH:
                return
            after = events[-1].seq

    return StreamingResponse(
        _lines(),
        media_type="application/x-ndjson",
        headers={"Content-Disposition": 'attachment; filename="forgeflow-audit.jsonl"'},
    )


@assets.get("/{name}")
async def asset(name: str) -> Response:
    if name not in _ASSETS:
        return Response("not found", status_code=404, media_type="text/plain")
    body = resources.files("forgeflow.web").joinpath("static", name).read_bytes()
    return Response(
        body,
        media_type=_ASSETS[name],
        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
    )
