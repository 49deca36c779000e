"""The Codex runtime's configuration, and what it tells Codex about threads and turns:
the sandbox policy of a turn and the audit of a thread's parameters."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from forgeflow.agent.jsonrpc import Json
from forgeflow.agent.port import AgentError
from forgeflow.agent.provider import ModelProvider, load_provider
from forgeflow.config import Settings
from forgeflow.domain.egress import EgressPolicy
from forgeflow.domain.json import JsonObject


@dataclass(frozen=True, slots=True)
class CodexConfig:
    argv: list[str]
    mcp_argv: list[str]
    gitea_url: str
    gitea_token: str = field(repr=False)
    data_dir: Path
    workspace_root: Path
    provider: ModelProvider
    jailed: bool = True
    network: str = "proxy"  # FORGEFLOW_AGENT_NETWORK
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    idle_seconds: float = 300.0
    model: str | None = None
    reasoning_effort: str | None = None
    request_timeout: float = 60.0
    mcp_ready_timeout: float = 30.0
    elicitation_policy: str = "decline"
    bot_login: str = "forgeflow-agent"  # the agent's git identity


def sandbox_policy(read_only: bool, *, jailed: bool = True, network: bool = True) -> Json:
    """``turn/start``'s ``sandboxPolicy`` (0.171.0 ``SandboxPolicy``). It overrides the
    thread's sandbox "for this turn and subsequent turns", so every turn sends its own:
    a turn never inherits another's policy.

    In a jail the jail is the sandbox (``externalSandbox``): Codex's own Linux sandbox
    would start a nested bubblewrap, which a jail without capabilities cannot (observed:
    "bwrap: setting up uid map: Operation not permitted"). A draft space's jail binds
    the repository read-only instead."""
    if jailed:
        open_net = network and not read_only
        return {"type": "externalSandbox", "networkAccess": "enabled" if open_net else "restricted"}
    if read_only:
        return {"type": "readOnly", "networkAccess": False}
    return {"type": "dangerFullAccess"}


def turn_params(
    cfg: CodexConfig,
    thread_id: str,
    prompt: str,
    policy: Json,
    collaboration: bool,
    *,
    model: str | None = None,
    images: tuple[str, ...] = (),
) -> Json:
    """``turn/start``'s parameters; ``collaborationMode`` (the model and the operator's
    effort) only where the app-server takes it and a model is set. ``model``: the task's
    own (a mention's ``--model``), else the operator's; it is sent with every turn, as
    0.171.0's ``model`` overrides "this turn and subsequent turns" and
    ``collaborationMode`` takes precedence over it (without either, the model of the
    operator's config.toml). ``images``: data URLs, sent as
    ``image`` input items after the prompt (the jail never fetches them)."""
    chosen = model or cfg.model
    items: list[Json] = [{"type": "text", "text": prompt, "text_elements": []}]
    items += [{"type": "image", "url": url} for url in images]
    params: Json = {"threadId": thread_id, "input": items, "sandboxPolicy": policy}
    sent = chosen or _configured_model(cfg)
    if sent:
        params["model"] = sent
    if collaboration and chosen:
        settings: Json = {"model": chosen}
        if cfg.reasoning_effort:
            settings["reasoning_effort"] = cfg.reasoning_effort
        params["collaborationMode"] = {"mode": "default", "settings": settings}
    return params


def _configured_model(cfg: CodexConfig) -> str | None:
    """The model of the operator's config.toml, sent when FORGEFLOW_MODEL is unset so
    that a turn after one with ``--model`` is back on the operator's choice."""
    found = cfg.provider.top.get("model")
    return found if isinstance(found, str) and found else None


def server_key(owner: str, repo: str, read_only: bool) -> str:
    return f"{owner}/{repo}" + (" (read-only)" if read_only else "")


def audit_params(params: Json) -> JsonObject:
    """What a thread was started with, for the audit: header names, never values."""
    servers = (params.get("config") or {}).get("mcp_servers") or {}
    return {
        "cwd": params["cwd"],
        "approvalPolicy": params["approvalPolicy"],
        "sandbox": params["sandbox"],
        "mcpServers": {
            name: {"url": server["url"], "headers": sorted(server.get("http_headers") or {})}
            for name, server in servers.items()
        },
    }


def config_from_settings(settings: Settings) -> CodexConfig:
    if settings.gitea_url is None or settings.gitea_token is None:
        raise AgentError(
            "not_configured", "the Codex runtime needs the Gitea settings", retryable=False
        )
    key = settings.model_api_key.get_secret_value() if settings.model_api_key else None
    provider = load_provider(
        base_url=settings.model_base_url, api_key=key, codex_home=settings.codex_home_path
    )
    return CodexConfig(
        argv=settings.codex_argv,
        mcp_argv=settings.gitea_mcp_argv,
        gitea_url=settings.gitea_url,
        gitea_token=settings.gitea_token.get_secret_value(),
        data_dir=Path(settings.data_dir).resolve(),
        workspace_root=settings.resolved_workspace_root,
        provider=provider,
        jailed=settings.sandbox == "bwrap",
        network=settings.agent_network,
        egress=settings.egress_policy(),
        idle_seconds=settings.agent_idle_seconds,
        model=settings.model,
        reasoning_effort=settings.reasoning_effort,
        mcp_ready_timeout=settings.mcp_timeout_seconds,
        elicitation_policy=settings.elicitation_policy,
        bot_login=settings.bot_login,
    )
