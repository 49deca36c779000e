"""The model provider forgeflow talks to on the jailed agent's behalf, and the Codex
configuration the jail is given instead of the operator's (as ``-c`` overrides on the
app-server's command line, with the capability in its environment).

The operator configures the model once: ``FORGEFLOW_MODEL_BASE_URL`` and
``FORGEFLOW_MODEL_API_KEY``, or else the provider of the ``CODEX_HOME`` forgeflow is
given (its ``model_provider`` table: ``base_url``, ``env_key``), or else OpenAI with
``OPENAI_API_KEY``. The key stays in forgeflow; the jail's Codex knows only the
pass-through's address and a capability.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forgeflow.config_file import TomlTable, TomlValue

OPENAI_BASE_URL = "https://api.openai.com/v1"
BROKER_PROVIDER = "forgeflow"

# Keys of a provider table that carry no secret and keep their meaning behind the
# pass-through. base_url, env_key, bearer tokens and headers stay with forgeflow.
_PROVIDER_KEYS = (
    "name",
    "wire_api",
    "request_max_retries",
    "stream_max_retries",
    "stream_idle_timeout_ms",
    "supports_websockets",
)
# Top-level settings of the operator's config.toml the jail keeps (model choice and the
# switches that keep Codex from phoning home); MCP servers, profiles, auth, shell and
# notify hooks are not copied.
_TOP_KEYS = (
    "model",
    "model_reasoning_effort",
    "model_reasoning_summary",
    "model_verbosity",
    "model_context_window",
    "model_auto_compact_token_limit",
    "check_for_update_on_startup",
    "analytics",
    "feedback",
    "features",
    "hide_agent_reasoning",
    "project_doc_max_bytes",
)
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


class ProviderError(Exception):
    code = "model_provider_invalid"


@dataclass(frozen=True, slots=True)
class ModelProvider:
    """Where the pass-through sends the agent's model requests, with which key."""

    base_url: str
    api_key: str | None = field(repr=False)
    provider: Mapping[str, Any] = field(default_factory=dict)  # non-secret keys only
    top: Mapping[str, Any] = field(default_factory=dict)  # non-secret settings only

    def jail_config(self, broker_url: str) -> TomlTable:
        """The config.toml of the jail's ``CODEX_HOME``: the operator's model choice,
        the provider replaced by the pass-through, the plan tool on."""
        provider: TomlTable = {
            "name": "forgeflow model pass-through",
            "wire_api": "responses",
            **self.provider,
            "base_url": broker_url,
        }
        return {
            **self.top,
            # The receipt's checklist is the agent's update_plan calls (turn/plan/updated),
            # and codex (since 0.152.0) offers that tool to no model unless the config
            # says so; the operator's config.toml cannot take it away from the receipt.
            "tools": {"update_plan": {"enabled": True}},
            "model_provider": BROKER_PROVIDER,
            "model_providers": {BROKER_PROVIDER: provider},
        }


# The variable the jail's Codex reads its bearer token from (the provider's env_key):
# set in the jail's environment only, never in a file or on a command line.
CAPABILITY_ENV = "AGENT_CAPABILITY"


def with_capability_env(config: Mapping[str, Any]) -> TomlTable:
    """The jail's config, its provider told to read the capability from
    :data:`CAPABILITY_ENV` (the value itself is set in the jail's environment)."""
    providers = dict(config.get("model_providers") or {})
    providers[BROKER_PROVIDER] = {**providers.get(BROKER_PROVIDER, {}), "env_key": CAPABILITY_ENV}
    return {**config, "model_providers": providers}


def overrides(table: Mapping[str, Any], prefix: str = "") -> list[str]:
    """``-c key=value`` arguments for ``codex app-server`` (values in TOML): they beat
    any ``config.toml`` the agent writes in its home, so forgeflow writes none there.
    Only non-secret values: a command line is visible to every user of the host."""
    args: list[str] = []
    for key, value in table.items():
        if not _BARE_KEY.fullmatch(key):
            raise ProviderError(f"config key {key!r} cannot be passed as a -c override")
        dotted = f"{prefix}.{key}" if prefix else key
        if isinstance(value, Mapping):
            args += overrides(value, dotted)
        else:
            args += ["-c", f"{dotted}={_value(value)}"]
    return args


def load_provider(
    *,
    base_url: str | None,
    api_key: str | None,
    codex_home: Path | None,
    environ: Mapping[str, str] = os.environ,
) -> ModelProvider:
    """The operator's provider: forgeflow's settings, else ``codex_home``'s config."""
    config: TomlTable = {}
    if codex_home is not None and (codex_home / "config.toml").is_file():
        path = codex_home / "config.toml"
        try:
            config = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, OSError) as exc:
            raise ProviderError(f"{path}: cannot be read as TOML ({exc})") from None
    top = {k: config[k] for k in _TOP_KEYS if k in config}
    chosen = str(config.get("model_provider") or "openai")
    table = _table(_table(config.get("model_providers")).get(chosen))
    provider = {k: table[k] for k in _PROVIDER_KEYS if k in table}
    if base_url:
        return ModelProvider(base_url.rstrip("/"), api_key, provider, top)
    url = str(table.get("base_url") or environ.get("OPENAI_BASE_URL") or OPENAI_BASE_URL)
    key = api_key
    if key is None:
        env_key = str(table.get("env_key") or "OPENAI_API_KEY")
        bearer = table.get("experimental_bearer_token")
        key = environ.get(env_key) or (bearer if isinstance(bearer, str) else None)
    return ModelProvider(url.rstrip("/"), key, provider, top)


def _table(value: TomlValue | None) -> TomlTable:
    """A table of the operator's config, or an empty one where it has none."""
    return value if isinstance(value, dict) else {}


def to_toml(table: Mapping[str, Any], prefix: str = "") -> str:
    """A small TOML writer (the standard library only reads TOML): scalars, lists and
    nested tables, which is all a Codex config needs."""
    lines = [f"{_key(k)} = {_value(v)}" for k, v in table.items() if not isinstance(v, Mapping)]
    out = ""
    if lines:
        out = (f"\n[{prefix}]\n" if prefix else "") + "\n".join(lines) + "\n"
    for key, value in table.items():
        if isinstance(value, Mapping):
            out += to_toml(value, f"{prefix}.{_key(key)}" if prefix else _key(key))
    return out


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)
