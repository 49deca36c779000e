"""A CODEX_HOME for tests: codex talks to the scripted model and to nothing else.

Verified with @openai/codex 0.171.0 under strace: with this config the app-server opens no
socket but loopback ones. Without `features.plugins = false` it resolves api.github.com and
chatgpt.com at start (plugin marketplace sync); the other switches turn off what would
phone home later (analytics, feedback, update checks, app connectors, model discovery)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forgeflow.agent.provider import to_toml

PROVIDER_ID = "scripted"
API_KEY_ENV = "SCRIPTED_MODEL_API_KEY"
API_KEY = "sk-scripted-test-key"

_FEATURES_OFF = (
    "plugins",  # marketplace sync: api.github.com + chatgpt.com at start-up
    "remote_plugin",
    "apps",  # ChatGPT app connectors (chatgpt.com)
    "in_app_updates",
    "tool_suggest",
    "api_key_model_discovery",  # would ask the provider for a model list
    "skill_mcp_dependency_install",
    "daemon_auto_start",  # no background codex daemon outliving the test
    "unbounded_connection_retries",  # a failed model call must fail the turn, not retry
)


@dataclass(frozen=True)
class CodexHome:
    path: Path

    @property
    def config_file(self) -> Path:
        return self.path / "config.toml"

    def env(self) -> dict[str, str]:
        """What the app-server's environment needs on top of the parent's."""
        return {"CODEX_HOME": str(self.path), API_KEY_ENV: API_KEY}


def codex_config(
    model_url: str, *, model: str = "scripted-model", stream_idle_timeout_ms: int = 30_000
) -> dict[str, Any]:
    return {
        "model": model,
        "model_provider": PROVIDER_ID,
        "check_for_update_on_startup": False,
        "analytics": {"enabled": False},
        "feedback": {"enabled": False},
        "features": dict.fromkeys(_FEATURES_OFF, False),
        "model_providers": {
            PROVIDER_ID: {
                "name": "Scripted test model",
                "base_url": model_url,
                "wire_api": "responses",
                "env_key": API_KEY_ENV,
                # a scripted error must reach the test as a failed turn, at once
                "request_max_retries": 0,
                "stream_max_retries": 0,
                "stream_idle_timeout_ms": stream_idle_timeout_ms,
                "supports_websockets": False,
            }
        },
    }


def write_codex_home(
    path: Path,
    model_url: str,
    *,
    model: str = "scripted-model",
    extra: Mapping[str, Any] | None = None,
) -> CodexHome:
    """Creates `path` with a config.toml pointing codex at `model_url` (a ScriptedModel's
    `url`). `extra` adds or replaces top-level keys/tables."""
    path.mkdir(parents=True, exist_ok=True)
    config = codex_config(model_url, model=model)
    config.update(extra or {})
    home = CodexHome(path)
    home.config_file.write_text(to_toml(config), encoding="utf-8")
    return home
