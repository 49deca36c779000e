"""Git smart HTTP through `git http-backend` (CGI), guarded like Gitea's
routers/web/repo/githttp.go."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from typing import IO, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from .apibase import ApiError, Core, parse_basic
from .gitrepo import ZERO_SHA, GitRepo, git_env
from .state import Access, NotFound, Repo, User

_SERVICES = {"git-upload-pack", "git-receive-pack"}


def routes(core: Core) -> list[Route]:
    async def endpoint(request: Request) -> Response:
        return await serve(core, request)

    return [Route("/{owner}/{repo}/{rest:path}", endpoint, methods=["GET", "POST"])]


def _unauthorized() -> Response:
    # githttp.go httpBase: `Basic realm="Gitea"` so that git asks its credential helper.
    return PlainTextResponse(
        "Unauthorized\n", 401, headers={"WWW-Authenticate": 'Basic realm="Gitea"'}
    )


def _signed_in_user(core: Core, request: Request) -> User | None:
    """Basic auth whose password (or, with an empty password, user name) is a token."""
    basic = parse_basic(request.headers.get("authorization", ""))
    if basic is None:
        return None
    name, password = basic
    with core.state.lock:
        return core.state.user_for_token(name if password in ("", "x-oauth-basic") else password)


def _service_of(request: Request, rest: str) -> str | None:
    if rest == "info/refs":
        service = request.query_params.get("service", "")
        return service if service in _SERVICES else ""
    if request.method == "POST" and rest in _SERVICES:
        return rest
    if request.method == "GET" and (rest == "HEAD" or rest.startswith("objects/")):
        return ""  # dumb protocol files: read access
    return None


async def serve(core: Core, request: Request) -> Response:
    owner, name, rest = (request.path_params[k] for k in ("owner", "repo", "rest"))
    name = name.removesuffix(".git")
    service = _service_of(request, rest)
    if service is None:
        return PlainTextResponse("Not found\n", 404)
    write = service == "git-receive-pack"
    user = _signed_in_user(core, request)
    with core.state.lock:
        try:
            repo: Repo | None = core.state.repo_by_name(owner, name)
        except NotFound:
            repo = None
        # "Only public pull don't need auth."
        public_pull = repo is not None and not repo.private and not write
        if not public_pull and user is None:
            return _unauthorized()
        if repo is None:
            return PlainTextResponse("Repository not found", 404)
        needed = Access.WRITE if write else Access.READ
        if core.state.access(repo, user) < needed:
            return PlainTextResponse("Repository not found", 404)
        relative = repo.path.relative_to(core.state.git_root).as_posix()
        before = GitRepo(repo.path).refs() if write and rest != "info/refs" else None
    body = await _spool(request)
    env = _cgi_env(core, request, f"/{relative}/{rest}", _size(body), user)
    proc = await asyncio.create_subprocess_exec(
        "git",
        "http-backend",
        stdin=body,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
    )
    body.close()
    assert proc.stdout is not None
    status, headers = await _read_cgi_headers(proc.stdout)

    async def stream() -> AsyncIterator[bytes]:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65536):
            yield chunk
        await proc.wait()
        if before is not None and repo is not None and user is not None:
            await run_in_threadpool(_after_push, core, repo, user, before)

    return StreamingResponse(stream(), status, headers)


def _cgi_env(
    core: Core, request: Request, path_info: str, length: int, user: User | None
) -> dict[str, str]:
    """The CGI environment ``git http-backend`` reads for this request."""
    env = git_env(
        {
            "GIT_PROJECT_ROOT": str(core.state.git_root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": path_info,
            "REQUEST_METHOD": request.method,
            "QUERY_STRING": request.url.query,
            "CONTENT_TYPE": request.headers.get("content-type", ""),
            "CONTENT_LENGTH": str(length),
            "REMOTE_ADDR": request.client.host if request.client else "127.0.0.1",
            "HTTP_CONTENT_ENCODING": request.headers.get("content-encoding", ""),
            "HTTP_GIT_PROTOCOL": request.headers.get("git-protocol", ""),
        }
    )
    if user is not None:
        env["REMOTE_USER"] = user.login
    return env


async def _spool(request: Request) -> IO[bytes]:
    """The request body in a temporary file (git pushes can be large)."""
    spool = tempfile.TemporaryFile()  # noqa: SIM115 - closed once handed to the CGI
    async for chunk in request.stream():
        await run_in_threadpool(spool.write, chunk)
    spool.seek(0)
    return spool


def _size(handle: IO[bytes]) -> int:
    position = handle.tell()
    handle.seek(0, 2)
    size = handle.tell()
    handle.seek(position)
    return size


async def _read_cgi_headers(stdout: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    status = 200
    headers: dict[str, str] = {}
    while True:
        line = (await stdout.readline()).decode("latin-1").rstrip("\r\n")
        if not line:
            return status, headers
        key, _, value = line.partition(":")
        if key.lower() == "status":
            status = int(value.strip().split(" ", 1)[0])
        else:
            headers[key.strip()] = value.strip()


def _after_push(core: Core, repo: Repo, pusher: User, before: dict[str, str]) -> None:
    """What Gitea's post-receive hook triggers: push/create/delete and pull_request
    synchronized webhooks for the branches that moved."""
    with core.state.lock:
        after = GitRepo(repo.path).refs()
        changes: dict[str, Any] = {}
        for ref in sorted(set(before) | set(after)):
            old, new = before.get(ref, ZERO_SHA), after.get(ref, ZERO_SHA)
            if old != new:
                changes[ref] = (old, new)
        try:
            tasks = core.service.push_tasks(repo, pusher, changes) if changes else []
        except (ApiError, LookupError, ValueError):
            tasks = []
    core.deliverer.enqueue(tasks)
