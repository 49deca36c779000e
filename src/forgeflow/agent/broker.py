"""The brokers a jail reaches forgeflow through: one small HTTP server per forgeflow
process, on loopback, outside every jail.

- ``/model/...``: the Responses-API pass-through. The jailed Codex sends its model
  requests here with a repository's capability; forgeflow swaps it for the operator's
  key, streams the answer back as it arrives (never buffered whole) and counts the
  tokens of each ``response.completed``.
- ``/mcp``: the Gitea tools, an MCP server built with the ``mcp`` SDK (streamable HTTP,
  stateless, JSON answers; ``gitea_tools/``), bound to one session by its capability:
  the broker resolves it to a :class:`Grant` and passes that in the ASGI scope.

A capability is a random bearer token that means something only to this process and
only while its grant lives: grants are revoked when a repository's app-server stops.
aiohttp's server: it is already forgeflow's HTTP client, and it streams both ways. The
SDK's transport is an ASGI app; ``_asgi`` hands it one aiohttp request (hand-written:
the one aiohttp-to-ASGI adapter on PyPI imports aiohttp's private names, and the SDK's
own hosting is a second HTTP server, uvicorn, that would take over forgeflow's signal
handling while serving in the same process).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import secrets
import socket
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import aiohttp
import structlog
from aiohttp import web
from starlette.types import Message, Receive, Scope, Send

from forgeflow.agent.provider import ModelProvider
from forgeflow.redaction import forget_secrets, register_secrets

log = structlog.get_logger("forgeflow.broker")

GRANT_KEY = "forgeflow.grant"  # the caller's grant in the ASGI scope's "state"


class McpApp(Protocol):
    """The Gitea tools' MCP server: an ASGI app with a lifetime."""

    def running(self) -> AbstractAsyncContextManager[None]: ...

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None: ...


# Request headers that describe the hop or the caller's credentials; everything else
# Codex sends (content type, its session and version headers) goes through as is.
_HOP_HEADERS = frozenset(
    {
        "authorization",
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "upgrade",
        "proxy-authorization",
        "accept-encoding",
    }
)
_COMPLETED = b'"response.completed"'


@dataclass
class Usage:
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(eq=False)
class Grant:
    """What one capability allows: a repository's model access, or (with a session) its
    Gitea tools."""

    server: str  # the repository's key, e.g. "default:acme/widget"
    owner: str
    repo: str
    session_key: str | None = None
    usage: Usage = field(default_factory=Usage)
    # A review task's thread: the read-only tools and submit_review, nothing else.
    review: bool = False


