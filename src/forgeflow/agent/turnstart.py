"""How the Codex runtime asks an app-server for a turn: the turn's sandbox policy and
``turn/start`` parameters, and the one retry without ``collaborationMode`` when the
app-server refuses it (docs/codex-app-server.md)."""

from __future__ import annotations

from forgeflow.agent.appserver import AppServer
from forgeflow.agent.codexconfig import CodexConfig, sandbox_policy, turn_params
from forgeflow.agent.jsonrpc import Json, RpcError
from forgeflow.agent.port import AgentError, TurnSpec
from forgeflow.agent.threads import Call


def start_params(
    cfg: CodexConfig, server: AppServer, thread_id: str, turn: TurnSpec
) -> tuple[Json, Json]:
    """``turn/start``'s parameters and the turn's sandbox policy; a turn sent without
    ``collaborationMode`` is reported once as a downgrade of its app-server."""
    policy = sandbox_policy(turn.read_only, jailed=cfg.jailed, network=cfg.network != "off")
    params = turn_params(
        cfg,
        thread_id,
        turn.prompt,
        policy,
        server.collaboration,
        model=turn.model,
        images=turn.images,
    )
    if "collaborationMode" not in params and "collaborationMode" not in server.downgraded:
        server.downgrade(
            "collaborationMode",
            "not supported by the runtime"
            if not server.collaboration
            else "FORGEFLOW_MODEL is not set",
        )
    return params, policy


async def request_start(call: Call, server: AppServer, params: Json) -> Json:
    """``turn/start``; refused with ``collaborationMode``, asked once more without it
    (and the app-server is not offered it again)."""
    try:
        return await call(server, "turn/start", params)
    except RpcError as exc:
        if "collaborationMode" not in params:
            raise AgentError("turn_start_failed", str(exc), retryable=True) from None
        server.downgrade("collaborationMode", str(exc))
        server.collaboration = False
        params.pop("collaborationMode")
    try:
        return await call(server, "turn/start", params)
    except RpcError as again:
        raise AgentError("turn_start_failed", str(again), retryable=True) from None
