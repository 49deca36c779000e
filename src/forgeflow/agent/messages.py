"""Where a message from an app-server goes: its requests are answered (items.py), its
Gitea tools' startup status settles the thread's wait for them (threads.py), and a
turn's notifications go to that turn, which may end it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from forgeflow.agent.appserver import AppServer
from forgeflow.agent.items import TurnEnd, TurnState, on_notification, on_server_request
from forgeflow.agent.jsonrpc import Json

# Ends a turn once (the runtime's own bookkeeping of its app-server's active turns).
Complete = Callable[[TurnState, TurnEnd], None]


async def on_message(
    server: AppServer,
    msg: Json,
    turns: dict[str, TurnState],
    elicitation_policy: str,
    complete: Complete,
) -> None:
    method = str(msg.get("method"))
    params = msg.get("params") or {}
    if "id" in msg:
        if server.proc is not None:
            await on_server_request(
                server.proc, turns, msg["id"], method, params, elicitation_policy
            )
        return
    if method == "mcpServer/startupStatus/updated" and params.get("name") == "gitea":
        _mcp_status(server, params)
        return
    turn = turns.get(str(params.get("turnId") or (params.get("turn") or {}).get("id")))
    if turn is None:
        return
    ended = on_notification(turn, method, params)
    if ended is not None:
        complete(turn, ended)


def _mcp_status(server: AppServer, params: Json) -> None:
    """The gitea MCP server of a thread is up (or will not be): its waiter learns it."""
    status = str(params.get("status"))
    if status in ("ready", "failed", "cancelled"):
        fut = server.mcp.setdefault(
            str(params.get("threadId")), asyncio.get_running_loop().create_future()
        )
        if not fut.done():
            fut.set_result(status)