class Broker:
    def __init__(
        self,
        provider: ModelProvider,
        mcp: McpApp,
        *,
        host: str = "127.0.0.1",
        unix_socket: Path | None = None,
    ) -> None:
        self.provider = provider
        self._mcp = mcp
        self._host = host
        self.unix_socket = unix_socket
        self._grants: dict[str, Grant] = {}
        # Jails without the host's network reach the brokers through a Unix socket of
        # their own (bound into that jail alone): a capability works only on its jail's
        # socket, so one read or leaked in another jail is worth nothing there.
        self._jail_sockets: dict[str, str] = {}
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None
        self._mcp_task: asyncio.Task[None] | None = None
        self._mcp_stop = asyncio.Event()
        self.port = 0

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        if self._runner is not None:
            return
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/model/{tail:.*}", self._model)
        app.router.add_post("/mcp", self._mcp_post)
        app.router.add_route("*", "/mcp", self._mcp_other)
        await self._start_mcp()
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        # Our own socket, so the port the kernel chose is known without asking aiohttp.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, 0))
        self.port = int(sock.getsockname()[1])
        await web.SockSite(runner, sock).start()
        self._runner = runner
        # No proxy from the environment: the upstream is the operator's provider.
        self._client = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30)
        )

    async def _start_mcp(self) -> None:
        # The SDK's session manager runs in a task group that must be entered and left in
        # one task: this one, for the broker's lifetime.
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def run() -> None:
            try:
                async with self._mcp.running():
                    started.set_result(None)
                    await self._mcp_stop.wait()
            except Exception as exc:
                if not started.done():
                    started.set_exception(exc)
                raise

        self._mcp_stop = asyncio.Event()
        self._mcp_task = asyncio.create_task(run(), name="broker.mcp")
        await started

    async def aclose(self) -> None:
        if self._mcp_task is not None:
            self._mcp_stop.set()
            with contextlib.suppress(Exception):
                await self._mcp_task
            self._mcp_task = None
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def model_url(self) -> str:
        return f"http://{self._host}:{self.port}/model"

    @property
    def mcp_url(self) -> str:
        return f"http://{self._host}:{self.port}/mcp"

    async def jail_socket(self, server: str) -> Path | None:
        """The Unix socket of one repository's jails (forward.py in the jail relays to
        it); None when jails reach the brokers on the host's loopback instead."""
        if self.unix_socket is None or self._runner is None:
            return None
        known = self._jail_sockets.get(server)
        if known is not None:
            return Path(known)
        digest = hashlib.sha256(server.encode()).hexdigest()[:16]
        path = self.unix_socket.with_name(f"broker-{digest}.sock")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        await web.UnixSite(self._runner, str(path)).start()
        self._jail_sockets[server] = str(path)
        return path

    # -- grants ----------------------------------------------------------------------

    def grant(self, grant: Grant) -> str:
        token = secrets.token_urlsafe(32)
        self._grants[token] = grant
        # The agent can read its own capability (it sits in the jail's Codex config):
        # whatever it echoes is masked in logs, audit rows and transcripts.
        register_secrets([token])
        return token

    def revoke(self, server: str) -> None:
        """End every capability of one repository's app-server."""
        revoked = [t for t, g in self._grants.items() if g.server == server]
        for token in revoked:
            del self._grants[token]
        forget_secrets(revoked)

    def _granted(self, request: web.Request, *, session: bool) -> Grant:
        header = request.headers.get("Authorization", "")
        token = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
        grant = self._grants.get(token) if token else None
        if grant is not None and not self._from_its_jail(request, grant):
            grant = None
        if grant is None or (grant.session_key is not None) != session:
            raise web.HTTPUnauthorized(
                text=json.dumps({"error": {"message": "unknown or revoked capability"}}),
                content_type="application/json",
            )
        return grant

    def _from_its_jail(self, request: web.Request, grant: Grant) -> bool:
        """A grant whose jail has a socket of its own is honoured on that socket only."""
        own = self._jail_sockets.get(grant.server)
        if own is None:
            return True
        transport = request.transport
        return transport is not None and transport.get_extra_info("sockname") == own

    # -- the model pass-through --------------------------------------------------------

    async def _model(self, request: web.Request) -> web.StreamResponse:
        grant = self._granted(request, session=False)
        assert self._client is not None
        url = f"{self.provider.base_url}/{request.match_info['tail']}"
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        if self.provider.api_key:
            headers["Authorization"] = f"Bearer {self.provider.api_key}"
        body = await request.read()
        grant.usage.requests += 1
        try:
            upstream = await self._client.request(
                request.method,
                url,
                params=request.query,
                data=body or None,
                headers=headers,
                auto_decompress=True,
            )
        except aiohttp.ClientError as exc:
            log.warning("broker.model_unreachable", error=type(exc).__name__)
            raise web.HTTPBadGateway(text="the model provider cannot be reached") from None
        async with upstream:
            response = web.StreamResponse(status=upstream.status)
            for key in ("Content-Type", "Cache-Control", "x-request-id", "openai-model"):
                if key in upstream.headers:
                    response.headers[key] = upstream.headers[key]
            await response.prepare(request)
            pending = b""
            try:
                async for chunk in upstream.content.iter_any():
                    pending = self._count(grant, pending + chunk)
                    await response.write(chunk)
                self._count(grant, pending + b"\n")
                await response.write_eof()
            except ConnectionResetError:
                # Codex may hang up as soon as it has read response.completed; what was
                # streamed was counted.
                log.debug("broker.client_gone", repo=grant.server)
            return response

    @staticmethod
    def _count(grant: Grant, data: bytes) -> bytes:
        """Count the usage of each complete ``response.completed`` event line; return
        the unfinished tail (the stream is read in arbitrary chunks)."""
        *lines, tail = data.split(b"\n")
        for line in lines:
            if not line.startswith(b"data:") or _COMPLETED not in line:
                continue
            try:
                usage = json.loads(line[5:]).get("response", {}).get("usage") or {}
            except (ValueError, AttributeError):
                continue
            grant.usage.input_tokens += int(usage.get("input_tokens") or 0)
            grant.usage.output_tokens += int(usage.get("output_tokens") or 0)
        # An event line is small; a tail this long is not one we count.
        return tail if len(tail) < 4 * 1024 * 1024 else b""

    # -- the Gitea tools (the SDK's streamable HTTP transport, stateless) ---------------

    async def _mcp_post(self, request: web.Request) -> web.StreamResponse:
        grant = self._granted(request, session=True)
        return await self._asgi(request, grant)

    async def _mcp_other(self, request: web.Request) -> web.Response:
        # Stateless: no server-initiated stream (GET) and no session to end (DELETE).
        self._granted(request, session=True)
        return web.Response(status=405, headers={"Allow": "POST"})

    async def _asgi(self, request: web.Request, grant: Grant) -> web.StreamResponse:
        """One request through the MCP server's ASGI app (ASGI 3.0 HTTP)."""
        body = await request.read()
        finished = asyncio.Event()
        response: web.StreamResponse | None = None
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": "http",
            "path": request.path,
            "raw_path": request.raw_path.split("?", 1)[0].encode(),
            "root_path": "",
            "query_string": request.query_string.encode(),
            "headers": [(k.lower(), v) for k, v in request.raw_headers],
            "client": None,
            "server": None,
            "state": {GRANT_KEY: grant},
        }
        sent_body = False

        async def receive() -> Message:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await finished.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            nonlocal response
            if message["type"] == "http.response.start":
                response = web.StreamResponse(status=int(message["status"]))
                for key, value in message.get("headers") or ():
                    response.headers.add(key.decode("latin-1"), value.decode("latin-1"))
                await response.prepare(request)
            elif message["type"] == "http.response.body" and response is not None:
                await response.write(message.get("body") or b"")
                if not message.get("more_body"):
                    await response.write_eof()

        try:
            await self._mcp(scope, receive, send)
        finally:
            finished.set()
        if response is None:
            raise web.HTTPInternalServerError(text="the MCP server gave no answer")
        return response
