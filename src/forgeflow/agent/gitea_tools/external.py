"""The opt-in external Gitea MCP server (``FORGEFLOW_GITEA_MCP_COMMAND``), reached with
the ``mcp`` SDK's stdio client and offered after forgeflow's own tools.

Supported: PyPI ``gitea-mcp`` (env ``GITEA_URL``/``GITEA_TOKEN``) and the official Go
server ``gitea-mcp -t stdio`` (env ``GITEA_HOST``/``GITEA_ACCESS_TOKEN``); both pairs are
set. Its tools take an owner and a repository, so a session is offered only those that
name one (``owner`` and ``repo`` required), less those that write past the session's
branch, and a call passes only when:

- ``owner``/``repo`` are the session's repository (Gitea names are case-insensitive);
- every other string that such a server may put into a URL path is one name (no ``/``,
  ``\\``, ``%``, ``..``, no URL), or for a file path argument a relative path without
  ``..`` (``args.check_path``). Free text (bodies, titles, queries) is not checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anyio
import structlog
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.shared.context import RequestContext
from mcp.shared.exceptions import McpError

from forgeflow.agent.broker import Grant
from forgeflow.agent.gitea_tools.args import check_name, check_path
from forgeflow.agent.port import AgentError
from forgeflow.domain.json import JsonObject

log = structlog.get_logger("forgeflow.tools.external")

# Tools that name a repository but reach past what a session may change: the default
# branch (merges, file writes through the API), releases, other repositories (forks,
# transfers), or destroy something.
_WITHHELD_PREFIXES = (
    "merge",
    "commit",
    "create_file",
    "update_file",
    "delete",
    "create_release",
    "fork",
    "transfer",
    "create_repo",
    "migrate",
)
_TEXT_KEYS = frozenset(
    {
        "body",
        "title",
        "content",
        "message",
        "description",
        "query",
        "q",
        "keyword",
        "new_content",
        "comment",
        "note",
        "method",
        "state",
        "type",
        "sort",
        "order",
    }
)
_PATH_KEYS = frozenset({"path", "filepath", "file_path", "filename", "dir", "directory"})


def mcp_env(gitea_url: str, token: str) -> dict[str, str]:
    """Both servers' variable names; only the external server's process sees them."""
    return {
        "GITEA_URL": gitea_url,
        "GITEA_TOKEN": token,
        "GITEA_HOST": gitea_url,
        "GITEA_ACCESS_TOKEN": token,
    }


def resolve_command(argv: list[str]) -> str:
    found = shutil.which(argv[0]) if argv else None
    if found is None:
        raise AgentError(
            "mcp_command_missing",
            f"the Gitea MCP command {argv[0] if argv else ''!r} was not found "
            "(FORGEFLOW_GITEA_MCP_COMMAND; unset it to use forgeflow's own tools only)",
            retryable=False,
        )
    return found


def scoped(tool: types.Tool) -> bool:
    """Whether a session may be offered ``tool``: it must name one repository."""
    required = set(tool.inputSchema.get("required") or ())
    return {"owner", "repo"} <= required and not tool.name.startswith(_WITHHELD_PREFIXES)


def _same(value: Any, expected: str) -> bool:
    return isinstance(value, str) and value.casefold() == expected.casefold()


def _strings(value: Any, key: str) -> Iterable[tuple[str, str]]:
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict):
        for k, v in value.items():
            if str(k) not in _TEXT_KEYS:
                yield from _strings(v, str(k))
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v, key)


def refusal(grant: Grant, arguments: JsonObject) -> str | None:
    """Why a call with ``arguments`` would leave the session's repository, or None."""
    owner, repo = arguments.get("owner"), arguments.get("repo")
    if not _same(owner, grant.owner) or not _same(repo, grant.repo):
        return (
            f"this session may use the Gitea tools on {grant.owner}/{grant.repo} only, "
            f"not on {owner}/{repo}"
        )
    rest = {k: v for k, v in arguments.items() if k not in ("owner", "repo")}
    for key, value in _strings(rest, ""):
        try:
            if key in _PATH_KEYS:
                check_path(value)
            else:
                check_name(value)
        except ValueError as exc:
            return f"argument {key or 'value'}: {exc}"
    return None


