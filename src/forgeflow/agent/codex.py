"""The Codex app-server adapter of the ``AgentRuntime`` port (ARCHITECTURE §5.3, §6.3).

One long-lived ``codex app-server`` per worker, in its own process group. Each issue
or pull request has its own thread, started with the session's worktree as ``cwd``,
``approvalPolicy: never`` with ``danger-full-access`` (codexapp + yolo) and the Gitea MCP
server injected at thread level, with the bot token in that thread's MCP ``env`` only.
A pipeline draft space (review/plan mode) has a thread of its own: ``read-only``, no
MCP server; every ``turn/start`` names its sandbox policy (docs/codex-app-server.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

import forgeflow
from forgeflow.agent.jsonrpc import Json, ProcessGone, RpcError, RpcProcess, RpcTimeout
from forgeflow.agent.mcp import mcp_env, preflight, resolve_command
from forgeflow.agent.port import (
    AgentError,
    AgentEvent,
    CommentTool,
    NeedsUser,
    Notice,
    SessionSpec,
    TokenUsage,
    ToolCall,
    TurnCompleted,
    TurnHandle,
    TurnSpec,
    TurnStatus,
)
from forgeflow.config import Settings
from forgeflow.redaction import redact

log = structlog.get_logger("forgeflow.codex")

# forgeflow's own secrets never reach the app-server or the agent's shell (DESIGN).
_PRIVATE_ENV = (
    "FORGEFLOW_GITEA_TOKEN",
    "FORGEFLOW_WEBHOOK_SECRET",
    "FORGEFLOW_ADMIN_TOKEN",
    "FORGEFLOW_DATABASE_URL",
)
RESUME_UNKNOWN = -32600


@dataclass
class _Turn:
    handle: TurnHandle
    queue: asyncio.Queue[AgentEvent] = field(default_factory=asyncio.Queue)
    seq: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    last_message: str | None = None
    error: str | None = None

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq


@dataclass(frozen=True, slots=True)
class CodexConfig:
    argv: list[str]
    mcp_argv: list[str]
    gitea_url: str
    gitea_token: str
    data_dir: Path
    model: str | None = None
    reasoning_effort: str | None = None
    request_timeout: float = 60.0
    mcp_ready_timeout: float = 30.0
    elicitation_policy: str = "decline"


def _audit_params(params: Json) -> dict[str, Any]:
    """What a thread was started with, for the audit: env names, never values."""
    servers = (params.get("config") or {}).get("mcp_servers") or {}
    return {
        "cwd": params["cwd"],
        "approvalPolicy": params["approvalPolicy"],
        "sandbox": params["sandbox"],
        "mcpServers": {
            name: {
                "command": server["command"],
                "args": server["args"],
                "env": sorted(server["env"]),
            }
            for name, server in servers.items()
        },
    }


def sandbox_policy(read_only: bool) -> Json:
    """``turn/start``'s ``sandboxPolicy`` (0.171.0 ``SandboxPolicy``). It overrides the
    thread's sandbox "for this turn and subsequent turns", so every turn sends its own:
    a turn never inherits another's policy."""
    if read_only:
        return {"type": "readOnly", "networkAccess": False}
    return {"type": "dangerFullAccess"}


