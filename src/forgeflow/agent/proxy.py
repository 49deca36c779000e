"""The egress proxy of one repository's jail (``FORGEFLOW_AGENT_NETWORK=proxy``).

The jail has no network of its own but loopback; its ``HTTP(S)_PROXY`` is a port there
that ``forward.py`` relays to this proxy's Unix socket, one socket per jail, so every
connection is known to come from that jail's repository. The proxy serves plain HTTP
requests in absolute form and ``CONNECT`` tunnels (TLS stays end-to-end), checks the
host and port against the policy (``domain/egress.py``), resolves the name itself,
checks every resolved address and connects to exactly the address it checked: a second
lookup cannot be steered elsewhere (DNS rebinding). A refusal is a 403 naming why, and
is reported to ``on_blocked``.

Hand-written (a small asyncio server): the policy must choose the address the proxy
connects to, and proxy.py/pproxy expose no documented hook for that.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import structlog

from forgeflow.domain.egress import EgressPolicy, IPAddress, normalise_host
from forgeflow.domain.json import JsonObject

log = structlog.get_logger("forgeflow.proxy")

MAX_HEAD = 16 * 1024  # a request line and its headers
HEAD_TIMEOUT = 30.0
CONNECT_TIMEOUT = 10.0
IDLE_TIMEOUT = 300.0  # a tunnel with no byte either way this long is closed
MAX_TUNNELS = 32  # concurrent connections of one jail

Blocked = Callable[[str, int, str], None]  # host, port, reason


class _Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int
    head: bytes  # what to send upstream first (the rewritten request; empty for CONNECT)


def parse_head(head: bytes) -> Target:
    """The target of one proxy request; the request rewritten to origin form."""
    try:
        text = head.decode("latin-1")
        line, _, rest = text.partition("\r\n")
        method, uri, version = line.split(" ")
    except ValueError:
        raise _Refused(400, "malformed request line") from None
    if not version.startswith("HTTP/1."):
        raise _Refused(400, "not HTTP/1.x")
    if method == "CONNECT":
        host, sep, port_text = uri.rpartition(":")
        if not sep or not port_text.isdigit():
            raise _Refused(400, "CONNECT needs host:port")
        return Target(normalise_host(host), int(port_text), b"")
    url = urlsplit(uri)
    if url.scheme != "http" or not url.hostname:
        raise _Refused(400, "only http:// URLs in absolute form (use CONNECT for TLS)")
    try:
        port = url.port or 80
    except ValueError:
        raise _Refused(400, "bad port") from None
    path = url.path or "/"
    if url.query:
        path += "?" + url.query
    # Proxy headers are ours; one request per upstream connection keeps it simple; the
    # Host is the checked one (no other site of a shared server by its Host header).
    kept = [
        h
        for h in rest.split("\r\n")
        if h and not h.lower().startswith(("proxy-", "connection:", "keep-alive:", "host:"))
    ]
    host = normalise_host(url.hostname)
    authority = f"[{host}]" if ":" in host else host
    authority += f":{port}" if port != 80 else ""
    lines = [f"{method} {path} {version}", f"Host: {authority}", *kept, "Connection: close"]
    return Target(host, port, "\r\n".join([*lines, "", ""]).encode("latin-1"))


class EgressProxy:
    def __init__(
        self,
        policy: EgressPolicy,
        unix_socket: Path,
        on_blocked: Blocked,
        *,
        max_tunnels: int = MAX_TUNNELS,
    ) -> None:
        self.policy = policy
        self.unix_socket = unix_socket
        self.on_blocked = on_blocked
        self._slots = asyncio.Semaphore(max_tunnels)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.unix_socket.parent.mkdir(parents=True, exist_ok=True)
        self.unix_socket.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(
            self._client, str(self.unix_socket), limit=MAX_HEAD
        )

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        self.unix_socket.unlink(missing_ok=True)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if self._slots.locked():
                # The head read first: closing on unread bytes would reset the answer.
                with contextlib.suppress(TimeoutError, asyncio.LimitOverrunError):
                    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
                await _answer(writer, 503, "too many connections from this jail")
                return
            async with self._slots:
                await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        except (TimeoutError, asyncio.LimitOverrunError, asyncio.IncompleteReadError):
            await _answer(writer, 400, "request head missing or over 16 KiB")
            return
        target: Target | None = None
        try:
            target = parse_head(head)
            address = await self._check(target)
            up_reader, up_writer = await self._open(address, target.port)
        except _Refused as refused:
            if target is not None and refused.status == 403:
                self.on_blocked(target.host, target.port, refused.reason)
            await _answer(writer, refused.status, refused.reason)
            return
        if target.head:
            up_writer.write(target.head)
        else:
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        seen = [asyncio.get_running_loop().time()]
        try:
            await asyncio.gather(_pipe(reader, up_writer, seen), _pipe(up_reader, writer, seen))
        finally:
            up_writer.close()

    async def _check(self, target: Target) -> IPAddress:
        decision = self.policy.check_name(target.host, target.port)
        if not decision.allowed:
            raise _Refused(403, decision.reason)
        addresses = await self._resolve(target.host, target.port)
        decision = self.policy.check_addresses(target.host, addresses)
        if not decision.allowed or decision.address is None:
            raise _Refused(403, decision.reason)
        return decision.address

    async def _resolve(self, host: str, port: int) -> list[IPAddress]:
        pinned = self.policy.pins.get(host)
        if pinned is not None:
            return [pinned]
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError):
            return []
        # getaddrinfo reads every IP literal form (127.1, 2130706433, 0x7f000001).
        found = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
        return list(dict.fromkeys(found))

    async def _open(
        self, address: IPAddress, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(str(address), port), CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError) as exc:
            raise _Refused(502, f"could not connect: {type(exc).__name__}") from None


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: list[float]
) -> None:
    """Copy one direction; ``seen[0]`` is the last byte either way (idle = both)."""
    loop = asyncio.get_running_loop()
    try:
        while True:
            try:
                data = await asyncio.wait_for(reader.read(65536), IDLE_TIMEOUT)
            except TimeoutError:
                if loop.time() - seen[0] >= IDLE_TIMEOUT:
                    break
                continue
            if not data:
                # Half-close: the other direction may still carry the answer.
                if writer.can_write_eof():
                    writer.write_eof()
                return
            seen[0] = loop.time()
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    writer.close()


async def _answer(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    phrase = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway", 503: "Busy"}[status]
    body = f"forgeflow egress proxy: {reason}\n".encode()
    writer.write(
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    with contextlib.suppress(ConnectionError):
        await writer.drain()


class Blocks:
    """One turn's refused requests, counted by (host, port); bounded."""

    LIMIT = 50  # distinct targets kept; the rest only counted

    def __init__(self) -> None:
        self.counts: dict[tuple[str, int], int] = {}
        self.reasons: dict[tuple[str, int], str] = {}
        self.dropped = 0

    def add(self, host: str, port: int, reason: str) -> None:
        # The host is the agent's text and ends up in a comment: host characters only.
        clean = "".join(c if c.isascii() and (c.isalnum() or c in ".-_:") else "?" for c in host)
        key = (clean[:253], port)
        if key not in self.counts and len(self.counts) >= self.LIMIT:
            self.dropped += 1
            return
        self.counts[key] = self.counts.get(key, 0) + 1
        self.reasons.setdefault(key, reason[:200])

    def metadata(self) -> JsonObject:
        return {
            "requests": [
                {"host": h, "port": p, "count": n, "reason": self.reasons[(h, p)]}
                for (h, p), n in self.counts.items()
            ],
            "total": sum(self.counts.values()) + self.dropped,
        }
