"""The Starlette application: /api/v1 routes, git smart HTTP, fault injection, request log."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import (
    api_attachments,
    api_code,
    api_hooks,
    api_issues,
    api_oauth,
    api_reactions,
    api_reviews,
    api_threads,
    git_http,
)
from .apibase import (
    ApiError,
    Call,
    Core,
    Handler,
    RouteSpec,
    authenticate,
    empty,
    error_body,
    json_response,
    not_found,
    paginate,
)
from .gitrepo import GitRepo
from .state import Access, NotFound, Repo
from .web_oauth import OAuthWeb

# -- users, repositories, permissions ------------------------------------------------


def get_version(call: Call) -> Response:
    return json_response({"version": call.core.version})


def get_user(call: Call) -> Response:
    doer = call.token_user()
    return json_response(call.convert.user_for(doer, doer))


def get_user_by_name(call: Call) -> Response:
    return json_response(call.convert.user_for(call.user_param("username"), call.doer))


def get_repo(call: Call) -> Response:
    repo, _ = call.repo()
    return json_response(call.convert.repo(repo, call.doer))


def get_permission(call: Call) -> Response:
    """Gitea routers/api/v1/repo/collaborators.go GetRepoPermissions."""
    repo, mode = call.repo()
    doer = call.token_user()
    name = call.params["collaborator"]
    # "Only admins can query all permissions, repo admins can query all repo permissions,
    # collaborators can query only their own"
    if not doer.is_admin and doer.login.lower() != name.lower() and mode < Access.ADMIN:
        raise ApiError(
            403,
            "Only admins can query all permissions, repo admins can query all repo "
            "permissions, collaborators can query only their own",
        )
    user = call.user_param("collaborator")
    access = call.state.access(repo, user)
    # convert.ToUserAndPermission: permission and role_name are AccessMode.String()
    return json_response(
        {
            "permission": access.label,
            "role_name": access.label,
            "user": call.convert.user_for(user, doer),
        }
    )


def is_collaborator(call: Call) -> Response:
    repo, _ = call.repo()
    call.token_user()
    user = call.user_param("collaborator", status=422)
    return empty(204) if user.id in repo.collaborators else empty(404)


def put_collaborator(call: Call) -> Response:
    """Gitea AddOrUpdateCollaborator: permission defaults to write; 204."""
    repo, _ = call.repo_admin()
    user = call.user_param("collaborator", status=422)
    text = str(call.form().get("permission") or "write")
    mode = Access.parse(text) if text in ("read", "write", "admin") else Access.WRITE
    repo.collaborators[user.id] = mode
    return empty(204)


def delete_collaborator(call: Call) -> Response:
    repo, _ = call.repo_admin()
    user = call.user_param("collaborator", status=422)
    repo.collaborators.pop(user.id, None)
    return empty(204)


def list_branches(call: Call) -> Response:
    repo, mode = call.repo()
    git = GitRepo(repo.path)
    branches = sorted(r for r in git.refs() if r.startswith("refs/heads/"))
    items = [_branch(call, repo, mode, ref.removeprefix("refs/heads/")) for ref in branches]
    page, headers = paginate(call, items)
    return json_response(page, headers=headers)


def get_branch(call: Call) -> Response:
    repo, mode = call.repo()
    sha = GitRepo(repo.path).branch_sha(call.params["branch"])
    if sha is None:
        raise not_found("branch does not exist")
    return json_response(_branch(call, repo, mode, call.params["branch"], sha))


def _branch(
    call: Call, repo: Repo, mode: Access, name: str, sha: str | None = None
) -> dict[str, Any]:
    """Gitea convert.ToBranch (structs.Branch) for an unprotected branch."""
    git = GitRepo(repo.path)
    if sha is None:
        sha = git.branch_sha(name) or ""
    return {
        "name": name,
        "commit": call.service.payloads.payload_commit(repo, git.commit_info(sha)),
        "protected": False,
        "required_approvals": 0,
        "enable_status_check": False,
        "status_check_contexts": [],
        "user_can_push": mode >= Access.WRITE,
        "user_can_merge": mode >= Access.WRITE,
        "effective_branch_protection_name": "",
    }


# -- labels ---------------------------------------------------------------------------


def list_labels(call: Call) -> Response:
    repo, _ = call.repo()
    page, headers = paginate(call, [call.convert.label(x) for x in call.state.repo_labels(repo)])
    return json_response(page, headers=headers)


def create_label(call: Call) -> Response:
    """Gitea CreateLabel: needs issue write access; color "#rrggbb" or "rrggbb"; 201."""
    repo, mode = call.repo()
    call.token_user()
    if mode < Access.WRITE:
        raise ApiError(403, "write access to issues is required")
    form = call.form()
    name, color = str(form.get("name") or ""), str(form.get("color") or "").lstrip("#")
    if (
        not name
        or len(color) not in (3, 6)
        or any(c not in "0123456789abcdefABCDEF" for c in color)
    ):
        raise ApiError(422, "name and a hex color are required")
    label = call.service.create_label(
        repo, name, color, str(form.get("description") or ""), bool(form.get("exclusive"))
    )
    return json_response(call.convert.label(label), 201)


def get_label(call: Call) -> Response:
    repo, _ = call.repo()
    try:
        return json_response(call.convert.label(call.state.label_of(repo, call.int_param("id"))))
    except NotFound:
        raise not_found() from None


ROUTES: list[RouteSpec] = [
    ("GET", "/version", get_version),
    ("GET", "/user", get_user),
    ("GET", "/users/{username}", get_user_by_name),
    ("GET", "/repos/{owner}/{repo}", get_repo),
    ("GET", "/repos/{owner}/{repo}/collaborators/{collaborator}", is_collaborator),
    ("PUT", "/repos/{owner}/{repo}/collaborators/{collaborator}", put_collaborator),
    ("DELETE", "/repos/{owner}/{repo}/collaborators/{collaborator}", delete_collaborator),
    ("GET", "/repos/{owner}/{repo}/collaborators/{collaborator}/permission", get_permission),
    ("GET", "/repos/{owner}/{repo}/branches", list_branches),
    ("GET", "/repos/{owner}/{repo}/branches/{branch:path}", get_branch),
    ("GET", "/repos/{owner}/{repo}/labels", list_labels),
    ("POST", "/repos/{owner}/{repo}/labels", create_label),
    ("GET", "/repos/{owner}/{repo}/labels/{id}", get_label),
    *api_hooks.ROUTES,
    *api_code.ROUTES,
    *api_reviews.ROUTES,
    *api_threads.ROUTES,
    *api_issues.ROUTES,
    *api_reactions.ROUTES,
    *api_oauth.ROUTES,
    *api_attachments.ROUTES,
]


def _endpoint(core: Core, handler: Handler) -> Any:
    async def endpoint(request: Request) -> Response:
        body = await request.body()
        query = dict(request.query_params)

        def run() -> Response:
            try:
                doer = authenticate(core.state, request.headers.get("authorization", ""), query)
                call = Call(core, request.method, request.path_params, query, body, doer)
                with core.state.lock:
                    return handler(call)
            except ApiError as error:
                return json_response(error_body(core, error), error.status)
            except NotFound as exc:
                return json_response(error_body(core, not_found(str(exc))), 404)
            except (LookupError, ValueError) as exc:
                return json_response(error_body(core, ApiError(422, str(exc))), 422)

        # Inline on the server's loop: every handler holds the state lock, so requests
        # run one at a time anyway, and a hop to a worker thread cost more than most
        # handlers (the dispatch benchmark's Gitea traffic shares this machine).
        return run()

    return endpoint


class Instrumentation:
    """ASGI middleware: fault injection (emu.fail_next) and the request log (emu.requests)."""

    def __init__(self, app: ASGIApp, core: Core) -> None:
        self.app = app
        self.core = core

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        status_seen = 0

        async def record(message: Message) -> None:
            nonlocal status_seen
            if message["type"] == "http.response.start":
                status_seen = int(message["status"])
            await send(message)

        # Logged on arrival (its status filled in after): a client that has its answer
        # must find its request in the log (the list only grows, so the slot stays).
        with self.core.state.lock:
            slot = len(self.core.state.requests)
            self.core.state.requests.append((method, path, 0))
        fault = self._take_fault(method, path)
        try:
            if fault is not None and fault[2]:  # handled, then its answer held
                held = fault[1]

                async def late(message: Message) -> None:
                    if message["type"] == "http.response.start":
                        await asyncio.sleep(held)
                    await record(message)

                await self.app(scope, receive, late)
                return
            if fault is not None:
                status, delay, _ = fault
                if delay > 0:
                    await asyncio.sleep(delay)
                if status:
                    body = {"message": f"injected fault {secrets.token_hex(4)}", "url": ""}
                    await json_response(body, status)(scope, receive, record)
                    return
            await self.app(scope, receive, record)
        finally:
            with self.core.state.lock:
                self.core.state.requests[slot] = (method, path, status_seen)

    def _take_fault(self, method: str, path: str) -> tuple[int, float, bool] | None:
        with self.core.state.lock:
            for fault in self.core.state.faults:
                if fault.method not in ("*", method.upper()) or not fault.pattern.search(path):
                    continue
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self.core.state.faults.remove(fault)
                return fault.status, fault.delay, fault.after
        return None


_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def _no_route(call: Call) -> Response:
    # Gitea answers unknown API paths with its JSON 404.
    raise not_found()


def build_app(core: Core) -> ASGIApp:
    routes = [
        Route(f"/api/v1{path}", _endpoint(core, handler), methods=[method])
        for method, path, handler in ROUTES
    ]
    routes.append(Route("/api/v1/{rest:path}", _endpoint(core, _no_route), methods=_ALL_METHODS))
    routes += OAuthWeb(core).routes()  # before git's /{owner}/{repo}... paths
    routes += api_attachments.web_routes(core)
    routes += git_http.routes(core)
    app = Starlette(routes=routes)
    return Instrumentation(app, core)
