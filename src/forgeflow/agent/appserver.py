"""One repository's ``codex app-server``: started with the repository's first turn,
inside its jail, and stopped when idle.

Each app-server runs in its own process group, whose id is kept in the data folder: a
crashed forgeflow leaves its app-servers behind, still holding their threads' writer
locks, and the next start ends them first (observed with codex 0.171.0).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import structlog

import forgeflow
from forgeflow.agent import forward, jail
from forgeflow.agent.broker import Grant
from forgeflow.agent.codexconfig import CodexConfig, server_key
from forgeflow.agent.envroot import RootUse
from forgeflow.agent.jsonrpc import (
    Handler,
    Json,
    ProcessGone,
    RpcError,
    RpcProcess,
    RpcTimeout,
    kill_group,
)
from forgeflow.agent.port import AgentError, Notice
from forgeflow.agent.provider import CAPABILITY_ENV, overrides, with_capability_env
from forgeflow.domain.ids import RepoRef
from forgeflow.domain.paths import agent_home, environment_dir, repo_sessions, repo_workspace

log = structlog.get_logger("forgeflow.appserver")

_FORWARD_IN_JAIL = "/opt/forgeflow/forward.py"
_SOCKET_IN_JAIL = "/run/forgeflow/broker.sock"
_EGRESS_IN_JAIL = "/run/forgeflow/egress.sock"
# NO_PROXY: the brokers are on the jail's own loopback (forward.py), never the proxy.
_NO_PROXY = "127.0.0.1,localhost,::1"


def egress_port(broker_port: int) -> int:
    """The proxy's port on the jail's loopback: any but the broker's."""
    return 3128 if broker_port != 3128 else 3129


