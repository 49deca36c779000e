"""A session's page: the conversation over time on one issue or pull request — each
mention, the bot's answers, and the diff of the work it published."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from sqlalchemy import Connection

from forgeflow.domain.ids import parse_repo_key
from forgeflow.domain.records import Repository
from forgeflow.domain.records import Session as SessionRecord
from forgeflow.domain.review_record import BotReview
from forgeflow.domain.transcript import DIFF_LIMIT, clip
from forgeflow.redaction import redact_text
from forgeflow.services import Services
from forgeflow.store import audit, details, pushes, repos, reviews, sessions
from forgeflow.web import access
from forgeflow.web.render import UiRoute, render, services
from forgeflow.web.security import NotFound, UiSession, require_session
from forgeflow.workspace.git import WorkspaceError

router = APIRouter(prefix="/ui", route_class=UiRoute, include_in_schema=False)
Session = Annotated[UiSession, Depends(require_session)]


@dataclass(frozen=True, slots=True)
class Diff:
    """The session's newest pushed work against its base, or why it is not shown."""

    push: pushes.Push
    base: str
    text: str | None = None
    truncated: bool = False
    why: str | None = None


@dataclass(frozen=True, slots=True)
class SessionPage:
    thread: SessionRecord
    exchanges: list[details.Exchange]
    repo: Repository | None
    diff: Diff | None
    reviews: list[BotReview]  # the pull request's reviews by the bot, oldest first
    nav: str = "sessions"


def _read(conn: Connection, session_key: str) -> tuple[str, SessionPage] | None:
    row = sessions.get(conn, session_key)
    if row is None:
        return None
    page = SessionPage(
        thread=row,
        exchanges=details.conversation(conn, session_key),
        repo=repos.get(conn, row.repo_key),
        diff=None,
        reviews=reviews.of_resource(conn, row.resource_key),
    )
    return audit.change_marker(conn), page


async def published_diff(
    ff: Services, repo: Repository | None, exchanges: list[details.Exchange]
) -> Diff | None:
    """The newest pushed work of the session against its base branch (a pull request's
    base, else the repository's default branch), bounded and redacted like a transcript;
    None before anything was pushed."""
    pushed = [p for e in exchanges for p in e.pushes if p.status == pushes.PUSHED]
    if not pushed or repo is None:
        return None
    push = pushed[-1]
    refs = next((e.task.refs for e in reversed(exchanges) if e.task.refs), None)
    base = (refs.base if refs else None) or repo.default_branch
    if ff.scheduler is None:  # the manager exists, but only a worker fills its clones
        why = "This process keeps no clones (it runs no tasks): open it on a worker."
        return Diff(push, base, why=why)
    try:
        # Read no more than the page shows (and a margin for the redaction's cuts):
        # every view of the page reads it, and the agent's commits can be any size.
        read = await ff.workspace.branch_diff(
            parse_repo_key(repo.repo_key),
            f"refs/remotes/origin/{base}",
            push.new_sha,
            limit=4 * DIFF_LIMIT,
        )
    except WorkspaceError as exc:
        return Diff(push, base, why=f"The diff cannot be read here: {redact_text(str(exc))}")
    shown, truncated = clip(redact_text(read.stdout), DIFF_LIMIT)
    return Diff(push, base, text=shown, truncated=truncated or read.truncated)


@router.get("/sessions/{session_key:path}")
async def session_page(request: Request, session: Session, session_key: str) -> Response:
    ff = services(request)
    found = await ff.store.read(lambda c: _read(c, session_key))
    if found is None:
        raise NotFound(f"no session {session_key}")
    stamp, page = found
    what = f"no session {session_key}"  # the same answer as for no session at all
    await access.require_read(request, session, page.thread.repo_key, what)
    if not session.operator_rights:
        keys = frozenset({page.thread.repo_key})
        stamp = await ff.store.read(lambda c: audit.change_marker_of(c, keys))
    page = replace(page, diff=await published_diff(ff, page.repo, page.exchanges))
    return render(request, "session.html", page, session=session, stamp=stamp)