def _elicitation(policy: str) -> Any:
    async def answer(
        _ctx: RequestContext[ClientSession, Any], params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        # forgeflow is the server's only client and asks no person: the answer is
        # FORGEFLOW_ELICITATION_POLICY's (accepting fills in the form's defaults).
        log.info("mcp.elicitation", answer=policy, message=str(params.message)[:200])
        if policy != "accept":
            return types.ElicitResult(action="decline")
        schema = getattr(params, "requestedSchema", None) or {}
        content = {
            k: v["default"]
            for k, v in (schema.get("properties") or {}).items()
            if isinstance(v, dict) and "default" in v
        }
        return types.ElicitResult(action="accept", content=content)

    return answer


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _start_error(exc: Exception) -> AgentError:
    """The stable code of a failed start: the process exited, or the handshake failed."""
    leaves = _leaves(exc)
    for leaf in leaves:
        if isinstance(leaf, AgentError):
            return leaf
    closed = any(
        (isinstance(leaf, McpError) and leaf.error.code == types.CONNECTION_CLOSED)
        or isinstance(
            leaf,
            anyio.ClosedResourceError
            | anyio.BrokenResourceError
            | anyio.EndOfStream
            | BrokenPipeError,
        )
        for leaf in leaves
    )
    if closed:
        return AgentError(
            "mcp_exited", "the Gitea MCP server exited during start-up", retryable=False
        )
    first = leaves[0]
    return AgentError(
        "mcp_initialize_failed",
        f"the Gitea MCP handshake failed: {type(first).__name__}: {str(first)[:300]}",
        retryable=False,
    )


class External:
    """One external server for the process: started on first use, again if it died."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        *,
        timeout: float,
        call_timeout: float = 120.0,
        stderr_path: Path | None = None,
        elicitation: str = "decline",
    ) -> None:
        self._argv, self._env = argv, env
        self._timeout, self._call_timeout = timeout, call_timeout
        self._stderr_path, self._elicitation = stderr_path, elicitation
        self._session: ClientSession | None = None
        self._tools: list[types.Tool] = []
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()

    async def _connected(self) -> ClientSession:
        async with self._lock:
            if self._session is not None and self._task is not None and not self._task.done():
                return self._session
            command = resolve_command(self._argv)
            ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
            self._stop = asyncio.Event()
            self._task = asyncio.create_task(self._serve(command, ready), name="gitea-mcp")
            try:
                async with asyncio.timeout(self._timeout):
                    self._session = await ready
            except TimeoutError:
                self._task.cancel()
                raise AgentError(
                    "mcp_initialize_timeout",
                    f"the Gitea MCP server did not answer initialize within {self._timeout:g}s",
                    retryable=False,
                ) from None
            return self._session

    async def _serve(self, command: str, ready: asyncio.Future[ClientSession]) -> None:
        # The SDK's client is a pair of context managers (anyio task groups): they are
        # entered and left in this one task, which lives as long as the connection.
        base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
        params = StdioServerParameters(
            command=command, args=self._argv[1:], env={**base, **self._env}
        )
        log_path = self._stderr_path or Path(os.devnull)
        if self._stderr_path is not None:
            self._stderr_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("a") as errlog:
            try:
                async with (
                    stdio_client(params, errlog=errlog) as (read, write),
                    ClientSession(
                        read, write, elicitation_callback=_elicitation(self._elicitation)
                    ) as session,
                ):
                    await session.initialize()
                    self._tools = (await session.list_tools()).tools
                    ready.set_result(session)
                    await self._stop.wait()
            except Exception as exc:
                self._failed(ready, exc)

    @staticmethod
    def _failed(ready: asyncio.Future[ClientSession], exc: Exception) -> None:
        if ready.done():
            log.warning("mcp.external_gone", error=type(exc).__name__)
            return
        ready.set_exception(_start_error(exc))

    async def tools(self, *, exclude: set[str]) -> list[types.Tool]:
        await self._connected()
        return [t for t in self._tools if scoped(t) and t.name not in exclude]

    async def offers(self, name: str) -> bool:
        await self._connected()
        return any(t.name == name and scoped(t) for t in self._tools)

    def refusal(self, grant: Grant, _name: str, arguments: JsonObject) -> str | None:
        return refusal(grant, arguments)

    async def call(self, name: str, arguments: JsonObject) -> types.CallToolResult:
        session = await self._connected()
        try:
            async with asyncio.timeout(self._call_timeout):
                return await session.call_tool(name, arguments)
        except TimeoutError:
            return types.CallToolResult(
                content=[
                    types.TextContent(type="text", text="the Gitea MCP server did not answer")
                ],
                isError=True,
            )

    async def aclose(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._task, 10)
        self._session = None
