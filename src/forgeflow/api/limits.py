"""Bounds before work: the admin token of the control API is checked before a byte of
the body is read, then the body is read against its route's limit (``Content-Length``
first, then counted as it streams) within a deadline, and a JSON body is refused past
its nesting limit, all before the application sees the request.

A pure ASGI middleware, hand-written because neither uvicorn nor Starlette has a body
limit or reads the body only after authentication (FastAPI parses a JSON body before it
runs a route's dependencies, so ``require_admin`` alone came too late). The body is
held whole only once it is known to fit, at most the route's limit.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from forgeflow.config import Settings
from forgeflow.guard import TokenGuard

# Routes that need ``Authorization: Bearer <admin token>`` (control and pipeline API).
AUTHENTICATED = ("/api/gitea-workflow/", "/api/pipelines/")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")


@dataclass(frozen=True, slots=True)
class BodyLimits:
    webhook: int
    trigger: int
    api: int
    form: int
    json_depth: int
    body_timeout: float
    header_bytes: int
    inflight: int

    @classmethod
    def of(cls, s: Settings) -> BodyLimits:
        return cls(
            webhook=s.webhook_max_body_bytes,
            trigger=s.trigger_max_body_bytes,
            api=s.api_max_body_bytes,
            form=s.form_max_body_bytes,
            json_depth=s.json_max_depth,
            body_timeout=s.http_body_timeout_seconds,
            header_bytes=s.http_max_header_bytes,
            inflight=s.http_max_inflight_body_bytes,
        )

    def for_path(self, path: str) -> int:
        if path == "/api/gitea/webhook":
            return self.webhook
        if path.startswith("/webhooks/"):
            return self.trigger
        if path.startswith("/api/"):
            return self.api
        return self.form  # the admin pages' forms, and anything else


class Refused(Exception):
    def __init__(self, status: int, code: str, message: str, retry_after: float = 0) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.retry_after = status, code, message, retry_after


def json_depth(body: bytes) -> int:
    """The deepest nesting of ``[`` and ``{`` outside strings (json has no depth limit
    and a deep document costs recursion and memory before it fails)."""
    depth = deepest = 0
    for m in _BRACKET.finditer(_STRING.sub(b'""', body)):
        if m.group() in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


class BoundsMiddleware:
    def __init__(self, app: ASGIApp, limits: BodyLimits, guard: Callable[[], TokenGuard]) -> None:
        self.app = app
        self.limits = limits
        self.guard = guard
        # Bytes of bodies being read now, over all requests: each fits its route, but
        # hundreds of connections at the webhook's limit at once would not fit a host.
        self.inflight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            # h11 bounds a head that arrives in pieces; one that came whole is counted here.
            if sum(len(k) + len(v) + 4 for k, v in scope["headers"]) > self.limits.header_bytes:
                raise Refused(431, "headers_too_large", "the request headers are too large")
            if scope["path"].startswith(AUTHENTICATED):
                await self._authenticate(scope)
            body = await self._read(scope, receive)
        except Refused as exc:
            await _answer(send, exc)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _authenticate(self, scope: Scope) -> None:
        guard = self.guard()
        address = _client(scope)
        action = "api.auth.reject"
        wait = await guard.refuse_throttled(address, action)
        if wait is not None:
            raise Refused(429, "too_many_attempts", "too many wrong tokens; wait", wait)
        raw = _header(scope, b"authorization") or b""
        scheme, _, token = raw.partition(b" ")
        given = token.strip() if scheme.lower() == b"bearer" else b""
        if not await guard.check(given, address, action):
            message = "a valid 'Authorization: Bearer <token>' is required"
            raise Refused(401, "unauthorized", message)

    async def _read(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.limits.for_path(scope["path"])
        declared = _header(scope, b"content-length")
        if declared is not None:
            if not declared.isdigit():
                raise Refused(400, "invalid_request", "Content-Length is not a number")
            if int(declared) > limit:
                raise Refused(413, "payload_too_large", f"the body is limited to {limit} bytes")
        try:
            async with asyncio.timeout(self.limits.body_timeout):
                body = await self._collect(receive, limit)
        except TimeoutError:
            raise Refused(408, "request_timeout", "the body did not arrive in time") from None
        ctype = (_header(scope, b"content-type") or b"").lower()
        if body and b"json" in ctype and json_depth(body) > self.limits.json_depth:
            message = f"JSON is nested deeper than {self.limits.json_depth} levels"
            raise Refused(400, "invalid_payload", message)
        return body

    async def _collect(self, receive: Receive, limit: int) -> bytes:
        chunks: list[bytes] = []
        size = 0
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise Refused(400, "invalid_request", "the client went away")
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    why = f"the body is limited to {limit} bytes"
                    raise Refused(413, "payload_too_large", why)
                if self.inflight + len(chunk) > self.limits.inflight:
                    why = "too many large bodies are being received; retry"
                    raise Refused(503, "server_busy", why, retry_after=1)
                self.inflight += len(chunk)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
        finally:
            self.inflight -= sum(len(c) for c in chunks)


def _replay(body: bytes, receive: Receive) -> Callable[[], Awaitable[Message]]:
    """The body as one message, then the connection's own messages (a disconnect)."""
    sent = False

    async def _receive() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return _receive


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


async def _answer(send: Send, exc: Refused) -> None:
    body = json.dumps({"error": exc.code, "message": exc.message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if exc.retry_after:
        headers.append((b"retry-after", b"%d" % max(1, round(exc.retry_after))))
    if exc.status in (408, 413, 503):
        headers.append((b"connection", b"close"))  # the rest of the body is not read
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
