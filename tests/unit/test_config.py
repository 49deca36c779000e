from __future__ import annotations

import os
from pathlib import Path

import pytest

from forgeflow.config import ConfigError, load_settings
from forgeflow.config_warnings import capability_warnings, sandbox_warning
from forgeflow.domain.permissions import Permission


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("FORGEFLOW_DATA_DIR", "FORGEFLOW_DATABASE_URL", "FORGEFLOW_PORT"):
        monkeypatch.delenv(var, raising=False)
    s = load_settings()
    assert s.port == 8080 and s.host == "127.0.0.1"
    assert s.bot_login == "ccweb-bot"
    assert s.trigger_permission is Permission.WRITE
    assert s.resolved_database_url.startswith("sqlite:///")
    assert s.resolved_workspace_root == (Path(".forgeflow") / "workspaces").resolve()


def test_preparations_default_to_one_per_usable_core_and_at_least_two(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FORGEFLOW_MAX_PREPARATIONS", raising=False)
    assert load_settings().max_preparations == max(2, len(os.sched_getaffinity(0)))
    monkeypatch.setenv("FORGEFLOW_MAX_PREPARATIONS", "7")
    assert load_settings().max_preparations == 7


def test_environment_wins_over_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "forgeflow.toml"
    cfg.write_text('port = 9000\nbot_login = "file-bot"\n')
    monkeypatch.setenv("FORGEFLOW_PORT", "9100")
    s = load_settings(cfg)
    assert s.port == 9100
    assert s.bot_login == "file-bot"


@pytest.mark.parametrize(
    ("var", "value", "named"),
    [
        ("FORGEFLOW_PORT", "eighty", "FORGEFLOW_PORT"),
        ("FORGEFLOW_PORT", "70000", "FORGEFLOW_PORT"),
        ("FORGEFLOW_TRIGGER_PERMISSION", "root", "FORGEFLOW_TRIGGER_PERMISSION"),
        ("FORGEFLOW_GITEA_URL", "gitea.local", "FORGEFLOW_GITEA_URL"),
        ("FORGEFLOW_DATABASE_URL", "mysql://x", "FORGEFLOW_DATABASE_URL"),
        ("FORGEFLOW_BOT_LOGIN", "@bot", "FORGEFLOW_BOT_LOGIN"),
        ("FORGEFLOW_CODEX_COMMAND", "codex 'unterminated", "FORGEFLOW_CODEX_COMMAND"),
        ("FORGEFLOW_MAX_PREPARATIONS", "0", "FORGEFLOW_MAX_PREPARATIONS"),
        ("FORGEFLOW_LOG_LEVEL", "verbose", "FORGEFLOW_LOG_LEVEL"),
    ],
)
def test_invalid_setting_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str, named: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert message.startswith(named + ":")
    assert "\n" not in message


def test_the_log_level_is_one_the_docs_name_in_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGEFLOW_LOG_LEVEL", " WARNING ")
    assert load_settings().log_level == "warning"
    monkeypatch.setenv("FORGEFLOW_LOG_LEVEL", "critical")
    with pytest.raises(ConfigError, match="must be one of debug, info, warning, error"):
        load_settings()


def test_bad_toml_is_a_config_error(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("port = = 1")
    with pytest.raises(ConfigError, match="--config"):
        load_settings(cfg)
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("prot = 9000\n", "unknown key 'prot'"),
        ('[forgeflow]\nbot_logn = "x"\n', "unknown key [forgeflow] 'bot_logn'"),
        ("[forgeflow]\nport = 1\n[other]\nx = 1\n", "unknown key 'other' beside [forgeflow]"),
        ("port = 1\n[ignored]\nx = 1\n", "unknown key 'ignored'"),
    ],
)
def test_an_unknown_toml_key_is_named(tmp_path: Path, text: str, named: str) -> None:
    cfg = tmp_path / "forgeflow.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    assert str(info.value) == f"--config: {cfg}: {named}"


def test_prefixed_keys_in_either_case_are_known(tmp_path: Path) -> None:
    cfg = tmp_path / "forgeflow.toml"
    cfg.write_text("[forgeflow]\nFORGEFLOW_PORT = 9001\n")
    assert load_settings(cfg).port == 9001


def test_a_folder_or_an_unreadable_config_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(tmp_path)
    assert str(info.value) == f"--config: {tmp_path} is a folder, not a TOML file"
    # A file that exists and that even root cannot read (these tests may run as root,
    # for whom a mode of 000 means nothing): reading /proc/self/mem at 0 is EIO.
    unreadable = Path("/proc/self/mem")
    with pytest.raises(ConfigError) as info:
        load_settings(unreadable)
    assert str(info.value) == f"--config: cannot read {unreadable} (Input/output error)"


def test_missing_gitea_settings_are_warnings_not_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("FORGEFLOW_GITEA_URL", "FORGEFLOW_GITEA_TOKEN", "FORGEFLOW_WEBHOOK_SECRET"):
        monkeypatch.delenv(var, raising=False)
    lines = capability_warnings(load_settings())
    assert any(
        line.startswith("FORGEFLOW_WEBHOOK_SECRET") and "503 not_configured" in line
        for line in lines
    )
    assert len(lines) == 3


def test_the_egress_policy_defaults_to_the_registries_through_the_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ("FORGEFLOW_AGENT_NETWORK", "FORGEFLOW_EGRESS_ALLOW", "FORGEFLOW_EGRESS_PORTS"):
        monkeypatch.delenv(var, raising=False)
    s = load_settings()
    assert s.agent_network == "proxy"
    policy = s.egress_policy()
    assert policy.check_name("pypi.org", 443).allowed
    assert policy.check_name("registry.npmjs.org", 443).allowed
    assert not policy.check_name("github.com", 443).allowed
    assert not policy.check_name("pypi.org", 5432).allowed
    assert sandbox_warning(s) is None


def test_per_repository_hosts_come_from_forgeflows_toml(tmp_path: Path) -> None:
    cfg = tmp_path / "forgeflow.toml"
    cfg.write_text('[forgeflow.egress_repos]\n"acme/widget" = ["github.com", "*.github.io"]\n')
    policy = load_settings(cfg).egress_policy()
    assert policy.for_repository("acme/widget").check_name("docs.github.io", 443).allowed
    assert not policy.for_repository("acme/other").check_name("github.com", 443).allowed
    cfg.write_text('[forgeflow.egress_repos]\n"widget" = ["github.com"]\n')
    with pytest.raises(ConfigError, match=r"FORGEFLOW_EGRESS_REPOS: .*is not owner/repo"):
        load_settings(cfg)


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("FORGEFLOW_EGRESS_ALLOW", "pypi.org,bad host", "is not a host, \\*.suffix or \\*"),
        ("FORGEFLOW_EGRESS_PORTS", "443,99999", "ports are 1 to 65535"),
        ("FORGEFLOW_EGRESS_RESOLVE", "mirror.internal", "is not name=address"),
        ("FORGEFLOW_AGENT_NETWORK", "open", "'proxy', 'on' or 'off'"),
    ],
)
def test_a_bad_egress_setting_is_named(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str, message: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=f"{var}: .*{message}"):
        load_settings()


def test_the_hosts_network_is_a_loud_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGEFLOW_AGENT_NETWORK", "on")
    monkeypatch.setenv("FORGEFLOW_SANDBOX", "bwrap")
    warning = sandbox_warning(load_settings())
    assert warning is not None and "the database included" in warning
