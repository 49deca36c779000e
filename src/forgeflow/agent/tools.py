"""The Gitea tool broker: one Gitea MCP server per forgeflow process, outside every
jail, holding the bot token; each session sees only its own repository through it.

The upstream server is the official Go ``gitea-mcp -t stdio`` or PyPI's ``gitea-mcp``
(``FORGEFLOW_GITEA_MCP_COMMAND``); both variable pairs are set so either works, and the
comment tool is found with ``tools/list``:

- PyPI ``gitea-mcp``: env ``GITEA_URL``/``GITEA_TOKEN``, tool ``add_comment``.
- official ``gitea-mcp``: env ``GITEA_HOST``/``GITEA_ACCESS_TOKEN``, tool ``issue_write``
  with ``method: "add_comment"`` (older releases: ``create_issue_comment``).

A session is offered only tools that name a repository (``owner`` and ``repo``
required), less those that write past the session's branch (merges, file writes through
the API, releases, forks, deletions). A call on another repository is refused with a
tool error and reported (``mcp.refused``); it never reaches Gitea.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import structlog

import forgeflow
from forgeflow.agent.broker import Grant
from forgeflow.agent.jsonrpc import Json, ProcessGone, RpcError, RpcProcess, RpcTimeout
from forgeflow.agent.port import AgentError, CommentTool
from forgeflow.domain.publish import PUSH_TOOL

log = structlog.get_logger("forgeflow.tools")

MCP_PROTOCOL_VERSION = "2025-06-18"

_KNOWN = (
    CommentTool("add_comment", "owner, repo, issue_number, body"),
    CommentTool("issue_write", 'method: "add_comment", owner, repo, index, body'),
    CommentTool("create_issue_comment", "owner, repo, index, body"),
)
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

Refused = Callable[[Grant, str, dict[str, Any], str], None]
Publish = Callable[[str], Awaitable[tuple[bool, str]]]  # session key -> (ok, what happened)

_PUSH_SCHEMA: Json = {
    "name": PUSH_TOOL,
    "description": (
        "Push your session branch to its branch on Gitea now (forgeflow also pushes it "
        "when your turn ends): fast-forward only, never the default branch. Call it "
        "after committing and before opening a pull request. Says what happened."
    ),
    "inputSchema": {
        "type": "object",
        "properties": {
            "owner": {"type": "string", "description": "the repository's owner"},
            "repo": {"type": "string", "description": "the repository's name"},
        },
        "required": ["owner", "repo"],
    },
}


def mcp_env(gitea_url: str, token: str) -> dict[str, str]:
    """Both servers' variable names; only the broker's upstream server sees them."""
    return {
        "GITEA_URL": gitea_url,
        "GITEA_TOKEN": token,
        "GITEA_HOST": gitea_url,
        "GITEA_ACCESS_TOKEN": token,
    }


def resolve_command(argv: list[str]) -> str:
    found = shutil.which(argv[0])
    if found is None:
        raise AgentError(
            "mcp_command_missing",
            f"the Gitea MCP command {argv[0]!r} was not found",
            retryable=False,
        )
    return found


def scoped(tool: Json) -> bool:
    """Whether a session may be offered ``tool``: it must name one repository."""
    name = str(tool.get("name") or "")
    required = set((tool.get("inputSchema") or {}).get("required") or ())
    return {"owner", "repo"} <= required and not name.startswith(_WITHHELD_PREFIXES)


def comment_tool_of(tools: list[Json]) -> CommentTool:
    names = {str(t.get("name")) for t in tools}
    for tool in _KNOWN:
        if tool.name in names:
            return tool
    raise AgentError(
        "mcp_comment_tool_missing",
        "the Gitea MCP server offers no comment tool "
        f"(looked for {', '.join(t.name for t in _KNOWN)})",
        retryable=False,
    )


async def handshake(proc: RpcProcess, timeout: float) -> list[Json]:
    """``initialize`` + ``tools/list`` with a stable error code for each failure."""
    try:
        await proc.request(
            "initialize",
            {
                "protocolVersion": MCP_PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "forgeflow", "version": forgeflow.__version__},
            },
            timeout,
        )
        await proc.notify("notifications/initialized")
        listed = await proc.request("tools/list", {}, timeout)
    except ProcessGone:
        raise AgentError(
            "mcp_exited", "the Gitea MCP server exited during start-up", retryable=False
        ) from None
    except RpcTimeout:
        raise AgentError(
            "mcp_initialize_timeout",
            f"the Gitea MCP server did not answer initialize within {timeout:g}s",
            retryable=False,
        ) from None
    except RpcError as exc:
        raise AgentError(
            "mcp_initialize_failed",
            f"the Gitea MCP handshake failed: {exc.rpc_message}",
            retryable=False,
        ) from None
    return [t for t in listed.get("tools", []) if isinstance(t, dict)]


async def spawn_server(
    argv: list[str],
    env: dict[str, str],
    stderr_path: Path | None = None,
    *,
    elicitation: str = "decline",
) -> RpcProcess:
    command = resolve_command(argv)
    proc: RpcProcess | None = None

    async def answer(msg: Json) -> None:
        # The server's own requests: forgeflow is its only client and asks no person, so
        # an elicitation gets FORGEFLOW_ELICITATION_POLICY's answer (accepting fills in
        # the requested form's defaults).
        if "id" not in msg or proc is None:
            return
        method = str(msg.get("method"))
        params = msg.get("params") or {}
        if method == "ping":
            await proc.respond(msg["id"], {})
        elif method == "elicitation/create":
            log.info(
                "mcp.elicitation", answer=elicitation, message=str(params.get("message"))[:200]
            )
            await proc.respond(msg["id"], _elicitation_answer(elicitation, params))
        elif method == "roots/list":
            await proc.respond(msg["id"], {"roots": []})
        else:
            await proc.respond_error(msg["id"], -32601, f"{method} is not supported")

    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    try:
        proc = await RpcProcess.spawn(
            [command, *argv[1:]], env={**base, **env}, on_message=answer, stderr_path=stderr_path
        )
    except OSError as exc:
        raise AgentError(
            "mcp_start_failed", f"the Gitea MCP server did not start: {exc}", retryable=False
        ) from None
    return proc


def _elicitation_answer(policy: str, params: Json) -> Json:
    if policy != "accept":
        return {"action": "decline"}
    properties = (params.get("requestedSchema") or {}).get("properties") or {}
    content = {
        k: v["default"] for k, v in properties.items() if isinstance(v, dict) and "default" in v
    }
    return {"action": "accept", "content": content}


class GiteaTools:
    """The relay behind the broker's ``/mcp``: one upstream server, started on first use
    and again if it died; scoped lists and calls per session."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        *,
        timeout: float,
        call_timeout: float = 120.0,
        stderr_path: Path | None = None,
        on_refused: Refused,
        elicitation: str = "decline",
        publish: Publish | None = None,
    ) -> None:
        # Only ever used together: how the upstream server is started (again, if it died).
        self._spawn = partial(spawn_server, argv, env, stderr_path, elicitation=elicitation)
        self._timeout, self._call_timeout = timeout, call_timeout
        self._on_refused = on_refused
        self._publish = publish
        self._proc: RpcProcess | None = None
        self._tools: list[Json] = []
        self._lock = asyncio.Lock()

    async def _upstream(self) -> RpcProcess:
        async with self._lock:
            if self._proc is not None and not self._proc.closed.is_set():
                return self._proc
            if self._proc is not None:
                await self._proc.close()
            proc = await self._spawn()
            try:
                self._tools = await handshake(proc, self._timeout)
            except AgentError:
                await proc.close()
                raise
            self._proc = proc
            return proc

    async def comment_tool(self) -> CommentTool:
        await self._upstream()
        return comment_tool_of(self._tools)

    async def aclose(self) -> None:
        if self._proc is not None:
            await self._proc.close()
            self._proc = None

    async def handle(self, grant: Grant, message: Json) -> Json | None:
        """Answer one JSON-RPC message a session's Codex sent to ``/mcp``."""
        if "id" not in message or "method" not in message:
            return None  # notifications and responses need no answer
        rid, method = message["id"], str(message["method"])
        params = message.get("params") or {}
        try:
            result = await self._answer(grant, method, params)
        except AgentError as exc:
            return _error(rid, -32603, f"{exc.code}: {exc}")
        except RpcError as exc:
            return _error(rid, exc.code or -32603, exc.rpc_message)
        except (RpcTimeout, ProcessGone) as exc:
            return _error(rid, -32603, f"the Gitea MCP server did not answer: {exc}")
        if result is None:
            return _error(rid, -32601, f"method {method!r} is not offered")
        return {"jsonrpc": "2.0", "id": rid, "result": result}

    async def _answer(self, grant: Grant, method: str, params: Json) -> Json | None:
        if method == "initialize":
            return {
                "protocolVersion": str(params.get("protocolVersion") or MCP_PROTOCOL_VERSION),
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": "forgeflow-gitea", "version": forgeflow.__version__},
                "instructions": f"Gitea tools for {grant.owner}/{grant.repo} only.",
            }
        if method == "ping":
            return {}
        if method == "tools/list":
            await self._upstream()
            return {"tools": self._offered()}
        if method == "tools/call":
            return await self._call(grant, params)
        return None

    def _offered(self) -> list[Json]:
        offered = [t for t in self._tools if scoped(t)]
        return [*offered, _PUSH_SCHEMA] if self._publish is not None else offered

    async def _call(self, grant: Grant, params: Json) -> Json:
        proc = await self._upstream()
        name = str(params.get("name") or "")
        args = params.get("arguments") or {}
        if not isinstance(args, dict):
            args = {}
        tool = next((t for t in self._offered() if t.get("name") == name), None)
        why = None
        if tool is None:
            why = f"the tool {name!r} is not offered to this session"
        elif not _same(args.get("owner"), grant.owner) or not _same(args.get("repo"), grant.repo):
            why = (
                f"this session may use the Gitea tools on {grant.owner}/{grant.repo} only, "
                f"not on {args.get('owner')}/{args.get('repo')}"
            )
        if why is not None:
            self._on_refused(grant, name, args, why)
            return {"content": [{"type": "text", "text": f"refused: {why}"}], "isError": True}
        if name == PUSH_TOOL and self._publish is not None and grant.session_key:
            ok, text = await self._publish(grant.session_key)
            return {"content": [{"type": "text", "text": text}], "isError": not ok}
        return await proc.request("tools/call", params, self._call_timeout)


def _same(value: Any, expected: str) -> bool:
    # Gitea's owner and repository names are case-insensitive.
    return isinstance(value, str) and value.casefold() == expected.casefold()


def _error(rid: Any, code: int, message: str) -> Json:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}
