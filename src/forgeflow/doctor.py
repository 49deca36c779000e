"""``forgeflow doctor``: check, in order, everything forgeflow needs; one line each, with
the fix when something is wrong."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from forgeflow.agent import envroot, jail
from forgeflow.agent.gitea_tools.external import External, mcp_env
from forgeflow.agent.jsonrpc import Json, ProcessGone, RpcError, RpcProcess, RpcTimeout
from forgeflow.agent.port import AgentError
from forgeflow.agent.provider import ProviderError, load_provider
from forgeflow.config import Settings
from forgeflow.gitea.client import GiteaClient, GiteaError
from forgeflow.store import Store, StoreUnavailable, environments

MIN_FREE_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        mark = "ok  " if self.ok else "FAIL"
        text = f"[{mark}] {self.name}: {self.detail}"
        return text if self.ok or not self.fix else f"{text} — fix: {self.fix}"


async def run_checks(s: Settings) -> list[Check]:
    steps: list[Callable[[Settings], Awaitable[Check]]] = [
        _configuration,
        _database,
        _gitea,
        _webhook_secret,
        _sandbox,
        _environments,
        _model,
        _codex,
        _gitea_mcp,
        _workspace,
        _disk,
    ]
    return [await step(s) for step in steps]


async def _configuration(s: Settings) -> Check:
    missing = [
        name
        for name, value in (
            ("FORGEFLOW_GITEA_URL", s.gitea_url),
            ("FORGEFLOW_GITEA_TOKEN", s.gitea_token),
            ("FORGEFLOW_WEBHOOK_SECRET", s.webhook_secret),
        )
        if value is None
    ]
    if missing:
        return Check(
            "configuration",
            False,
            "missing " + ", ".join(missing),
            "set them in the environment or the --config file",
        )
    return Check("configuration", True, "complete")


async def _database(s: Settings) -> Check:
    store = Store(s.resolved_database_url)
    try:
        await store.ping()
        current = await store.read(lambda _c: store.is_current())
    except (StoreUnavailable, Exception) as exc:
        return Check(
            "database",
            False,
            f"unreachable ({type(exc).__name__})",
            "check FORGEFLOW_DATABASE_URL and that the server runs",
        )
    finally:
        store.close()
    if not current:
        return Check("database", False, "reachable but not migrated", "run `forgeflow migrate`")
    return Check("database", True, f"reachable and migrated ({store.dialect})")


async def _gitea(s: Settings) -> Check:
    if s.gitea_url is None or s.gitea_token is None:
        return Check("gitea", False, "not configured", "set FORGEFLOW_GITEA_URL and _TOKEN")
    client = GiteaClient(s.gitea_url, s.gitea_token.get_secret_value(), timeout=10)
    try:
        try:
            version = await client.version()
        except GiteaError as exc:
            return Check(
                "gitea",
                False,
                f"unreachable at {s.gitea_url} ({exc})",
                "check FORGEFLOW_GITEA_URL and the network",
            )
        try:
            user = await client.current_user()
        except GiteaError:
            return Check(
                "gitea",
                False,
                f"Gitea {version} refuses the token",
                "create a new token for the bot and set FORGEFLOW_GITEA_TOKEN",
            )
        login = user.login
        if login.lower() != s.bot_login.lower():
            return Check(
                "gitea",
                False,
                f"the token belongs to {login!r}, not {s.bot_login!r}",
                "use the bot's token or set FORGEFLOW_BOT_LOGIN",
            )
        # A write to a repository that does not exist: 404 with the scope, 403 without.
        probe = f"/repos/{login}/forgeflow-doctor-probe"
        for scope, method, path in (
            ("write:issue", "POST", f"{probe}/issues"),
            ("write:repository", "PATCH", probe),
        ):
            if await client.request_status(method, path, json={}) == 403:
                return Check(
                    "gitea",
                    False,
                    f"the token lacks the {scope} scope",
                    "create the token with repository and issue write access",
                )
        return Check("gitea", True, f"Gitea {version}, token of {login}, write scopes present")
    finally:
        await client.aclose()


async def _webhook_secret(s: Settings) -> Check:
    if s.webhook_secret is None:
        return Check(
            "webhook secret",
            False,
            "not set",
            "set FORGEFLOW_WEBHOOK_SECRET to the secret of the Gitea webhook",
        )
    return Check("webhook secret", True, "set")


async def _codex(s: Settings) -> Check:
    async def ignore(_m: Json) -> None:
        return None

    argv = s.codex_argv
    if shutil.which(argv[0]) is None:
        return Check(
            "codex",
            False,
            f"command {argv[0]!r} not found",
            "install @openai/codex (scripts/setup.sh) or set FORGEFLOW_CODEX_COMMAND",
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEFLOW_")}
    try:
        proc = await RpcProcess.spawn(argv, env=env, on_message=ignore)
    except OSError as exc:
        return Check("codex", False, f"does not start ({exc})", "check FORGEFLOW_CODEX_COMMAND")
    try:
        info = await proc.request(
            "initialize",
            {
                "clientInfo": {"name": "forgeflow-doctor", "version": "1"},
                "capabilities": {"experimentalApi": True},
            },
            30,
        )
    except (RpcError, RpcTimeout, ProcessGone) as exc:
        return Check(
            "codex", False, f"initialize failed ({exc})", "run the command by hand to see why"
        )
    finally:
        await proc.close()
    return Check("codex", True, f"app-server answers initialize ({info.get('userAgent', '?')})")


async def _sandbox(s: Settings) -> Check:
    if s.sandbox == "none":
        return Check(
            "sandbox",
            True,
            "FORGEFLOW_SANDBOX=none: the agent runs unjailed, as forgeflow's user "
            "(for a single trusted user only)",
        )
    try:
        await asyncio.to_thread(jail.probe)
    except jail.JailUnavailable as exc:
        return Check("sandbox", False, "bubblewrap cannot run here", str(exc))
    network = {
        "on": "on (the host's network)",
        "off": "off (brokers only)",
        "proxy": "proxy (allow-listed hosts)",
    }[s.agent_network]
    return Check("sandbox", True, f"bubblewrap runs a jail here; agent network {network}")


async def _environments(s: Settings) -> Check:
    """Whether mmdebstrap can build a repository's root here (issue #26): a simulated
    build when some environment lists packages, else the tools only (an installation
    without such environments needs none of it)."""
    store = Store(s.resolved_database_url)
    try:
        wanted = await store.read(environments.any_with_packages)
    except Exception:  # no database or not migrated: the database check names it
        wanted = False
    finally:
        store.close()
    try:
        if wanted:
            scratch = s.resolved_environment_roots
            scratch.mkdir(parents=True, exist_ok=True)
            await envroot.probe_build(envroot.host_suite(), scratch, s.mmdebstrap_command)
            return Check("environments", True, "mmdebstrap builds a root here (simulated)")
        await asyncio.to_thread(envroot.probe_tools, s.mmdebstrap_command)
    except envroot.RootsUnavailable as exc:
        if not wanted:
            return Check("environments", True, f"no environment lists packages ({exc})")
        return Check("environments", False, "mmdebstrap cannot build a root here", str(exc))
    return Check("environments", True, "mmdebstrap is ready (no environment lists packages)")


async def _model(s: Settings) -> Check:
    """Where the model pass-through sends the agent's requests, and whether it has a
    key for them (never the key itself)."""
    key = s.model_api_key.get_secret_value() if s.model_api_key else None
    try:
        provider = load_provider(
            base_url=s.model_base_url, api_key=key, codex_home=s.codex_home_path
        )
    except ProviderError as exc:
        return Check("model", False, str(exc), "fix the file or set FORGEFLOW_MODEL_BASE_URL")
    if not provider.api_key:
        return Check(
            "model",
            False,
            f"no key for {provider.base_url}",
            "set FORGEFLOW_MODEL_API_KEY, or the variable your CODEX_HOME's provider names "
            "in env_key (OPENAI_API_KEY for OpenAI)",
        )
    return Check("model", True, f"requests go to {provider.base_url}, with a key")


async def _gitea_mcp(s: Settings) -> Check:
    if not s.gitea_mcp_argv:
        return Check("gitea tools", True, "forgeflow's own Gitea tools (no external server)")
    token = s.gitea_token.get_secret_value() if s.gitea_token else ""
    external = External(
        s.gitea_mcp_argv, mcp_env(s.gitea_url or "", token), timeout=s.mcp_timeout_seconds
    )
    try:
        offered = await external.tools(exclude=set())
    except AgentError as exc:
        return Check(
            "gitea-mcp",
            False,
            f"{exc.code}: {exc}",
            "install the external Gitea MCP server, or unset FORGEFLOW_GITEA_MCP_COMMAND",
        )
    finally:
        await external.aclose()
    return Check("gitea-mcp", True, f"external MCP server ready, {len(offered)} scoped tools")


async def _workspace(s: Settings) -> Check:
    root = s.resolved_workspace_root
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".doctor-"):
            pass
    except OSError as exc:
        return Check(
            "workspace root",
            False,
            f"{root} is not writable ({exc.strerror})",
            "set FORGEFLOW_WORKSPACE_ROOT to a writable folder",
        )
    return Check("workspace root", True, f"{root} is writable")


async def _disk(s: Settings) -> Check:
    where = s.resolved_workspace_root
    while not where.exists():
        where = where.parent
    free = shutil.disk_usage(where).free
    gib = free / (1 << 30)
    if free < MIN_FREE_BYTES:
        return Check(
            "free disk",
            False,
            f"{gib:.1f} GiB free under {where}",
            "free space or move FORGEFLOW_WORKSPACE_ROOT",
        )
    return Check("free disk", True, f"{gib:.1f} GiB free under {where}")


def doctor(s: Settings) -> tuple[list[Check], int]:
    checks = asyncio.run(run_checks(s))
    return checks, 0 if all(c.ok for c in checks) else 1
