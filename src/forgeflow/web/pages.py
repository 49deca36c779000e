"""The admin pages that only read: overview, tasks, sessions, repositories, deliveries,
audit. Each reads its data in one unit of work, together with the change marker that
lets the page update itself in place."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy import Connection

from forgeflow.config_warnings import sandbox_warning
from forgeflow.domain.ids import InvalidName, parse_resource_key
from forgeflow.domain.intake import DeliveryStatus
from forgeflow.domain.json import JsonObject
from forgeflow.domain.paths import session_worktree
from forgeflow.domain.permissions import Permission
from forgeflow.domain.prices import Usage
from forgeflow.domain.states import (
    ACTIVE_STATES,
    CANCELLABLE_STATES,
    TERMINAL_STATES,
    TaskState,
    values,
)
from forgeflow.store import (
    audit,
    deliveries,
    environments,
    repos,
    reviews,
    sessions,
    task_reads,
    tasks,
    transcripts,
)
from forgeflow.store.details import overview, running_json, task_detail
from forgeflow.tasks import egress
from forgeflow.web import access
from forgeflow.web.contexts import (
    AuditPage,
    DeliveriesPage,
    OverviewPage,
    Paging,
    Params,
    ReposPage,
    SessionsPage,
    TaskPage,
    TasksPage,
)
from forgeflow.web.render import PAGE_SIZE, UiRoute, render, services
from forgeflow.web.security import NotFound, UiSession, require_operator, require_session

router = APIRouter(prefix="/ui", route_class=UiRoute, include_in_schema=False)
entry = APIRouter(include_in_schema=False)  # the bare address leads to the pages
Session = Annotated[UiSession, Depends(require_session)]
Operator = Annotated[UiSession, Depends(require_operator)]
Offset = Annotated[int, Query(ge=0, le=10_000_000)]

STATES = [s.value for s in TaskState]
DELIVERY_STATUSES = [s.value for s in DeliveryStatus]


def opt(value: str | None) -> str | None:
    """Empty form fields mean "any"."""
    value = (value or "").strip()
    return value or None


def paging(offset: int, total: int) -> Paging:
    return Paging.at(offset, total, PAGE_SIZE)


def _repo_keys(conn: Connection, visible: frozenset[str] | None = None) -> list[str]:
    return [r.repo_key for r in repos.list_all(conn) if visible is None or r.repo_key in visible]


def marker(conn: Connection, visible: frozenset[str] | None) -> str:
    """The change marker of a list page: every event for an operator, only those of the
    readable repositories for a Gitea user."""
    return audit.change_marker(conn) if visible is None else audit.change_marker_of(conn, visible)


@entry.get("/")
async def root() -> Response:
    return RedirectResponse("/ui/", status_code=303)


@router.get("/")
async def overview_page(request: Request, session: Session) -> Response:
    if not session.operator_rights:  # the counts are of every repository
        return RedirectResponse("/ui/tasks", status_code=303)

    def _read(conn: Connection) -> tuple[str, OverviewPage]:
        stamp = audit.change_marker(conn)
        midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        snap = overview(conn)
        by_repo: dict[str, list[JsonObject]] = {}
        for t in snap.active:
            by_repo.setdefault(t.repo_key, []).append(running_json(t))
        page = OverviewPage(
            ov=snap.json(),
            running_by_repo=sorted(by_repo.items()),
            tokens_today=task_reads.tokens_since(conn, midnight),
            sandbox_warning=sandbox_warning(services(request).settings),
        )
        return stamp, page

    stamp, page = await services(request).store.read(_read)
    return render(request, "overview.html", page, session=session, stamp=stamp)


@router.get("/tasks")
async def task_list(
    request: Request,
    session: Session,
    repo: str | None = None,
    resource: str | None = None,
    state: str | None = None,
    offset: Offset = 0,
) -> Response:
    params: Params = {"repo": opt(repo), "resource": opt(resource), "state": opt(state)}
    if params["state"] not in (None, *STATES):
        params["state"] = None
    visible = await access.readable(request, session)
    f = task_reads.TaskFilter(
        params["repo"], params["resource"], params["state"], PAGE_SIZE, offset, visible
    )

    def _read(conn: Connection) -> tuple[str, TasksPage]:
        stamp = marker(conn, visible)
        rows, total = task_reads.list_page(conn, f)
        page = TasksPage(
            rows=[r.json() for r in rows],
            page=paging(offset, total),
            repo_keys=_repo_keys(conn, visible),
            params=params,
            states=STATES,
        )
        return stamp, page

    stamp, page = await services(request).store.read(_read)
    return render(request, "tasks.html", page, session=session, stamp=stamp)


# Entries the task page shows; the API pages through the rest of a longer transcript.
TRANSCRIPT_SHOWN = 1000


def task_marker(conn: Connection, task_id: str, scoped: bool = False) -> str:
    """The task page's change marker: the audit's, and its newest transcript entry (a
    turn's items are recorded without an audit event each). ``scoped`` (a Gitea user):
    the audit of the task's repository only, so the marker says nothing of the others."""
    if scoped:
        task = tasks.get(conn, task_id)
        keys = frozenset({task.repo_key}) if task is not None else frozenset()
        events = audit.change_marker_of(conn, keys)
    else:
        events = audit.change_marker(conn)
    return f"{events}.{transcripts.last_seq(conn, task_id)}"


@router.get("/tasks/{task_id}")
async def task_page(request: Request, session: Session, task_id: str) -> Response:
    settings = services(request).settings
    root = str(settings.resolved_workspace_root)
    prices = settings.price_table()

    def _read(conn: Connection) -> tuple[str, TaskPage] | None:
        stamp = task_marker(conn, task_id, scoped=not session.operator_rights)
        detail = task_detail(conn, task_id)
        if detail is None:
            return None
        task = detail.task
        repo_row = repos.get(conn, task.repo_key)
        session_row = sessions.get(conn, task.session_key)
        page = TaskPage(
            task=task.json(),
            terminal=TaskState(task.state) in TERMINAL_STATES,
            queue_position=detail.queue_position,
            turns=[t.json() for t in detail.turns],
            comments=[c.json() for c in detail.comments],
            errors=detail.errors(),
            audit=[e.json() for e in detail.audit],
            repo=repo_row.json() if repo_row else None,
            thread=session_row.json() if session_row else None,
            transcript=transcripts.of_task(conn, task_id, limit=TRANSCRIPT_SHOWN),
            egress_refused=egress.refused(conn, task_id),
            worktree=_worktree(root, task.resource_key),
            can_cancel=task.state in CANCELLABLE_STATES,
            can_abort=task.state == TaskState.RUNNING,
            can_release=task.state == TaskState.BLOCKED_WORKSPACE,
            tokens=(task.input_tokens or 0) + (task.output_tokens or 0),
            model=task.model or settings.model,
            cost=prices.shown(
                task.model or settings.model,
                Usage(task.input_tokens, task.output_tokens, task.cached_input_tokens),
            ),
            stamp_url=f"/ui/live?task={quote(task_id, safe='')}",
            review=reviews.of_task(conn, task_id),
            environment=_setup_of(conn, task.repo_key, task_id),
        )
        return stamp, page

    found = await services(request).store.read(_read)
    if found is None:
        raise NotFound(f"no task {task_id}")
    stamp, page = found
    repo_key = str(page.task["repoKey"])
    may = await access.permission(request, session, repo_key)
    if not may.allows(Permission.READ):
        raise NotFound(f"no task {task_id}")  # the same answer as for no task at all
    if not may.allows(Permission.WRITE):
        page = replace(page, can_cancel=False, can_abort=False, can_release=False, read_only=True)
    return render(request, "task.html", page, session=session, stamp=stamp)


def _setup_of(conn: Connection, repo_key: str, task_id: str) -> JsonObject | None:
    setup = environments.setup(conn, repo_key)
    return setup.json() if setup is not None and setup.task_id == task_id else None


def _worktree(root: str, resource_key: str) -> str | None:
    try:
        return session_worktree(root, parse_resource_key(resource_key))
    except InvalidName:
        return None


@router.get("/sessions")
async def session_list(
    request: Request, session: Session, repo: str | None = None, offset: Offset = 0
) -> Response:
    repo_key = opt(repo)
    visible = await access.readable(request, session)

    def _read(conn: Connection) -> tuple[str, SessionsPage]:
        stamp = marker(conn, visible)
        rows, total = sessions.list_page(conn, repo_key, PAGE_SIZE, offset, visible)
        page = SessionsPage(
            rows=[r.json() for r in rows],
            page=paging(offset, total),
            repo_keys=_repo_keys(conn, visible),
            params={"repo": repo_key},
        )
        return stamp, page

    stamp, page = await services(request).store.read(_read)
    return render(request, "sessions.html", page, session=session, stamp=stamp)


@router.get("/repos")
async def repo_list(request: Request, session: Operator) -> Response:
    def _read(conn: Connection) -> tuple[str, ReposPage]:
        stamp = audit.change_marker(conn)
        blocked_filter = task_reads.TaskFilter(state=TaskState.BLOCKED_WORKSPACE.value, limit=200)
        blocked, _ = task_reads.list_page(conn, blocked_filter)
        counts: dict[str, dict[str, int]] = {}
        for state in values(ACTIVE_STATES | {TaskState.QUEUED}):
            for row in task_reads.list_page(conn, task_reads.TaskFilter(state=state, limit=1000))[
                0
            ]:
                per = counts.setdefault(row.repo_key, {})
                per[state] = per.get(state, 0) + 1
        page = ReposPage(
            rows=[r.json() for r in repos.list_all(conn)],
            blocked=[r.json() for r in blocked],
            counts=counts,
            roots=[r.json() for r in environments.all_roots(conn)],
        )
        return stamp, page

    stamp, page = await services(request).store.read(_read)
    return render(request, "repos.html", page, session=session, stamp=stamp)


@router.get("/deliveries")
async def delivery_list(
    request: Request,
    session: Operator,
    status: str | None = None,
    repo: str | None = None,
    offset: Offset = 0,
) -> Response:
    params: Params = {"status": opt(status), "repo": opt(repo)}
    if params["status"] not in (None, *DELIVERY_STATUSES):
        params["status"] = None

    def _read(conn: Connection) -> tuple[str, DeliveriesPage]:
        stamp = audit.change_marker(conn)
        rows, total = deliveries.list_page(
            conn, params["status"], params["repo"], PAGE_SIZE, offset
        )
        page = DeliveriesPage(
            rows=rows,
            page=paging(offset, total),
            repo_keys=_repo_keys(conn),
            params=params,
            statuses=DELIVERY_STATUSES,
        )
        return stamp, page

    stamp, page = await services(request).store.read(_read)
    return render(request, "deliveries.html", page, session=session, stamp=stamp)


def _time(value: str | None) -> datetime | None:
    """A ``datetime-local`` field (or ISO-8601) read as UTC; raises ValueError."""
    text = opt(value)
    if text is None:
        return None
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def audit_params(
    task: str | None,
    session_key: str | None,
    repo: str | None,
    action: str | None,
    since: str | None,
    until: str | None,
) -> tuple[Params, audit.AuditQuery, str | None]:
    params: Params = {
        "task": opt(task),
        "session": opt(session_key),
        "repo": opt(repo),
        "action": opt(action),
        "since": opt(since),
        "until": opt(until),
    }
    error = None
    try:
        since_at, until_at = _time(since), _time(until)
    except ValueError:
        since_at = until_at = None
        error = "since and until must be dates and times, e.g. 2024-05-01T10:00 (UTC)"
    q = audit.AuditQuery(
        task_id=params["task"],
        session_key=params["session"],
        repo_key=params["repo"],
        action=params["action"],
        since=since_at,
        until=until_at,
    )
    return params, q, error


@router.get("/audit")
async def audit_search(
    request: Request,
    session: Operator,
    task: str | None = None,
    session_key: Annotated[str | None, Query(alias="session")] = None,
    repo: str | None = None,
    action: str | None = None,
    since: str | None = None,
    until: str | None = None,
    before: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
) -> Response:
    params, q, error = audit_params(task, session_key, repo, action, since, until)
    page_q = replace(q, limit=PAGE_SIZE, before_seq=before, newest_first=True)

    def _read(conn: Connection) -> tuple[str, AuditPage]:
        stamp = audit.change_marker(conn)
        found = [] if error else audit.query(conn, page_q)
        page = AuditPage(
            events=[e.json() for e in found],
            repo_keys=_repo_keys(conn),
            params=params,
            before=before,
            older=found[-1].seq if len(found) == PAGE_SIZE else None,
            error=error,
        )
        return stamp, page

    stamp, page = await services(request).store.read(_read)
    return render(request, "audit.html", page, session=session, stamp=stamp)
