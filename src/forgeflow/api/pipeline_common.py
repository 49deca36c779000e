"""What the pipeline routes under ``/api/pipelines`` share: the services, control
requests with their ``requestId`` replay, and ``PipelineError`` as an HTTP answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse
from sqlalchemy import Connection

from forgeflow.api import schemas as m
from forgeflow.api.errors import ApiError
from forgeflow.pipelines.runs import PipelineError
from forgeflow.services import Services
from forgeflow.tasks import controls


class Requested(Protocol):
    """The fields of a control request's body (``ControlBody`` and the run start's)."""

    @property
    def requestId(self) -> str: ...
    @property
    def operator(self) -> str | None: ...
    @property
    def reason(self) -> str | None: ...


Change = Callable[[Connection, controls.ControlRequest], controls.Outcome]

# The answers each route adds to ADMIN_ERRORS (docs/api.md, docs/pipelines.md).
CONFLICT = m.error("request_id_conflict: the requestId was used for another action")


def missing(*codes: str) -> dict[str, Any]:
    return m.error(f"{', '.join(codes)}, or {m.UNMATCHED}")


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


def bodies(request: Request) -> frozenset[str] | None:
    """The step bodies this process can run, or None when it runs no engine."""
    engine = services(request).pipelines
    return engine.registry.keys() if engine is not None else None


def _wake(request: Request) -> None:
    engine = services(request).pipelines
    if engine is not None:
        engine.wake()


def _error(exc: PipelineError) -> controls.Outcome:
    return exc.status, {"error": exc.code, "message": exc.message, **exc.extra}


async def control(
    request: Request, body: Requested, action: str, target: str, fn: Change
) -> JSONResponse:
    """Run ``fn`` as a control request: a repeated ``requestId`` answers as the first
    time and changes nothing; a refusal is recorded as the answer like a success."""
    req = controls.ControlRequest(body.requestId, body.operator or "admin", body.reason)

    def _guarded(conn: Connection, r: controls.ControlRequest) -> controls.Outcome:
        try:
            return fn(conn, r)
        except PipelineError as exc:
            return _error(exc)

    status, payload = await services(request).store.write(
        lambda c: controls.run(c, req, action, target, _guarded)
    )
    _wake(request)
    return JSONResponse(payload, status_code=status)


async def write(request: Request, fn: Callable[[Connection], Any]) -> Any:
    try:
        return await services(request).store.write(fn)
    except PipelineError as exc:
        raise ApiError(exc.status, exc.code, exc.message, **exc.extra) from None
