"""Preflight of the Gitea MCP server (ARCHITECTURE §8, three rows): before a thread is
started with it, the command must exist, stay up and complete the MCP handshake; the
comment tool's name is discovered with ``tools/list`` so both servers work.

- PyPI ``gitea-mcp``: env ``GITEA_URL``/``GITEA_TOKEN``, tool ``add_comment``.
- official Go ``gitea-mcp``: env ``GITEA_HOST``/``GITEA_ACCESS_TOKEN``, tool ``issue_write``
  with ``method: "add_comment"`` (older releases: ``create_issue_comment``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from forgeflow.agent.jsonrpc import Json, ProcessGone, RpcError, RpcProcess, RpcTimeout
from forgeflow.agent.port import AgentError, CommentTool

MCP_PROTOCOL_VERSION = "2025-06-18"


_KNOWN = (
    CommentTool("add_comment", "owner, repo, issue_number, body"),
    CommentTool("issue_write", 'method: "add_comment", owner, repo, index, body'),
    CommentTool("create_issue_comment", "owner, repo, index, body"),
)


def mcp_env(gitea_url: str, token: str) -> dict[str, str]:
    """Both servers' variable names; only this thread's MCP server ever sees them."""
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


async def preflight(
    argv: list[str], env: dict[str, str], *, timeout: float = 20.0, stderr_path: Path | None = None
) -> CommentTool:
    command = resolve_command(argv)

    async def ignore(_msg: Json) -> None:
        return None

    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    try:
        proc = await RpcProcess.spawn(
            [command, *argv[1:]], env={**base, **env}, on_message=ignore, stderr_path=stderr_path
        )
    except OSError as exc:
        raise AgentError(
            "mcp_start_failed", f"the Gitea MCP server did not start: {exc}", retryable=False
        ) from None
    try:
        await proc.request(
            "initialize",
            {
                "protocolVersion": MCP_PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "forgeflow-preflight", "version": "1"},
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
    finally:
        await proc.close()
    names = {str(t.get("name")) for t in listed.get("tools", []) if isinstance(t, dict)}
    for tool in _KNOWN:
        if tool.name in names:
            return tool
    raise AgentError(
        "mcp_comment_tool_missing",
        "the Gitea MCP server offers no comment tool "
        f"(looked for {', '.join(t.name for t in _KNOWN)})",
        retryable=False,
    )
