"""The control and query API under ``/api/gitea-workflow``: tasks, repositories, the
global pause, budgets, usage and the audit trail."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from sqlalchemy import Connection

from forgeflow.api import schemas as s
from forgeflow.api.auth import require_admin
from forgeflow.api.errors import ApiError
from forgeflow.api.inputs import MAX_INT32, MAX_INT64, Text, no_nul_parameters
from forgeflow.api.schemas import ADMIN_ERRORS, UNMATCHED, Responses, answer, error
from forgeflow.domain.states import (
    TaskState,
)
from forgeflow.services import Services
from forgeflow.store import audit, repos, task_reads, usage
from forgeflow.store.details import overview_snapshot, task_detail_snapshot
from forgeflow.tasks import controls

router = APIRouter(
    prefix="/api/gitea-workflow",
    dependencies=[Depends(require_admin), Depends(no_nul_parameters)],
    tags=["control"],
    responses=ADMIN_ERRORS,
)

_CONFLICT = error("request_id_conflict: the requestId was used for another action")


def _controlled(model: type[BaseModel], what: str, *, target: str | None = None) -> Responses:
    """The answers of a control request on ``target`` (a task, a repository)."""
    out: Responses = {200: answer(model, f"{what}; a repeated requestId answers the first")}
    out[409] = _CONFLICT
    if target is not None:
        out[404] = error(f"{target}_not_found, or {UNMATCHED}")
    return out


class ControlBody(BaseModel):
    requestId: Text = Field(min_length=1, max_length=200)
    reason: Text | None = Field(default=None, max_length=2000)
    operator: str | None = Field(
        default=None, min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.@-]+$"
    )


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


async def _control(
    request: Request,
    body: ControlBody,
    action: str,
    target: str,
    fn: Callable[[Connection, controls.ControlRequest], controls.Outcome],
) -> JSONResponse:
    req = controls.ControlRequest(body.requestId, body.operator or "admin", body.reason)
    status, payload = await _services(request).store.write(
        lambda c: controls.run(c, req, action, target, fn)
    )
    return JSONResponse(payload, status_code=status)


@router.get("/overview", response_model=None, responses={200: answer(s.Overview, "overview")})
async def overview(request: Request) -> dict[str, Any]:
    """Global pause, running tasks per repository, queue summary, recent failures."""
    return await _services(request).store.read(overview_snapshot)


@router.get("/tasks", response_model=None, responses={200: answer(s.TaskPage, "a page of tasks")})
async def list_tasks(
    request: Request,
    repoKey: str | None = None,
    resourceKey: str | None = None,
    state: TaskState | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_INT64)] = 0,
) -> dict[str, Any]:
    """Tasks, newest first, filtered by repository, resource and state."""
    f = task_reads.TaskFilter(repoKey, resourceKey, state.value if state else None, limit, offset)
    rows, total = await _services(request).store.read(lambda c: task_reads.list_page(c, f))
    next_offset = offset + len(rows) if offset + len(rows) < total else None
    return {
        "items": [r.json() for r in rows],
        "total": total,
        "limit": limit,
        "offset": offset,
        "nextOffset": next_offset,
    }


@router.get(
    "/tasks/{taskId}",
    response_model=None,
    responses={
        200: answer(s.TaskDetail, "the task"),
        404: error(f"task_not_found, or {UNMATCHED}"),
    },
)
async def task_detail(request: Request, taskId: str) -> dict[str, Any]:
    """One task with its turns, comments, errors and audit trail."""
    result = await _services(request).store.read(lambda c: task_detail_snapshot(c, taskId))
    if result is None:
        raise ApiError(404, "task_not_found", f"no task {taskId}")
    return result


@router.post("/control/pause", responses=_controlled(s.ControlAnswer, "paused"))
async def pause(request: Request, body: ControlBody) -> JSONResponse:
    """Stop claiming new tasks; running work continues."""
    return await _control(request, body, "pause", "global", controls.pause)


@router.post("/control/resume", responses=_controlled(s.ControlAnswer, "resumed"))
async def resume(request: Request, body: ControlBody) -> JSONResponse:
    return await _control(request, body, "resume", "global", controls.resume)


@router.get(
    "/repos", response_model=None, responses={200: answer(s.RepositoryList, "repositories")}
)
async def list_repos(request: Request) -> dict[str, Any]:
    rows = await _services(request).store.read(repos.list_all)
    return {"items": [r.json() for r in rows]}


@router.post(
    "/repos/{repoKey:path}/disable",
    responses=_controlled(s.RepositoryAnswer, "disabled", target="repository"),
)
async def disable_repo(request: Request, repoKey: str, body: ControlBody) -> JSONResponse:
    """Refuse new triggers for the repository; history and running work are kept."""
    return await _control(
        request, body, "repo.disable", repoKey, controls.set_repo_status(repos.DISABLED, repoKey)
    )


@router.post(
    "/repos/{repoKey:path}/enable",
    responses=_controlled(s.RepositoryAnswer, "enabled", target="repository"),
)
async def enable_repo(request: Request, repoKey: str, body: ControlBody) -> JSONResponse:
    return await _control(
        request, body, "repo.enable", repoKey, controls.set_repo_status(repos.ACTIVE, repoKey)
    )


class BudgetBody(ControlBody):
    dailyTokens: int | None = Field(default=None, ge=0)
    monthlyTokens: int | None = Field(default=None, ge=0)


@router.put(
    "/repos/{repoKey:path}/budget",
    responses=_controlled(s.BudgetAnswer, "budgets set", target="repository"),
)
async def set_budget(request: Request, repoKey: str, body: BudgetBody) -> JSONResponse:
    """Token budgets of one repository (null: the configured default)."""
    return await _control(
        request,
        body,
        "repo.budget",
        repoKey,
        controls.set_budget(repoKey, body.dailyTokens, body.monthlyTokens),
    )


@router.get("/usage", response_model=None, responses={200: answer(s.UsageReport, "usage")})
async def usage_report(request: Request) -> dict[str, Any]:
    """Tokens and cost per repository and session, today and this month, with budgets."""
    defaults = _services(request).settings.budgets()
    items = await _services(request).store.read(lambda c: usage.report(c, defaults))
    return {"items": items}


@router.post(
    "/tasks/{taskId}/cancel",
    responses={
        **_controlled(
            s.TaskControlAnswer, "cancelled (changed: false if it already was)", target="task"
        ),
        409: error("invalid_state (with the task's state) or request_id_conflict"),
    },
)
async def cancel_task(request: Request, taskId: str, body: ControlBody) -> JSONResponse:
    """Cancel a task that has not started (queued, waiting_user, blocked_workspace)."""
    return await _control(request, body, "task.cancel", taskId, controls.cancel(taskId))


@router.post(
    "/tasks/{taskId}/abort",
    responses={
        **_controlled(
            s.TaskControlAnswer, "aborting (changed: false if it already was)", target="task"
        ),
        409: error("invalid_state (with the task's state) or request_id_conflict"),
    },
)
async def abort_task(request: Request, taskId: str, body: ControlBody) -> JSONResponse:
    """Ask the running turn to stop; the worker interrupts it and ends the task."""
    return await _control(request, body, "task.abort", taskId, controls.abort(taskId))


@router.post(
    "/tasks/{taskId}/release",
    responses={
        **_controlled(
            s.TaskControlAnswer, "queued again (changed: false if it already was)", target="task"
        ),
        409: error("invalid_state (with the task's state) or request_id_conflict"),
    },
)
async def release_task(request: Request, taskId: str, body: ControlBody) -> JSONResponse:
    """Put a blocked_workspace task back in the queue after the workspace was fixed."""
    return await _control(request, body, "task.release", taskId, controls.release(taskId))


def _time(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
        # The store compares in UTC: converting here turns an offset that leaves years
        # 1..9999 (0001-01-01T00:00:00+05:00) into a 400 instead of a 500 in the driver.
        return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).astimezone(UTC)
    except (ValueError, OverflowError):
        raise ApiError(400, "invalid_request", f"{name} must be an ISO-8601 time") from None


# RFC 3339 date-time (also accepted: any ISO-8601 form Python reads; naive is UTC).
_TIME = Query(description="ISO-8601 time", json_schema_extra={"format": "date-time"})


@router.get(
    "/audit",
    response_model=None,
    responses={
        200: {
            **answer(s.AuditPage, "audit events; format=jsonl: one event per line"),
            "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
        }
    },
)
async def audit_query(
    request: Request,
    taskId: str | None = None,
    sessionKey: str | None = None,
    repoKey: str | None = None,
    action: str | None = None,
    since: Annotated[str | None, _TIME] = None,
    until: Annotated[str | None, _TIME] = None,
    afterSeq: Annotated[int | None, Query(ge=0, le=MAX_INT32)] = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 200,
    format: Annotated[str, Query(pattern="^(json|jsonl)$")] = "json",
) -> dict[str, Any] | Response:
    """Audit events by task, session, repository and time range; ``format=jsonl`` exports."""
    q = audit.AuditQuery(
        taskId,
        sessionKey,
        repoKey,
        action,
        _time(since, "since"),
        _time(until, "until"),
        afterSeq,
        limit,
    )
    found = await _services(request).store.read(lambda c: audit.query(c, q))
    events = [e.json() for e in found]
    if format == "jsonl":
        import json

        lines = "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in events)
        return Response(lines, media_type="application/x-ndjson")
    return {"items": events, "nextAfterSeq": events[-1]["seq"] if events else afterSeq}
