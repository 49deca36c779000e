"""One Codex thread per issue or pull request: its parameters, its start or resume, and
the wait for its Gitea tools.

A thread starts with the session's worktree as ``cwd`` and ``approvalPolicy: never``. A
draft thread (review or plan mode) is read-only and gets no Gitea tools at all; a pull
request review's thread is read-only with the reading tools and submit_review; every
other thread reaches them only through the broker's ``/mcp``, with a capability of its
session (broker.py). MCP servers are set per thread, since ``turn/start`` cannot remove
one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from forgeflow.agent.appserver import AppServer
from forgeflow.agent.broker import Broker, Grant
from forgeflow.agent.jsonrpc import Json, RpcError
from forgeflow.agent.port import AgentError, Notice, SessionSpec

# The JSON-RPC error of ``thread/resume`` for a thread the app-server does not know.
RESUME_UNKNOWN = -32600

# How the runtime calls its app-server (with its own time limit and crash handling).
Call = Callable[[AppServer, str, Json], Awaitable[Json]]


def thread_params(broker: Broker, server: AppServer, spec: SessionSpec) -> Json:
    params: Json = {
        "cwd": spec.cwd,
        "approvalPolicy": "never",
        "sandbox": "read-only" if spec.read_only else "danger-full-access",
        "developerInstructions": spec.developer_instructions,
    }
    if spec.read_only and not spec.review:
        return params
    grant = Grant(
        server.key, spec.owner, spec.repo, session_key=spec.session_key, review=spec.review
    )
    capability = broker.grant(grant)
    server_cfg: Json = {
        "url": broker.mcp_url,
        "http_headers": {"Authorization": f"Bearer {capability}"},
    }
    if spec.review:  # a read-only sandbox asks before a writing tool; this one is the turn's
        server_cfg["tools"] = {"submit_review": {"approval_mode": "approve"}}
    params["config"] = {"mcp_servers": {"gitea": server_cfg}}
    return params


async def open_thread(call: Call, server: AppServer, spec: SessionSpec, params: Json) -> str:
    """Resume the session's thread when it has one, else start a new one."""
    if spec.thread_id and not spec.read_only:
        resumed = await _resume(call, server, spec.thread_id, params)
        if resumed is not None:
            return resumed
    try:
        result = await call(server, "thread/start", params)
    except RpcError as exc:
        raise AgentError("thread_start_failed", str(exc), retryable=True) from None
    return str(result["thread"]["id"])


async def _resume(call: Call, server: AppServer, thread_id: str, params: Json) -> str | None:
    """The resumed thread's id; None when the app-server no longer knows the thread (the
    turn's audit is told, and a new thread starts)."""
    server.mcp[thread_id] = asyncio.get_running_loop().create_future()
    try:
        result = await call(server, "thread/resume", {"threadId": thread_id, **params})
    except RpcError as exc:
        if exc.code != RESUME_UNKNOWN:
            raise AgentError("thread_resume_failed", str(exc), retryable=True) from None
        server.notices.append(
            Notice(
                0,
                "session.resume_failed",
                {"threadId": thread_id, "error": exc.rpc_message[:500]},
            )
        )
        server.mcp.pop(thread_id, None)
        return None
    return str(result["thread"]["id"])


async def mcp_ready(server: AppServer, thread_id: str, timeout: float) -> None:
    """Wait for the thread's Gitea tools: Codex does not wait for a thread's MCP servers
    before calling the model."""
    fut = server.mcp.setdefault(thread_id, asyncio.get_running_loop().create_future())
    try:
        async with asyncio.timeout(timeout):
            status = await fut
    except TimeoutError:
        raise AgentError(
            "mcp_initialize_timeout",
            "the thread's Gitea tools did not become ready",
            retryable=False,
        ) from None
    if status != "ready":
        raise AgentError(
            "mcp_start_failed", f"the thread's Gitea tools are {status}", retryable=False
        )
