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
from forgeflow.domain.rollout import Rollout

# The JSON-RPC error of ``thread/resume`` for a thread the app-server does not know.
RESUME_UNKNOWN = -32600

# How the runtime calls its app-server (with its own time limit and crash handling).
Call = Callable[[AppServer, str, Json], Awaitable[Json]]
# Writes a kept rollout into the app-server's jail; the path to resume it from.
Restore = Callable[[Rollout], Awaitable[str | None]]


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


async def open_thread(
    call: Call, server: AppServer, spec: SessionSpec, params: Json, restore: Restore
) -> str:
    """Resume the session's thread when it has one (restored from what another worker
    kept when this app-server does not know it), else start a new one."""
    if spec.thread_id and not spec.read_only:
        resumed = await _resume(call, server, spec.thread_id, params)
        if resumed is None:
            resumed = await _restore(call, server, spec, params, restore)
        if resumed is not None:
            return resumed
    try:
        result = await call(server, "thread/start", params)
    except RpcError as exc:
        raise AgentError("thread_start_failed", str(exc), retryable=True) from None
    return str(result["thread"]["id"])


async def _resume(
    call: Call, server: AppServer, thread_id: str, params: Json, path: str | None = None
) -> str | None:
    """The resumed thread's id; None when the app-server does not know the thread (the
    turn's audit is told: a restore or a new thread follows). ``path``: the rollout to
    resume from (``thread/resume``'s unstable ``path``, which wins over the id)."""
    server.mcp[thread_id] = asyncio.get_running_loop().create_future()
    where = {"path": path} if path else {}
    try:
        result = await call(server, "thread/resume", {"threadId": thread_id, **where, **params})
    except RpcError as exc:
        # A restored rollout Codex cannot load is not retried: the thread is rebuilt.
        if exc.code != RESUME_UNKNOWN and not path:
            raise AgentError("thread_resume_failed", str(exc), retryable=True) from None
        action = "session.restore_failed" if path else "session.resume_failed"
        server.notices.append(
            Notice(0, action, {"threadId": thread_id, "error": exc.rpc_message[:500]})
        )
        server.mcp.pop(thread_id, None)
        return None
    resumed = str(result["thread"]["id"])
    if resumed != thread_id:  # a rollout of another thread: not this session's
        server.mcp.pop(thread_id, None)
        return None
    return resumed


async def _restore(
    call: Call, server: AppServer, spec: SessionSpec, params: Json, restore: Restore
) -> str | None:
    """The thread resumed from the rollout another worker kept, or None (nothing kept,
    or not restorable: the session's next prompt then carries the conversation)."""
    assert spec.thread_id is not None
    got = await spec.kept() if spec.kept is not None else None
    if not isinstance(got, Rollout):
        reason = got.reason if got is not None else "absent"
        server.notices.append(
            Notice(0, "session.restore_failed", {"threadId": spec.thread_id, "error": reason})
        )
        return None
    path = await restore(got)
    if path is None:
        server.notices.append(
            Notice(0, "session.restore_failed", {"threadId": spec.thread_id, "error": "write"})
        )
        return None
    resumed = await _resume(call, server, spec.thread_id, params, path)
    if resumed is not None:
        server.notices.append(
            Notice(
                0,
                "session.thread_restored",
                {"threadId": resumed, "lines": got.lines, "bytes": got.size},
            )
        )
    return resumed


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
