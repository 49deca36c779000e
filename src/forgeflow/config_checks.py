"""The checks of settings that their types do not make: URLs and the database's, command
lines, the admin token's length, the bot's login, the log level, the egress and price
settings (their rules in ``domain/``). Each takes a value as read and returns it, or
raises ``ValueError`` with the words ``config.load_settings`` puts after the setting's
name."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any

from pydantic import SecretStr, ValidationInfo

from forgeflow.domain.egress import PolicyError, parse_hosts, parse_pins, parse_ports
from forgeflow.domain.prices import PriceError, check_currency, parse_prices

MIN_ADMIN_TOKEN = 20
# The levels docs/configuration.md names for FORGEFLOW_LOG_LEVEL.
LOG_LEVELS = ("debug", "info", "warning", "error")


def egress(value: str, info: ValidationInfo) -> str:
    parse: dict[str, Callable[[str, str], object]] = {
        "egress_allow": parse_hosts,
        "egress_ports": parse_ports,
    }
    try:
        parse.get(info.field_name or "", parse_pins)(value, "value")
    except PolicyError as exc:
        raise ValueError(str(exc).removeprefix("value: ")) from None
    return value


def prices(value: dict[str, Any]) -> dict[str, Any]:
    try:
        parse_prices(value)
    except PriceError as exc:
        raise ValueError(str(exc)) from None
    return value


def currency(value: str) -> str:
    try:
        return check_currency(value)
    except PriceError as exc:
        raise ValueError(str(exc)) from None


def egress_repos(value: dict[str, list[str]]) -> dict[str, list[str]]:
    for key, hosts in value.items():
        if key.count("/") != 1 or not all(key.split("/")):
            raise ValueError(f"{key!r} is not owner/repo")
        try:
            parse_hosts(hosts, key)
        except PolicyError as exc:
            raise ValueError(str(exc)) from None
    return value


def url(value: str | None) -> str | None:
    if value is None or value == "":
        return None
    if not value.startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https://")
    return value.rstrip("/")


def database_url(value: SecretStr | None) -> SecretStr | None:
    if value is None or not value.get_secret_value():
        return None
    scheme = value.get_secret_value().split(":", 1)[0]
    if scheme.split("+", 1)[0] not in {"sqlite", "postgresql", "postgres"}:
        raise ValueError("must be a sqlite:/// or postgresql:// URL")
    return value


def admin_token(value: SecretStr | None) -> SecretStr | None:
    # An outsider can try tokens at the sign-in form and the API: a short one falls
    # to guessing despite the per-address slow-down.
    if value is not None and len(value.get_secret_value().strip()) < MIN_ADMIN_TOKEN:
        raise ValueError(
            f"is shorter than {MIN_ADMIN_TOKEN} characters; use a random one "
            "(python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return value


def bot_login(value: str) -> str:
    if not value or any(c.isspace() or c == "@" for c in value):
        raise ValueError("must be a Gitea login without '@' or spaces")
    return value


def command(value: str, info: ValidationInfo) -> str:
    try:
        parts = shlex.split(value)
    except ValueError as exc:
        raise ValueError(f"is not a valid command line ({exc})") from exc
    if not parts and info.field_name == "codex_command":
        raise ValueError("must not be empty")
    return value


def log_level(value: str) -> str:
    """A level of LOG_LEVELS, in any case: a typo such as ``verbose`` used to leave the logs
    at ``info`` without a word, where every other invalid setting stops start-up."""
    level = value.strip().lower()
    if level not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}, not {value!r}")
    return level
