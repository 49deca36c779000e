"""The page of one repository (``/ui/repos/<repoKey>``, operators only): its record,
its tasks in flight and its environment (#26): what the operator declared, the state
of its root (building, ready, failed, removed), the root's size and last use, and the
last setup run with the end of its log. Setup secrets are shown by name only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from sqlalchemy import Connection

from forgeflow.agent.envroot import BASE_PACKAGES, host_suite
from forgeflow.domain.environment import tail
from forgeflow.domain.states import ACTIVE_STATES, TaskState, values
from forgeflow.store import audit, environments, repos, task_reads
from forgeflow.web.contexts import RepoPage
from forgeflow.web.render import UiRoute, render, services
from forgeflow.web.security import NotFound, UiSession, require_operator

router = APIRouter(prefix="/ui", route_class=UiRoute, include_in_schema=False)
Operator = Annotated[UiSession, Depends(require_operator)]


@router.get("/repos/{repo_key:path}")
async def repo_page(request: Request, session: Operator, repo_key: str) -> Response:
    suite = host_suite()

    def _read(conn: Connection) -> tuple[str, RepoPage] | None:
        row = repos.get(conn, repo_key)
        if row is None:
            return None
        counts: dict[str, int] = {}
        for state in values(ACTIVE_STATES | {TaskState.QUEUED}):
            found = task_reads.TaskFilter(repo_key=repo_key, state=state, limit=1)
            counts[state] = task_reads.list_page(conn, found)[1]
        view = environments.view_for(conn, repo_key, suite, BASE_PACKAGES)
        setup = view["setup"]
        log = setup.get("log") if isinstance(setup, dict) else None
        page = RepoPage(
            repo=row.json(),
            counts=counts,
            environment=view,
            log_tail=tail(log) if isinstance(log, str) else None,
        )
        return audit.change_marker(conn), page

    found = await services(request).store.read(_read)
    if found is None:
        raise NotFound(f"no repository {repo_key}")
    stamp, page = found
    return render(request, "repo.html", page, session=session, stamp=stamp)
