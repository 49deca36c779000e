"""The admin pages' sign-in sessions for an operator: listed and ended from the API
(``forgeflow`` ends the row; the cookie of an ended session no longer signs anyone in)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel
from sqlalchemy import Connection

from forgeflow.api.auth import require_admin
from forgeflow.api.errors import ApiError
from forgeflow.api.inputs import no_nul_parameters
from forgeflow.api.schemas import ADMIN_ERRORS, answer, error
from forgeflow.services import Services
from forgeflow.store import audit, ui_sessions
from forgeflow.store.types import utcnow

router = APIRouter(
    prefix="/api/gitea-workflow",
    dependencies=[Depends(require_admin), Depends(no_nul_parameters)],
    tags=["control"],
    responses=ADMIN_ERRORS,
)


class UiSessionRow(BaseModel):
    sessionId: str
    operator: str
    address: str | None
    createdAt: str
    expiresAt: str
    endedAt: str | None
    endedBy: str | None
    live: bool


class UiSessionList(BaseModel):
    items: list[UiSessionRow]


class UiSessionEnded(BaseModel):
    sessionId: str
    ended: bool


@router.get(
    "/ui-sessions",
    response_model=None,
    responses={200: answer(UiSessionList, "sign-in sessions, newest first (500 at most)")},
)
async def list_ui_sessions(
    request: Request,
    all: Annotated[bool, Query(description="also ended and expired ones (kept 7 days)")] = False,
) -> UiSessionList:
    services: Services = request.app.state.services
    rows = await services.store.read(lambda c: ui_sessions.listing(c, live_only=not all))
    now = utcnow()
    items = [UiSessionRow.model_validate({**r.json(), "live": r.live(now)}) for r in rows]
    return UiSessionList(items=items)


@router.post(
    "/ui-sessions/{sessionId}/end",
    response_model=None,
    responses={
        200: answer(UiSessionEnded, "the session is ended"),
        404: error("ui_session_not_found: no live session has this id"),
    },
)
async def end_ui_session(request: Request, sessionId: str) -> UiSessionEnded:
    services: Services = request.app.state.services
    sid = sessionId[:64]

    def _end(conn: Connection) -> bool:
        if not ui_sessions.end(conn, sid, "admin:api"):
            return False
        event = audit.AuditEvent(
            action="ui.session.end", actor="admin:api", metadata={"sessionId": sid}
        )
        audit.append(conn, event)
        return True

    ended = await services.store.write(_end)
    if not ended:
        raise ApiError(404, "ui_session_not_found", f"no live sign-in session {sid}")
    return UiSessionEnded(sessionId=sid, ended=True)
