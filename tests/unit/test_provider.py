"""The model provider forgeflow passes the jailed agent's requests to, and the Codex
configuration the jail gets instead of the operator's."""

from __future__ import annotations

from pathlib import Path

import pytest

from forgeflow.agent.provider import (
    CAPABILITY_ENV,
    ProviderError,
    load_provider,
    overrides,
    with_capability_env,
)

OPERATOR = """
model = "gpt-test"
model_provider = "corp"
check_for_update_on_startup = false

[features]
plugins = false

[tools.update_plan]
enabled = false

[model_providers.corp]
name = "Corp gateway"
base_url = "https://llm.corp.example/v1/"
env_key = "CORP_KEY"
wire_api = "responses"
stream_max_retries = 0
http_headers = { "X-Secret" = "header-secret" }

[mcp_servers.github]
command = "github-mcp"
env = { GITHUB_TOKEN = "ghp_secret" }
"""


def _home(tmp_path: Path, text: str) -> Path:
    (tmp_path / "config.toml").write_text(text)
    return tmp_path


def test_the_operators_codex_provider_is_used_and_its_secrets_stay_out(tmp_path: Path) -> None:
    provider = load_provider(
        base_url=None,
        api_key=None,
        codex_home=_home(tmp_path, OPERATOR),
        environ={"CORP_KEY": "sk-corp"},
    )
    assert (provider.base_url, provider.api_key) == ("https://llm.corp.example/v1", "sk-corp")
    config = with_capability_env(provider.jail_config("http://127.0.0.1:9/model"))
    text = " ".join(overrides(config))
    for secret in ("sk-corp", "header-secret", "ghp_secret", "llm.corp.example", "CORP_KEY"):
        assert secret not in text
    assert config["model"] == "gpt-test" and config["features"] == {"plugins": False}
    assert "mcp_servers" not in config
    ours = config["model_providers"][config["model_provider"]]
    assert ours["base_url"] == "http://127.0.0.1:9/model"
    # No token in the config at all: Codex reads the capability from the jail's env.
    assert ours["env_key"] == CAPABILITY_ENV and "experimental_bearer_token" not in ours
    assert '-c model_providers.forgeflow.base_url="http://127.0.0.1:9/model"' in text
    assert (ours["wire_api"], ours["stream_max_retries"]) == ("responses", 0)
    # The plan tool is forgeflow's to turn on (codex offers it to no model by default):
    # the receipt's checklist needs it, so the operator's tools table is not copied.
    assert config["tools"] == {"update_plan": {"enabled": True}}
    assert "-c tools.update_plan.enabled=true" in text


def test_forgeflows_own_settings_win(tmp_path: Path) -> None:
    provider = load_provider(
        base_url="https://other.example/v1",
        api_key="sk-own",
        codex_home=_home(tmp_path, OPERATOR),
        environ={"CORP_KEY": "sk-corp"},
    )
    assert (provider.base_url, provider.api_key) == ("https://other.example/v1", "sk-own")


def test_without_configuration_openai_with_its_key(tmp_path: Path) -> None:
    provider = load_provider(
        base_url=None, api_key=None, codex_home=tmp_path, environ={"OPENAI_API_KEY": "sk-o"}
    )
    assert (provider.base_url, provider.api_key) == ("https://api.openai.com/v1", "sk-o")


def test_an_unreadable_config_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ProviderError, match=r"config\.toml"):
        load_provider(
            base_url=None, api_key=None, codex_home=_home(tmp_path, "model = ["), environ={}
        )
