"""The Codex app-server adapter of the ``AgentRuntime`` port.

One ``codex app-server`` per active repository (``appserver.py``), jailed
(``jail.py``) unless ``FORGEFLOW_SANDBOX=none``, started with the repository's first
turn and stopped after ``FORGEFLOW_AGENT_IDLE_SECONDS`` without one; a later mention
resumes the same thread in a fresh app-server. Each issue or pull request has its own
thread (``threads.py``), started with the session's worktree as ``cwd`` and
``approvalPolicy: never``.
Inside the jail every turn runs with ``externalSandbox`` (the jail is the sandbox);
unjailed with ``dangerFullAccess``; a pipeline draft space (review/plan mode) with
``readOnly`` and no Gitea tools (docs/codex-app-server.md).

No credential reaches an app-server: its model requests go through the broker's
pass-through with a capability of its repository, its Gitea tools through the broker's
``/mcp`` with a capability of its session (``broker.py``, ``gitea_tools/``); its other
traffic through its jail's egress proxy (``egress.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import structlog

from forgeflow.agent import jail
from forgeflow.agent.appserver import AppServer, end_leftovers, repository_launch
from forgeflow.agent.broker import Broker, Grant
from forgeflow.agent.codexconfig import (
    CodexConfig,
    audit_params,
    config_from_settings,
    server_key,
)
from forgeflow.agent.egress import JailEgress
from forgeflow.agent.gitea_tools import Comments, GiteaTools, Publish
from forgeflow.agent.gitea_tools.external import External, mcp_env
from forgeflow.agent.gitea_tools.handlers import SubmitReview
from forgeflow.agent.items import TurnEnd, TurnState
from forgeflow.agent.jsonrpc import Json, ProcessGone, RpcError, RpcProcess, RpcTimeout
from forgeflow.agent.messages import on_message
from forgeflow.agent.oneshot import JailRunner
from forgeflow.agent.port import (
    AgentError,
    AgentEvent,
    CommentTool,
    Notice,
    SessionSpec,
    TurnCompleted,
    TurnHandle,
    TurnSpec,
    TurnStatus,
)
from forgeflow.agent.rollout import RolloutJail
from forgeflow.agent.threads import mcp_ready, open_thread, thread_params
from forgeflow.agent.turnstart import request_start, start_params
from forgeflow.config import Settings
from forgeflow.domain.ids import RepoRef
from forgeflow.domain.json import JsonObject
from forgeflow.domain.rollout import NotKept, Rollout
from forgeflow.gitea.client import GiteaClient
from forgeflow.redaction import redact

log = structlog.get_logger("forgeflow.codex")


class CodexRuntime:
    def __init__(
        self,
        cfg: CodexConfig,
        publish: Publish | None = None,
        comments: Comments | None = None,
        reviews: SubmitReview | None = None,
        systems: jail.Systems | None = None,
    ) -> None:
        self.cfg = cfg
        # The repositories' environments (#26): the system each jail is started on.
        self.systems = systems
        external = None
        if cfg.mcp_argv:  # FORGEFLOW_GITEA_MCP_COMMAND: the opt-in external server
            external = External(
                cfg.mcp_argv,
                mcp_env(cfg.gitea_url, cfg.gitea_token),
                timeout=cfg.mcp_ready_timeout,
                stderr_path=cfg.data_dir / "logs" / "gitea-mcp.log",
                elicitation=cfg.elicitation_policy,
            )
        self._gitea = GiteaClient(cfg.gitea_url, cfg.gitea_token or None)
        self.tools = GiteaTools(
            self._gitea,
            cfg.bot_login,
            on_refused=self._refused,
            publish=publish,
            comments=comments,
            external=external,
            reviews=reviews,
        )
        offline = cfg.jailed and cfg.network != "on"
        # The jails' sockets live in a short private folder of this process's: a Unix
        # socket's path is limited to 107 bytes, and a data folder can be deeper than that.
        self._sockets = Path(tempfile.mkdtemp(prefix="forgeflow-"))
        self.broker = Broker(
            cfg.provider,
            self.tools,
            unix_socket=self._sockets / "broker.sock" if offline else None,
        )
        self._servers: dict[str, AppServer] = {}
        self._starting: dict[str, asyncio.Lock] = {}
        self._threads: dict[str, AppServer] = {}
        self._turns: dict[str, TurnState] = {}
        self._readable: tuple[Path, ...] | None = None
        self._swept = False
        self._closing = False  # no root removal is started while forgeflow stops
        # The threads' rollouts in and out of the jails (issue #27).
        self.rollouts = RolloutJail(JailRunner(cfg.workspace_root, jailed=cfg.jailed))
        self.egress = JailEgress(
            cfg.egress,
            self._sockets,
            enabled=cfg.jailed and cfg.network == "proxy",
            open_turns=lambda key: [
                t.handle.turn_id for t in self._turns.values() if t.server.key == key and not t.done
            ],
        )

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        publish: Publish | None = None,
        comments: Comments | None = None,
        reviews: SubmitReview | None = None,
        systems: jail.Systems | None = None,
    ) -> CodexRuntime:
        return cls(config_from_settings(settings), publish, comments, reviews, systems)

    @property
    def servers(self) -> list[str]:
        """The repositories whose app-server runs now."""
        return sorted(k for k, s in self._servers.items() if s.running)

    # -- one app-server per repository ---------------------------------------------------

    async def _server(self, owner: str, repo: str, read_only: bool) -> AppServer:
        key = server_key(owner, repo, read_only)
        async with self._starting.setdefault(key, asyncio.Lock()):
            server = self._servers.get(key)
            system = jail.HOST_SYSTEM
            if self.systems is not None:
                system = await self.systems.system(owner, repo)
            if server is not None and server.running:
                # On an older environment: kept while a turn runs on it, replaced once
                # it is idle (its threads are resumed by the next one).
                if server.system == system.key or server.active > 0:
                    return server
                await self._stop(server, None)
                server = None
            if server is not None:
                await self._stop(server, "codex app-server exited")
            await self.broker.start()
            if not self._swept:
                self._swept = True
                end_leftovers(self.cfg.data_dir / "run")
            await self.egress.start(key, f"{owner}/{repo}")
            grant = Grant(key, owner, repo)
            server = AppServer(key, owner, repo, read_only, grant, self.broker.grant(grant))
            server.system = system.key
            socket = await self.broker.jail_socket(key)
            if self._readable is None:
                self._readable = jail.installation_paths(self.cfg.argv) if self.cfg.jailed else ()
            launch = repository_launch(
                self.cfg,
                RepoRef(owner, repo),
                read_only,
                installation=self._readable,
                model_url=self.broker.model_url,
                broker_socket=socket,
                broker_port=self.broker.port,
                egress_socket=self.egress.socket(key),
                system=system,
            )
            proc = await server.start(launch, partial(self._on_message, server), 60.0)
            self._servers[key] = server
            asyncio.get_running_loop().create_task(self._watch(server, proc))
            self._arm_idle(server)
            return server

    def _arm_idle(self, server: AppServer) -> None:
        if server.idle_timer is not None:
            server.idle_timer.cancel()
        if server.active == 0:
            loop = asyncio.get_running_loop()
            server.idle_timer = loop.call_later(
                self.cfg.idle_seconds, lambda: loop.create_task(self._idle(server))
            )

    async def _idle(self, server: AppServer) -> None:
        if server.active == 0 and self._servers.get(server.key) is server:
            log.info("codex.idle_stopped", repo=server.key)
            await self._stop(server, None)

    async def _stop(self, server: AppServer, crash: str | None) -> None:
        """Stop one repository's app-server: its turns end interrupted, its capabilities
        are revoked, its threads are loaded again by the next one."""
        if self._servers.get(server.key) is server:
            del self._servers[server.key]
        self.broker.revoke(server.key)
        for turn in [t for t in self._turns.values() if t.server is server]:
            self._complete(
                turn,
                TurnStatus.INTERRUPTED,
                error_code="interrupted_by_restart",
                error=crash or "codex app-server stopped",
            )
        for thread in [t for t, s in self._threads.items() if s is server]:
            del self._threads[thread]
        await server.stop()
        await self.egress.stop(server.key)
        if self.systems is not None and not self._closing:  # its root may go now
            self.systems.released()

    async def _watch(self, server: AppServer, proc: RpcProcess) -> None:
        await proc.closed.wait()
        if self._servers.get(server.key) is server and server.proc is proc:  # still ours
            log.warning("codex.exited", repo=server.key, returncode=proc.proc.returncode)
            await self._stop(server, "codex app-server exited")

    async def _call(
        self, server: AppServer, method: str, params: Json, timeout: float | None = None
    ) -> Json:
        proc = server.proc
        if proc is None or proc.closed.is_set():
            raise AgentError("app_server_exited", "codex app-server is gone", retryable=True)
        try:
            return await proc.request(method, params, timeout or self.cfg.request_timeout)
        except RpcTimeout as exc:
            # A hung app-server is ended whole; the next call starts another.
            await self._stop(server, f"codex app-server hung: {exc}")
            raise AgentError("app_server_timeout", str(exc), retryable=True) from None
        except ProcessGone as exc:
            raise AgentError("app_server_exited", str(exc), retryable=True) from None

    # -- sessions -----------------------------------------------------------------------

    async def comment_tool(self) -> CommentTool:
        return await self.tools.comment_tool()

    async def ensure_session(self, spec: SessionSpec) -> str:
        server = await self._server(spec.owner, spec.repo, spec.read_only)
        # Held active while its thread opens (a restore takes a while): no idle stop.
        server.active += 1
        self._arm_idle(server)
        try:
            if spec.thread_id and spec.thread_id in server.loaded:
                return spec.thread_id
            return await self._open(server, spec)
        finally:
            server.active = max(0, server.active - 1)
            if self._servers.get(server.key) is server:
                self._arm_idle(server)

    async def _open(self, server: AppServer, spec: SessionSpec) -> str:
        params = thread_params(self.broker, server, spec)
        restore = partial(self.rollouts.restore, RepoRef(spec.owner, spec.repo))
        thread_id = await open_thread(self._call, server, spec, params, restore)
        if not spec.read_only or spec.review:
            await mcp_ready(server, thread_id, self.cfg.mcp_ready_timeout)
        server.loaded.add(thread_id)
        self._threads[thread_id] = server
        server.notices.append(Notice(0, "session.thread_params", audit_params(params)))
        return thread_id

    async def export_thread(self, owner: str, repo: str, thread_id: str) -> Rollout | NotKept:
        return await self.rollouts.export(RepoRef(owner, repo), thread_id)

    # -- turns --------------------------------------------------------------------------

    def _server_of(self, thread_id: str) -> AppServer:
        server = self._threads.get(thread_id)
        if server is None or not server.running:
            raise AgentError("app_server_exited", "the thread's app-server is gone", retryable=True)
        return server

    async def start_turn(self, thread_id: str, turn: TurnSpec) -> TurnHandle:
        server = self._server_of(thread_id)
        params, policy = start_params(self.cfg, server, thread_id, turn)
        # The turn counts as active from before its start is asked for: an idle stop in
        # that wait would leave a started turn on a stopped app-server, never ending.
        server.active += 1
        if server.idle_timer is not None:
            server.idle_timer.cancel()
            server.idle_timer = None
        try:
            result = await request_start(self._call, server, params)
        except BaseException:
            server.active = max(0, server.active - 1)
            if self._servers.get(server.key) is server:
                self._arm_idle(server)
            raise
        handle = TurnHandle(thread_id, str(result["turn"]["id"]))
        state = self._turns.setdefault(handle.turn_id, TurnState(handle, server))
        state.server = server
        state.usage_at_start = (server.model.usage.input_tokens, server.model.usage.output_tokens)
        if self._servers.get(server.key) is not server:  # it died while the turn started
            self._complete(
                state,
                TurnStatus.INTERRUPTED,
                error_code="interrupted_by_restart",
                error="codex app-server stopped",
            )
        for notice in server.notices:
            state.put(Notice(state.next_seq(), notice.action, notice.metadata))
        server.notices.clear()
        state.put(
            Notice(state.next_seq(), "turn.sandbox", {"sandboxPolicy": policy, "kind": turn.kind})
        )
        return handle

    async def events(self, handle: TurnHandle) -> AsyncIterator[AgentEvent]:
        state = self._turns.get(handle.turn_id)
        if state is None:
            return
        try:
            while True:
                event = await state.queue.get()
                yield event
                if isinstance(event, TurnCompleted):
                    return
        finally:
            self._turns.pop(handle.turn_id, None)

    async def interrupt(self, handle: TurnHandle) -> None:
        server = self._threads.get(handle.thread_id)
        if server is None:
            return
        with contextlib.suppress(RpcError):
            await self._call(
                server,
                "turn/interrupt",
                {"threadId": handle.thread_id, "turnId": handle.turn_id},
                10,
            )

    async def aclose(self) -> None:
        self._closing = True
        for server in list(self._servers.values()):
            await self._stop(server, "forgeflow stopped")
        await self.broker.aclose()
        await self._gitea.aclose()
        shutil.rmtree(self._sockets, ignore_errors=True)

    def _complete(self, turn: TurnState, status: TurnStatus, **kw: Any) -> None:
        """End a turn once: the broker's count of its model use, then its completion;
        its app-server may go idle from now on."""
        blocks = self.egress.take(turn.handle.turn_id)
        if blocks is not None and not turn.done:
            turn.put(Notice(turn.next_seq(), "egress.blocked", blocks.metadata()))
        if not turn.finish(status, **kw):
            return
        turn.server.active = max(0, turn.server.active - 1)
        if self._servers.get(turn.server.key) is turn.server:
            self._arm_idle(turn.server)

    def _refused(self, grant: Grant, tool: str, args: JsonObject, why: str) -> None:
        """A Gitea tool call the broker refused: reported in the session's turn."""
        log.warning("mcp.refused", repo=grant.server, tool=tool)
        for turn in self._turns.values():
            if turn.server.key == grant.server and not turn.done:
                turn.put(
                    Notice(
                        turn.next_seq(),
                        "mcp.refused",
                        {"tool": tool, "arguments": redact(args), "reason": why},
                    )
                )

    # -- messages from an app-server ------------------------------------------------------

    async def _on_message(self, server: AppServer, msg: Json) -> None:
        await on_message(server, msg, self._turns, self.cfg.elicitation_policy, self._ended)

    def _ended(self, turn: TurnState, ended: TurnEnd) -> None:
        status, code, message = ended
        self._complete(turn, status, error_code=code, error=message)
