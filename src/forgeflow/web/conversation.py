"""A session's page: the conversation over time on one issue or pull request — each
mention, the bot's answers, and the diff of the work it published."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from sqlalchemy import Connection

from forgeflow.domain.ids import parse_repo_key
from forgeflow.domain.records import Repository
from forgeflow.domain.transcript import DIFF_LIMIT, clip
from forgeflow.redaction import redact_text
from forgeflow.services import Services
from forgeflow.store import audit, details, pushes, repos, sessions
from forgeflow.web.render import UiRoute, render, services
from forgeflow.web.security import NotFound, UiSession, require_session
from forgeflow.workspace.git import WorkspaceError

router = APIRouter(prefix="/ui", route_class=UiRoute, include_in_schema=False)
Session = Annotated[UiSession, Depends(require_session)]


def _read(conn: Connection, session_key: str) -> dict[str, Any] | None:
    row = sessions.get(conn, session_key)
    if row is None:
        return None
    return {
        "stamp": audit.change_marker(conn),
        "thread": row,
        "exchanges": details.conversation(conn, session_key),
        "repo": repos.get(conn, row.repo_key),
    }


async def published_diff(
    ff: Services, repo: Repository | None, exchanges: list[details.Exchange]
) -> dict[str, Any] | None:
    """The newest pushed work of the session against its base branch (a pull request's
    base, else the repository's default branch), bounded and redacted like a transcript;
    None before anything was pushed."""
    pushed = [p for e in exchanges for p in e.pushes if p.status == pushes.PUSHED]
    if not pushed or repo is None:
        return None
    push = pushed[-1]
    refs = next((e.task.refs for e in reversed(exchanges) if e.task.refs), None)
    base = (refs.base if refs else None) or repo.default_branch
    shown: dict[str, Any] = {"push": push, "base": base, "text": None, "why": None}
    if ff.scheduler is None:  # the manager exists, but only a worker fills its clones
        shown["why"] = "This process keeps no clones (it runs no tasks): open it on a worker."
        return shown
    try:
        text = await ff.workspace.branch_diff(
            parse_repo_key(repo.repo_key), f"refs/remotes/origin/{base}", push.new_sha
        )
    except WorkspaceError as exc:
        shown["why"] = f"The diff cannot be read here: {redact_text(str(exc))}"
        return shown
    shown["text"], shown["truncated"] = clip(redact_text(text), DIFF_LIMIT)
    return shown


@router.get("/sessions/{session_key:path}")
async def session_page(request: Request, session: Session, session_key: str) -> Response:
    ff = services(request)
    data = await ff.store.read(lambda c: _read(c, session_key))
    if data is None:
        raise NotFound(f"no session {session_key}")
    stamp = data.pop("stamp")
    diff = await published_diff(ff, data["repo"], data["exchanges"])
    context = {**data, "diff": diff, "nav": "sessions"}
    return render(request, "session.html", context, session=session, stamp=stamp)