def proxy_env(port: int) -> dict[str, str]:
    """What makes pip, npm, apt, curl and git use the egress proxy unasked."""
    url = f"http://127.0.0.1:{port}"
    env = {k: url for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
    env.update({"NO_PROXY": _NO_PROXY, "no_proxy": _NO_PROXY, "npm_config_proxy": url})
    env["npm_config_https_proxy"] = url
    return env


Forwarded = tuple[list[str], tuple[tuple[str, str, str], ...], tuple[Path, ...]]


def forwarder(system: jail.JailSystem, pairs: list[tuple[int, Path, str]]) -> Forwarded:
    """``forward.py`` run before a jail's command, relaying each (port of the jail's
    loopback, host socket, its path in the jail): its argv up to ``--``, its binds and
    what of the host's base Python must be readable in the jail."""
    # An environment's root has its own Python (envroot.BASE_PACKAGES).
    base = Path(sys.base_prefix) if system.root is None else Path("/usr")
    argv = [str(base / "bin" / "python3"), _FORWARD_IN_JAIL]
    placed = [("--ro-bind", forward.__file__, _FORWARD_IN_JAIL)]
    for port, socket, inside in pairs:
        argv += [str(port), inside]
        placed.append(("--bind", str(socket), inside))
    argv.append("--")
    readable = () if base == Path("/usr") or Path("/usr") in base.parents else (base,)
    return argv, tuple(placed), readable


def proxied(
    system: jail.JailSystem, command: list[str], socket: Path
) -> tuple[Forwarded, dict[str, str]]:
    """``command`` in a jail without network reaching only its egress proxy at
    ``socket`` (a setup run, #26): the forwarder, and the proxy's environment."""
    port = egress_port(0)
    argv, placed, readable = forwarder(system, [(port, socket, _EGRESS_IN_JAIL)])
    return ([*argv, *command], placed, readable), proxy_env(port)


_MAKE_CODEX_HOME = 'mkdir -p -- "$CODEX_HOME" && exec "$0" "$@"'


@dataclass(frozen=True, slots=True)
class Launch:
    """How an app-server is started: the command and, when jailed, its jail."""

    argv: list[str]
    root: Path  # the workspace root, forgeflow's: every tree below it is made checked
    home: Path  # the repository's private home (host path)
    repository: tuple[Path, ...]  # its clone and its sessions folder
    installation: tuple[Path, ...]  # the Codex installation, read-only
    read_only: bool  # a draft space's jail: the repository read-only
    jailed: bool
    network: str  # FORGEFLOW_AGENT_NETWORK: "proxy", "off" or "on" (the host's)
    config: Json  # the jail's Codex config (passed as -c overrides)
    log_path: Path
    pgid_file: Path
    bwrap: str = "bwrap"
    broker_socket: Path | None = None  # without network: the brokers' Unix socket
    broker_port: int = 0
    egress_socket: Path | None = None  # "proxy": this jail's egress proxy socket
    git_name: str = "forgeflow-agent"
    system: jail.JailSystem = jail.HOST_SYSTEM  # the repository's environment (#26)
    # What the repository's setup left for its turns: bound read-only at jail.ENV_DIR
    env_dir: Path | None = None

    def _offline(self, codex: list[str]) -> Forwarded:
        """A jail without network reaches the brokers through ``forward.py``."""
        assert self.broker_socket is not None
        pairs = [(self.broker_port, self.broker_socket, _SOCKET_IN_JAIL)]
        if self.egress_socket is not None:
            pairs.append((egress_port(self.broker_port), self.egress_socket, _EGRESS_IN_JAIL))
        argv, placed, readable = forwarder(self.system, pairs)
        return [*argv, *codex], placed, readable

    def command(self, capability: str) -> tuple[list[str], dict[str, str]]:
        """The command line (no secret in it) and its environment (the capability, the
        git identity: nothing is written into the agent's home)."""
        email = f"{self.git_name}@forgeflow.invalid"
        extra = {
            CAPABILITY_ENV: capability,
            "GIT_AUTHOR_NAME": self.git_name,
            "GIT_AUTHOR_EMAIL": email,
            "GIT_COMMITTER_NAME": self.git_name,
            "GIT_COMMITTER_EMAIL": email,
        }
        if self.env_dir is not None:
            extra[jail.ENV_DIR_VAR] = jail.ENV_DIR if self.jailed else str(self.env_dir)
        own = self.argv if self.system.root is None else jail.direct_command(self.argv)
        codex = [*own, *overrides(with_capability_env(self.config))]
        if self.jailed:
            # Codex wants its CODEX_HOME to exist; it is made inside the jail, by the
            # jail (forgeflow's host side creates nothing in the agent's home).
            codex = ["/bin/sh", "-c", _MAKE_CODEX_HOME, *codex]
            writable, readable = self.repository, self.installation
            if self.read_only:
                writable, readable = (), readable + self.repository
            argv = codex
            placed: tuple[tuple[str, str, str], ...] = ()
            if self.network != "on":
                argv, placed, python = self._offline(codex)
                readable += python
            if self.egress_socket is not None:
                extra.update(proxy_env(egress_port(self.broker_port)))
            if self.env_dir is not None:
                # Read-only: a turn must not leave anything there for the next setup
                # (which runs with the secrets) or change what later turns are given.
                jail.check_top_level(self.env_dir)
                placed += (("--ro-bind", str(self.env_dir), jail.ENV_DIR),)
            spec = jail.JailSpec(
                self.home,
                writable,
                readable,
                network=self.network == "on",
                env=extra,
                placed=placed,
                system=self.system,
            )
            jail.check_spec(spec)
            return jail.bwrap_argv(spec, argv, bwrap=self.bwrap), jail.jail_env(spec)
        # Unjailed (FORGEFLOW_SANDBOX=none): the same fixed environment, host paths.
        env = jail.base_env(
            {
                **dict(self.system.variables),
                **extra,
                "PATH": os.environ.get("PATH", jail.JAIL_PATH),
                "HOME": str(self.home),
                "CODEX_HOME": str(self.home / ".codex"),
            }
        )
        return codex, env


def repository_launch(
    cfg: CodexConfig,
    ref: RepoRef,
    read_only: bool,
    *,
    installation: tuple[Path, ...],
    model_url: str,
    broker_socket: Path | None,
    broker_port: int,
    egress_socket: Path | None,
    system: jail.JailSystem,
) -> Launch:
    """The launch of ``ref``'s app-server (a draft space's with ``read_only``): its home,
    its clone and sessions, the Codex config that sends its model requests to
    ``model_url`` (the broker's), its sockets and the system of its environment."""
    root = str(cfg.workspace_root)
    key = server_key(ref.owner, ref.name, read_only)
    return Launch(
        argv=cfg.argv,
        root=cfg.workspace_root,
        home=Path(agent_home(root, ref, read_only=read_only)),
        repository=(Path(repo_workspace(root, ref)), Path(repo_sessions(root, ref))),
        installation=installation,
        read_only=read_only,
        jailed=cfg.jailed,
        network=cfg.network,
        config=cfg.provider.jail_config(model_url),
        log_path=cfg.data_dir / "logs" / "codex-app-server.log",
        pgid_file=pgid_file(cfg.data_dir / "run", key),
        broker_socket=broker_socket,
        broker_port=broker_port,
        egress_socket=egress_socket,
        git_name=cfg.bot_login,
        system=system,
        env_dir=Path(environment_dir(root, ref)),
    )


def pgid_file(run_dir: Path, key: str) -> Path:
    return run_dir / f"codex-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pgid"


def end_leftovers(run_dir: Path) -> int:
    """End every app-server group a crashed forgeflow left (their pgid files)."""
    ended = 0
    for path in run_dir.glob("codex-*.pgid"):
        with contextlib.suppress(ValueError, OSError):
            kill_group(int(path.read_text().strip()))
            ended += 1
        path.unlink(missing_ok=True)
    return ended


@dataclass(eq=False)
class AppServer:
    key: str  # the repository, "owner/repo", and " (read-only)" for draft spaces
    owner: str
    repo: str
    read_only: bool
    model: Grant
    capability: str
    proc: RpcProcess | None = None
    collaboration: bool = False
    loaded: set[str] = field(default_factory=set)
    mcp: dict[str, asyncio.Future[str]] = field(default_factory=dict)
    notices: list[Notice] = field(default_factory=list)
    downgraded: set[str] = field(default_factory=set)
    active: int = 0  # turns in flight
    system: str = "host"  # the key of the environment it was started on
    use: RootUse | None = None  # its hold on the environment's root while it runs
    idle_timer: asyncio.TimerHandle | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def running(self) -> bool:
        return self.proc is not None and not self.proc.closed.is_set()

    async def start(self, launch: Launch, on_message: Handler, timeout: float) -> RpcProcess:
        # forgeflow writes nothing inside the agent's home or trees (a symlink planted
        # there would lead the write elsewhere): it only makes the top-level folders,
        # whose parents are its own, and the jail checks them with lstat.
        for path in (launch.home, *launch.repository):
            jail.make_tree(launch.root, path)
        if launch.env_dir is not None:
            jail.make_tree(launch.root, launch.env_dir)
        if not launch.jailed:  # one trusted user: no jail to make it in
            (launch.home / ".codex").mkdir(exist_ok=True)
        argv, env = launch.command(self.capability)
        if launch.jailed and launch.system.root is not None:
            # Held until stop(): the root is not removed under a running jail.
            self.use = RootUse(launch.system.root)
        try:
            proc = await RpcProcess.spawn(
                argv,
                env=env,
                on_message=on_message,
                stderr_path=launch.log_path,
                pgid_file=launch.pgid_file,
            )
        except OSError as exc:
            self._release()
            raise AgentError(
                "app_server_unavailable", f"codex app-server did not start: {exc}", retryable=True
            ) from None
        except BaseException:
            self._release()
            raise
        try:
            await proc.request(
                "initialize",
                {
                    "clientInfo": {
                        "name": "forgeflow",
                        "title": "forgeflow",
                        "version": forgeflow.__version__,
                    },
                    "capabilities": {"experimentalApi": True},
                },
                timeout,
            )
            await proc.notify("initialized")
        except (RpcError, RpcTimeout, ProcessGone) as exc:
            await proc.close()
            self._release()
            raise AgentError(
                "app_server_timeout", f"initialize failed: {exc}", retryable=True
            ) from None
        self.proc = proc
        await self._probe(proc)
        log.info("codex.started", repo=self.key, jailed=launch.jailed, pid=proc.proc.pid)
        return proc

    async def _probe(self, proc: RpcProcess) -> None:
        """Best-effort capability probes; a failure is a recorded downgrade, never fatal."""
        try:
            await proc.request(
                "experimentalFeature/enablement/set", {"enablement": {"goals": True}}, 10
            )
        except (RpcError, RpcTimeout) as exc:
            self.downgrade("experimentalFeature/enablement/set", str(exc))
        try:
            modes = await proc.request("collaborationMode/list", {}, 10)
            names = {
                str(m.get("mode") or m.get("name"))
                for m in modes.get("data", [])
                if isinstance(m, dict)
            }
            self.collaboration = "default" in names
            if not self.collaboration:
                self.downgrade("collaborationMode/list", f"no default mode in {sorted(names)}")
        except (RpcError, RpcTimeout) as exc:
            self.collaboration = False
            self.downgrade("collaborationMode/list", str(exc))

    def downgrade(self, what: str, why: str) -> None:
        if what in self.downgraded:
            return
        self.downgraded.add(what)
        self.notices.append(
            Notice(0, "capability_downgrade", {"capability": what, "reason": why[:500]})
        )

    async def stop(self) -> None:
        """End the process group; its threads are loaded again by the next app-server."""
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        for fut in self.mcp.values():
            if not fut.done():
                fut.set_result("failed")
        self.mcp.clear()
        self.loaded.clear()
        if self.proc is not None:
            await self.proc.close()
        self.proc = None
        self._release()

    def _release(self) -> None:
        if self.use is not None:
            self.use.release()
            self.use = None
