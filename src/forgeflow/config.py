"""Configuration: the environment first, then an optional TOML file (DESIGN "Contracts")."""

from __future__ import annotations

import os
import shlex
from decimal import Decimal
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from forgeflow import config_checks as checks
from forgeflow.config_defaults import PINNED_CODEX, default_data_dir, default_max_preparations

# Re-exported: load_settings raises it, so its callers take it from here.
from forgeflow.config_file import ConfigError as ConfigError
from forgeflow.config_file import TomlSource
from forgeflow.domain.budgets import Budgets
from forgeflow.domain.egress import (
    DEFAULT_ALLOW,
    DEFAULT_PORTS,
    EgressPolicy,
    parse_hosts,
    parse_pins,
    parse_ports,
)
from forgeflow.domain.images import Bounds as ImageBounds
from forgeflow.domain.permissions import Permission
from forgeflow.domain.prices import Price, Prices, parse_prices
from forgeflow.domain.reviews import DEFAULT_SKIP as REVIEW_SKIP

ENV_PREFIX = "FORGEFLOW_"


class Role(StrEnum):
    ALL = "all"
    INGRESS = "ingress"
    WORKER = "worker"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")
    toml_file: ClassVar[Path | None] = None

    data_dir: Path = Field(default_factory=lambda: default_data_dir())
    database_url: SecretStr | None = None
    workspace_root: Path | None = None
    # Where the roots of repositories' environments are kept (#26); default
    # <data_dir>/environments/roots. Builds wait on a lock file per root in it.
    environment_roots: Path | None = None
    environment_build_seconds: float = Field(default=1800.0, gt=0)
    mmdebstrap_command: str = "mmdebstrap"
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    gitea_url: str | None = None
    public_url: str | None = None
    gitea_token: SecretStr | None = None
    webhook_secret: SecretStr | None = None
    bot_login: str = "ccweb-bot"
    admin_token: SecretStr | None = None
    codex_command: str = "codex app-server"
    # Empty (the default): forgeflow's own Gitea tools only; set, an external Gitea MCP
    # server (stdio) whose tools are offered after forgeflow's, through the same scope.
    gitea_mcp_command: str = ""
    sandbox: Literal["bwrap", "none"] = "bwrap"
    agent_network: Literal["proxy", "on", "off"] = "proxy"
    # The egress proxy's policy (agent_network=proxy; docs/security.md "Network").
    egress_allow: str = ",".join(DEFAULT_ALLOW)
    egress_ports: str = ",".join(str(p) for p in DEFAULT_PORTS)
    egress_resolve: str = ""  # name=address pins, for an internal mirror without DNS
    # Per repository ("owner/repo" = [hosts]): forgeflow's own configuration only.
    egress_repos: dict[str, list[str]] = Field(default_factory=dict)
    agent_idle_seconds: float = Field(default=300.0, gt=0)
    # Pull request reviews (docs/reviews.md): per repository ("owner/repo" = events), the
    # events besides COMMENT the bot may give (APPROVE, REQUEST_CHANGES); the diff a
    # review prompt inlines at most; the files it leaves out (comma-separated globs).
    review_events: dict[str, list[Literal["APPROVE", "REQUEST_CHANGES"]]] = Field(
        default_factory=dict
    )
    review_diff_bytes: int = Field(default=60_000, ge=1_000, le=4_000_000)
    review_skip: str = ",".join(REVIEW_SKIP)
    model_base_url: str | None = None
    model_api_key: SecretStr | None = None
    codex_home: Path | None = None
    model: str | None = None
    # The models a mention may ask for (``--model NAME``, comma-separated); the
    # configured FORGEFLOW_MODEL is always one of them (docs/commands.md "Options").
    allowed_models: str = ""
    reasoning_effort: str | None = None
    # Images of the conversation handed to the model (docs/security.md "Attachments").
    image_max_count: int = Field(default=4, ge=0, le=20)
    image_max_bytes: int = Field(default=2 * 1024 * 1024, ge=1024, le=20 * 1024 * 1024)
    # All of a turn's images together: their data URLs stay in the thread's rollout,
    # which forgeflow keeps up to 8 MiB (domain/rollout.py).
    image_max_total_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    trigger_permission: Permission = Permission.WRITE
    permission_cache_seconds: float = Field(default=60.0, ge=0)
    delivery_retention_days: int = Field(default=30, ge=1)
    log_level: str = "info"
    agent_runtime: str = "codex"
    worker_id: str | None = None
    lease_ttl_seconds: float = Field(default=30.0, gt=0)
    poll_seconds: float = Field(default=5.0, gt=0)
    # At most one edit of a task's receipt (the tracking comment) per this many seconds.
    tracking_edit_seconds: float = Field(default=3.0, ge=0.1)
    fetch_interval_seconds: float = Field(default=60.0, ge=0)
    max_preparations: int = Field(default_factory=lambda: default_max_preparations(), ge=1)
    retry_base_seconds: float = Field(default=5.0, ge=0)
    max_retries: int = Field(default=1, ge=0, le=10)
    abort_timeout_seconds: float = Field(default=30.0, gt=0)
    mcp_timeout_seconds: float = Field(default=20.0, gt=0)
    elicitation_policy: Literal["accept", "decline"] = "decline"
    budget_daily_tokens: int | None = Field(default=None, ge=0)
    budget_monthly_tokens: int | None = Field(default=None, ge=0)
    budget_threshold: float = Field(default=0.8, gt=0, le=1)
    price_input_per_mtok: float | None = Field(default=None, ge=0)
    price_output_per_mtok: float | None = Field(default=None, ge=0)
    # Per model ("model" = {input, output, cached_input} per million tokens): the cost
    # the receipt and the task page show (docs/configuration.md "Prices").
    prices: dict[str, Any] = Field(default_factory=dict)
    price_currency: str = "USD"
    # The HTTP surface (docs/security.md "The HTTP surface").
    http_max_header_bytes: int = Field(default=16 * 1024, ge=1024, le=1024 * 1024)
    http_header_timeout_seconds: float = Field(default=10.0, gt=0)
    http_body_timeout_seconds: float = Field(default=30.0, gt=0)
    http_keep_alive_seconds: float = Field(default=5.0, gt=0)
    http_max_connections: int = Field(default=512, ge=8)
    http_graceful_shutdown_seconds: float = Field(default=10.0, ge=0)
    webhook_max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    trigger_max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    api_max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    form_max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    http_max_inflight_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1024 * 1024)
    json_max_depth: int = Field(default=64, ge=4, le=1000)
    trigger_replay_window_seconds: int = Field(default=86400, ge=60)
    trigger_timestamp_tolerance_seconds: int = Field(default=300, ge=10)
    rejection_interval_seconds: float = Field(default=60.0, gt=0)
    rejection_retention_days: int = Field(default=30, ge=1)
    auth_failures_allowed: int = Field(default=10, ge=1)
    auth_failure_window_seconds: float = Field(default=300.0, gt=0)
    # Sign in with Gitea (docs/ui.md "Signing in with Gitea"): the OAuth2 application's
    # client; unset, the one `forgeflow gitea connect --oauth` stored in the data folder.
    oauth_client_id: str | None = None
    oauth_client_secret: SecretStr | None = None
    # Gitea users who are operators too: listed logins, and site administrators if true.
    oauth_operators: str = ""
    oauth_admins_are_operators: bool = False
    # How long a user's permission on a repository, as Gitea answered it, is reused.
    oauth_access_cache_seconds: float = Field(default=30.0, ge=0, le=600)
    # Tests only: a page reading a value its data lacks fails instead of rendering empty.
    ui_strict_templates: bool = False

    def budgets(self) -> Budgets:
        """Budget defaults and prices."""
        return Budgets(
            self.budget_daily_tokens,
            self.budget_monthly_tokens,
            self.budget_threshold,
            self.price_input_per_mtok,
            self.price_output_per_mtok,
        )

    def price_table(self) -> Prices:
        """The prices per model (checked at load); the pair of FORGEFLOW_PRICE_* prices
        every other model, as the usage report does."""
        default = None
        if self.price_input_per_mtok is not None or self.price_output_per_mtok is not None:
            default = Price(
                Decimal(str(self.price_input_per_mtok or 0)),
                Decimal(str(self.price_output_per_mtok or 0)),
            )
        return Prices(parse_prices(self.prices), default, self.price_currency)

    def image_bounds(self) -> ImageBounds:
        return ImageBounds(self.image_max_count, self.image_max_bytes, self.image_max_total_bytes)

    def allowed_model_list(self) -> tuple[str, ...]:
        """The models ``--model`` may name: the configured one first, then the list."""
        listed = [m.strip() for m in self.allowed_models.split(",") if m.strip()]
        ordered = ([self.model] if self.model else []) + listed
        return tuple(dict.fromkeys(ordered))

    def review_allowed(self) -> dict[str, frozenset[str]]:
        """The review events each repository allows besides COMMENT, by "owner/repo"."""
        return {k.lower(): frozenset(v) for k, v in self.review_events.items()}

    def oauth_operator_logins(self) -> frozenset[str]:
        return frozenset(x.strip().lower() for x in self.oauth_operators.split(",") if x.strip())

    def review_skipped(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.review_skip.split(",") if p.strip())

    def egress_policy(self) -> EgressPolicy:
        """The egress proxy's policy; the settings were checked at load."""
        return EgressPolicy(
            parse_hosts(self.egress_allow, "FORGEFLOW_EGRESS_ALLOW"),
            parse_ports(self.egress_ports, "FORGEFLOW_EGRESS_PORTS"),
            parse_pins(self.egress_resolve, "FORGEFLOW_EGRESS_RESOLVE"),
            {
                key.lower(): parse_hosts(hosts, "FORGEFLOW_EGRESS_REPOS")
                for key, hosts in self.egress_repos.items()
            },
        )

    # The checks pydantic's types do not make (config_checks.py).
    _check_egress = field_validator("egress_allow", "egress_ports", "egress_resolve")(checks.egress)
    _check_prices = field_validator("prices")(checks.prices)
    _check_currency = field_validator("price_currency")(checks.currency)
    _check_egress_repos = field_validator("egress_repos")(checks.egress_repos)
    _check_url = field_validator("gitea_url", "public_url", "model_base_url")(checks.url)
    _check_db = field_validator("database_url")(checks.database_url)
    _check_admin_token = field_validator("admin_token")(checks.admin_token)
    _check_login = field_validator("bot_login")(checks.bot_login)
    _check_command = field_validator("codex_command", "gitea_mcp_command")(checks.command)
    _check_log_level = field_validator("log_level")(checks.log_level)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment wins over the file, as DESIGN "Contracts" says.
        toml_file = getattr(settings_cls, "toml_file", None)
        if toml_file is None:
            return (init_settings, env_settings)
        return (init_settings, env_settings, TomlSource(settings_cls, toml_file))

    # Derived values -------------------------------------------------------------

    @property
    def resolved_database_url(self) -> str:
        if self.database_url is not None:
            url = self.database_url.get_secret_value()
            if url.startswith("postgres://"):
                url = "postgresql://" + url.removeprefix("postgres://")
            if url.startswith("postgresql://"):
                url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
            return url
        return f"sqlite:///{(self.data_dir / 'forgeflow.db').resolve()}"

    @property
    def resolved_environment_roots(self) -> Path:
        return (self.environment_roots or self.data_dir / "environments" / "roots").resolve()

    @property
    def resolved_workspace_root(self) -> Path:
        return (self.workspace_root or self.data_dir / "workspaces").resolve()

    @property
    def codex_argv(self) -> list[str]:
        """The Codex command; a bare ``codex`` is the one scripts/setup.sh pinned in this
        installation when it is there, so ``.venv/bin/forgeflow`` run from anywhere (a
        service unit, another folder) finds it without ``PATH``, else ``codex`` on PATH."""
        argv = shlex.split(self.codex_command)
        if argv[0] == "codex" and PINNED_CODEX.is_file():
            argv[0] = str(PINNED_CODEX)
        return argv

    @property
    def gitea_mcp_argv(self) -> list[str]:
        return shlex.split(self.gitea_mcp_command)

    @property
    def codex_home_path(self) -> Path | None:
        """The operator's Codex configuration: ``FORGEFLOW_CODEX_HOME``, else the
        ``CODEX_HOME`` forgeflow runs with, else ``~/.codex``."""
        if self.codex_home is not None:
            return self.codex_home
        env = os.environ.get("CODEX_HOME")
        return Path(env) if env else Path.home() / ".codex"

    def secret_values(self) -> list[str]:
        """Every secret this process knows, for log and audit redaction."""
        values = [
            s.get_secret_value()
            for s in (
                self.gitea_token,
                self.webhook_secret,
                self.admin_token,
                self.model_api_key,
                self.oauth_client_secret,
            )
            if s is not None and s.get_secret_value()
        ]
        if self.database_url is not None:
            password = _url_password(self.database_url.get_secret_value())
            if password:
                values.append(password)
        return values


def _url_password(url: str) -> str | None:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).password
    except Exception:
        return None


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Load settings or raise :class:`ConfigError` with one line naming the variable."""
    try:
        return _settings_class(config_file)(**overrides)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = ENV_PREFIX + str(err["loc"][0]).upper() if err["loc"] else "configuration"
        raise ConfigError(f"{name}: {err['msg']}") from None


def _settings_class(config_file: Path | None) -> type[Settings]:
    if config_file is None:
        return Settings

    # A subclass per file: pydantic-settings asks the class, not the call, for sources.
    class SettingsFromFile(Settings):
        toml_file: ClassVar[Path | None] = config_file

    return SettingsFromFile
