"""``GET /api/gitea-workflow/tasks/{taskId}/transcript``: what the agent did, in pages.

A transcript can hold hundreds of entries of several kilobytes each, so it is not part
of the task's detail; a client pages through it with ``after`` (the last ``seq`` seen).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field
from sqlalchemy import Connection

from forgeflow.api.auth import require_admin
from forgeflow.api.errors import ApiError
from forgeflow.api.inputs import MAX_INT32, no_nul_parameters
from forgeflow.api.schemas import ADMIN_ERRORS, UNMATCHED, answer, derived, error
from forgeflow.domain import records
from forgeflow.services import Services
from forgeflow.store import tasks, transcripts

if TYPE_CHECKING:  # mypy sees a plain model; the real one is built at import
    TranscriptEntry = BaseModel
else:
    TranscriptEntry = derived(records.TranscriptEntry)


class TranscriptPage(BaseModel):
    items: list[TranscriptEntry]
    nextAfter: int | None = Field(description="the ``after`` of the next page; null at the end")


router = APIRouter(
    prefix="/api/gitea-workflow",
    dependencies=[Depends(require_admin), Depends(no_nul_parameters)],
    tags=["control"],
    responses=ADMIN_ERRORS,
)


@router.get(
    "/tasks/{taskId}/transcript",
    response_model=None,
    responses={
        200: answer(TranscriptPage, "the task's transcript entries after `after`"),
        404: error(f"task_not_found, or {UNMATCHED}"),
    },
)
async def transcript(
    request: Request,
    taskId: str,
    after: Annotated[int, Query(ge=0, le=MAX_INT32)] = 0,  # seq is a 32-bit integer
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> dict[str, Any]:
    """The task's transcript entries after ``after``, oldest first."""

    def _read(conn: Connection) -> list[Any] | None:
        if tasks.get(conn, taskId) is None:
            return None
        return transcripts.of_task(conn, taskId, after=after, limit=limit)

    services: Services = request.app.state.services
    entries = await services.store.read(_read)
    if entries is None:
        raise ApiError(404, "task_not_found", f"no task {taskId}")
    more = len(entries) == limit
    return {
        "items": [e.json() for e in entries],
        "nextAfter": entries[-1].seq if more else None,
    }