class CodexRuntime:
    def __init__(self, cfg: CodexConfig) -> None:
        self.cfg = cfg
        self._proc: RpcProcess | None = None
        self._lock = asyncio.Lock()
        self._loaded: set[str] = set()
        self._mcp: dict[str, asyncio.Future[str]] = {}
        self._turns: dict[str, _Turn] = {}
        self._notices: list[Notice] = []
        self._downgraded: set[str] = set()
        self._collaboration = False
        self._tool: CommentTool | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> CodexRuntime:
        if settings.gitea_url is None or settings.gitea_token is None:
            raise AgentError(
                "not_configured", "the Codex runtime needs the Gitea settings", retryable=False
            )
        return cls(
            CodexConfig(
                argv=settings.codex_argv,
                mcp_argv=settings.gitea_mcp_argv,
                gitea_url=settings.gitea_url,
                gitea_token=settings.gitea_token.get_secret_value(),
                data_dir=Path(settings.data_dir),
                model=settings.model,
                reasoning_effort=settings.reasoning_effort,
                mcp_ready_timeout=settings.mcp_timeout_seconds,
                elicitation_policy=settings.elicitation_policy,
            )
        )

    # -- the app-server process ---------------------------------------------------

    def _env(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if k not in _PRIVATE_ENV}

    async def _server(self) -> RpcProcess:
        async with self._lock:
            if self._proc is not None and not self._proc.closed.is_set():
                return self._proc
            if self._proc is not None:
                await self._restarted()
            try:
                proc = await RpcProcess.spawn(
                    self.cfg.argv,
                    env=self._env(),
                    on_message=self._on_message,
                    stderr_path=self.cfg.data_dir / "logs" / "codex-app-server.log",
                    pgid_file=self.cfg.data_dir / "codex-app-server.pgid",
                )
            except OSError as exc:
                raise AgentError(
                    "app_server_unavailable",
                    f"codex app-server did not start: {exc}",
                    retryable=True,
                ) from None
            self._proc = proc
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
                    self.cfg.request_timeout,
                )
                await proc.notify("initialized")
            except (RpcError, RpcTimeout, ProcessGone) as exc:
                await proc.close()
                self._proc = None
                raise AgentError(
                    "app_server_timeout", f"initialize failed: {exc}", retryable=True
                ) from None
            await self._probe(proc)
            return proc

    async def _probe(self, proc: RpcProcess) -> None:
        """Best-effort capability probes; a failure is a recorded downgrade, never fatal."""
        try:
            await proc.request(
                "experimentalFeature/enablement/set", {"enablement": {"goals": True}}, 10
            )
        except (RpcError, RpcTimeout) as exc:
            self._downgrade("experimentalFeature/enablement/set", str(exc))
        try:
            modes = await proc.request("collaborationMode/list", {}, 10)
            names = {
                str(m.get("mode") or m.get("name"))
                for m in modes.get("data", [])
                if isinstance(m, dict)
            }
            self._collaboration = "default" in names
            if not self._collaboration:
                self._downgrade("collaborationMode/list", f"no default mode in {sorted(names)}")
        except (RpcError, RpcTimeout) as exc:
            self._collaboration = False
            self._downgrade("collaborationMode/list", str(exc))

    def _downgrade(self, what: str, why: str) -> None:
        if what in self._downgraded:
            return
        self._downgraded.add(what)
        self._notices.append(
            Notice(0, "capability_downgrade", {"capability": what, "reason": why[:500]})
        )

    async def _restarted(self) -> None:
        """The app-server died: every turn in flight ends interrupted, threads reload."""
        for turn in list(self._turns.values()):
            turn.queue.put_nowait(
                TurnCompleted(
                    turn.next_seq(),
                    TurnStatus.INTERRUPTED,
                    error_code="interrupted_by_restart",
                    error="codex app-server exited",
                )
            )
        self._loaded.clear()
        for fut in self._mcp.values():
            if not fut.done():
                fut.set_result("failed")
        self._mcp.clear()
        if self._proc is not None:
            await self._proc.close()
        self._proc = None

    async def _watch(self, proc: RpcProcess) -> None:
        await proc.closed.wait()
        if self._proc is proc:
            async with self._lock:
                if self._proc is proc:
                    log.warning("codex.exited", returncode=proc.proc.returncode)
                    await self._restarted()

    async def _call(self, method: str, params: Json, timeout: float | None = None) -> Json:
        proc = await self._server()
        try:
            return await proc.request(method, params, timeout or self.cfg.request_timeout)
        except RpcTimeout as exc:
            # A hung app-server is ended whole and restarted on the next call.
            async with self._lock:
                if self._proc is proc:
                    await self._restarted()
            raise AgentError("app_server_timeout", str(exc), retryable=True) from None
        except ProcessGone as exc:
            raise AgentError("app_server_exited", str(exc), retryable=True) from None

    # -- sessions -------------------------------------------------------------------

    async def comment_tool(self) -> CommentTool:
        if self._tool is None:
            self._tool = await preflight(
                self.cfg.mcp_argv,
                mcp_env(self.cfg.gitea_url, self.cfg.gitea_token),
                timeout=self.cfg.mcp_ready_timeout,
                stderr_path=self.cfg.data_dir / "logs" / "gitea-mcp-preflight.log",
            )
        return self._tool

    def _thread_params(self, spec: SessionSpec) -> Json:
        params: Json = {
            "cwd": spec.cwd,
            "approvalPolicy": "never",
            "sandbox": "read-only" if spec.read_only else "danger-full-access",
            "developerInstructions": spec.developer_instructions,
        }
        if spec.read_only:
            # A draft thread gets no Gitea MCP server at all: MCP servers are set per
            # thread (turn/start cannot remove one), and the server's env holds the
            # bot token, which a read-only agent must not be able to use.
            return params
        params["config"] = {
            "mcp_servers": {
                "gitea": {
                    "command": resolve_command(self.cfg.mcp_argv),
                    "args": self.cfg.mcp_argv[1:],
                    "env": mcp_env(self.cfg.gitea_url, self.cfg.gitea_token),
                }
            }
        }
        return params

    async def ensure_session(self, spec: SessionSpec) -> str:
        if not spec.read_only:
            await self.comment_tool()
        proc = await self._server()
        asyncio.get_running_loop().create_task(self._watch(proc))
        if spec.thread_id and spec.thread_id in self._loaded:
            return spec.thread_id
        params = self._thread_params(spec)
        thread_id = None
        if spec.thread_id and not spec.read_only:
            self._mcp[spec.thread_id] = asyncio.get_running_loop().create_future()
            try:
                result = await self._call("thread/resume", {"threadId": spec.thread_id, **params})
                thread_id = str(result["thread"]["id"])
            except AgentError:
                raise
            except RpcError as exc:
                if exc.code != RESUME_UNKNOWN:
                    raise AgentError("thread_resume_failed", str(exc), retryable=True) from None
                self._notices.append(
                    Notice(
                        0,
                        "session.resume_failed",
                        {"threadId": spec.thread_id, "error": exc.rpc_message[:500]},
                    )
                )
                self._mcp.pop(spec.thread_id, None)
        if thread_id is None:
            try:
                result = await self._call("thread/start", params)
            except RpcError as exc:
                raise AgentError("thread_start_failed", str(exc), retryable=True) from None
            thread_id = str(result["thread"]["id"])
        if not spec.read_only:
            await self._mcp_ready(thread_id)
        self._loaded.add(thread_id)
        self._notices.append(Notice(0, "session.thread_params", _audit_params(params)))
        return thread_id

    async def _mcp_ready(self, thread_id: str) -> None:
        """Codex does not wait for a thread's MCP servers before calling the model."""
        fut = self._mcp.setdefault(thread_id, asyncio.get_running_loop().create_future())
        try:
            async with asyncio.timeout(self.cfg.mcp_ready_timeout):
                status = await fut
        except TimeoutError:
            raise AgentError(
                "mcp_initialize_timeout",
                "the thread's Gitea MCP server did not become ready",
                retryable=False,
            ) from None
        if status != "ready":
            raise AgentError(
                "mcp_start_failed", f"the thread's Gitea MCP server is {status}", retryable=False
            )

    # -- turns ----------------------------------------------------------------------

    async def start_turn(self, thread_id: str, turn: TurnSpec) -> TurnHandle:
        policy = sandbox_policy(turn.read_only)
        params: Json = {
            "threadId": thread_id,
            "input": [{"type": "text", "text": turn.prompt, "text_elements": []}],
            "sandboxPolicy": policy,
        }
        if self._collaboration and self.cfg.model:
            settings: Json = {"model": self.cfg.model}
            if self.cfg.reasoning_effort:
                settings["reasoning_effort"] = self.cfg.reasoning_effort
            params["collaborationMode"] = {"mode": "default", "settings": settings}
        elif "collaborationMode" not in self._downgraded:
            self._downgrade(
                "collaborationMode",
                "not supported by the runtime"
                if not self._collaboration
                else "FORGEFLOW_MODEL is not set",
            )
        try:
            result = await self._call("turn/start", params)
        except RpcError as exc:
            if "collaborationMode" not in params:
                raise AgentError("turn_start_failed", str(exc), retryable=True) from None
            self._downgrade("collaborationMode", str(exc))
            self._collaboration = False
            params.pop("collaborationMode")
            try:
                result = await self._call("turn/start", params)
            except RpcError as again:
                raise AgentError("turn_start_failed", str(again), retryable=True) from None
        handle = TurnHandle(thread_id, str(result["turn"]["id"]))
        state = self._turns.setdefault(handle.turn_id, _Turn(handle))
        for notice in self._notices:
            state.queue.put_nowait(Notice(state.next_seq(), notice.action, notice.metadata))
        self._notices.clear()
        state.queue.put_nowait(
            Notice(state.next_seq(), "turn.sandbox", {"sandboxPolicy": policy, "kind": turn.kind})
        )
        return handle

    async def events(self, handle: TurnHandle) -> Any:
        state = self._turns.setdefault(handle.turn_id, _Turn(handle))
        try:
            while True:
                event = await state.queue.get()
                yield event
                if isinstance(event, TurnCompleted):
                    return
        finally:
            self._turns.pop(handle.turn_id, None)

    async def interrupt(self, handle: TurnHandle) -> None:
        with contextlib.suppress(RpcError):
            await self._call(
                "turn/interrupt", {"threadId": handle.thread_id, "turnId": handle.turn_id}, 10
            )

    async def aclose(self) -> None:
        if self._proc is not None:
            await self._proc.close()
            self._proc = None

    # -- messages from the app-server --------------------------------------------------

    async def _on_message(self, msg: Json) -> None:
        method = str(msg.get("method"))
        params = msg.get("params") or {}
        if "id" in msg:
            await self._on_request(msg["id"], method, params)
            return
        if method == "mcpServer/startupStatus/updated" and params.get("name") == "gitea":
            status = str(params.get("status"))
            if status in ("ready", "failed", "cancelled"):
                fut = self._mcp.setdefault(
                    str(params.get("threadId")), asyncio.get_running_loop().create_future()
                )
                if not fut.done():
                    fut.set_result(status)
            return
        turn = self._turns.get(str(params.get("turnId") or (params.get("turn") or {}).get("id")))
        if turn is None:
            return
        if method == "item/completed":
            self._item(turn, params.get("item") or {})
        elif method == "thread/tokenUsage/updated":
            last = (params.get("tokenUsage") or {}).get("last") or {}
            turn.input_tokens += int(last.get("inputTokens") or 0)
            turn.output_tokens += int(last.get("outputTokens") or 0)
            turn.queue.put_nowait(
                TokenUsage(turn.next_seq(), turn.input_tokens, turn.output_tokens)
            )
        elif method == "error":
            turn.error = str((params.get("error") or {}).get("message") or params)[:2000]
        elif method == "turn/completed":
            body = params.get("turn") or {}
            status = str(body.get("status"))
            error = body.get("error") or {}
            mapped = {"completed": TurnStatus.COMPLETED, "interrupted": TurnStatus.INTERRUPTED}.get(
                status, TurnStatus.FAILED
            )
            turn.queue.put_nowait(
                TurnCompleted(
                    turn.next_seq(),
                    mapped,
                    error_code=None
                    if mapped is TurnStatus.COMPLETED
                    else ("interrupted" if mapped is TurnStatus.INTERRUPTED else "model_error"),
                    error=str(error.get("message") or turn.error or "") or None,
                    last_message=turn.last_message,
                )
            )

    def _item(self, turn: _Turn, item: Json) -> None:
        kind = item.get("type")
        if kind == "agentMessage":
            turn.last_message = str(item.get("text") or "") or turn.last_message
        elif kind == "mcpToolCall":
            comment_id = None
            result = item.get("result") or {}
            for part in result.get("content") or []:
                with contextlib.suppress(ValueError, TypeError, AttributeError):
                    comment_id = int(json.loads(part.get("text", ""))["id"])
                    break
            error = item.get("error") or {}
            turn.queue.put_nowait(
                ToolCall(
                    turn.next_seq(),
                    f"{item.get('server')}.{item.get('tool')}",
                    redact(item.get("arguments") or {}),
                    ok=item.get("status") == "completed",
                    comment_id=comment_id,
                    error=str(error.get("message")) if error else None,
                )
            )

    async def _on_request(self, request_id: Any, method: str, params: Json) -> None:
        proc = self._proc
        if proc is None:
            return
        turn = self._turns.get(str(params.get("turnId")))
        if method == "item/tool/requestUserInput":
            questions = params.get("questions") or []
            text = "\n".join(str(q.get("question") or "") for q in questions if isinstance(q, dict))
            if turn is not None:
                turn.queue.put_nowait(NeedsUser(turn.next_seq(), text or "(question)"))
            answers = {
                str(q.get("id")): {"answers": ["The user will answer in a later comment."]}
                for q in questions
                if isinstance(q, dict)
            }
            await proc.respond(request_id, {"answers": answers})
            return
        if method == "mcpServer/elicitation/request":
            action = "accept" if self.cfg.elicitation_policy == "accept" else "decline"
            if turn is not None:
                turn.queue.put_nowait(
                    Notice(
                        turn.next_seq(),
                        "agent.elicitation",
                        {
                            "server": params.get("serverName"),
                            "message": str(params.get("message"))[:500],
                            "answer": action,
                        },
                    )
                )
            await proc.respond(request_id, {"action": action, "content": None})
            return
        # yolo should never ask; anything that does is declined and audited.
        if turn is not None:
            turn.queue.put_nowait(
                Notice(turn.next_seq(), "agent.approval_declined", {"method": method})
            )
        await proc.respond(request_id, {"decision": "decline"})
