"""The uvicorn server of ``forgeflow serve``, with the connection-level bounds.

Most bounds are uvicorn's documented settings: ``h11_max_incomplete_event_size`` (the
header block), ``timeout_keep_alive`` (idle keep-alive connections),
``limit_concurrency`` (a 503 past that many connections or requests) and
``timeout_graceful_shutdown``. uvicorn has no timeout for a connection that never
finishes its request head, nor a hard cap on open connections, and always answers an
oversized head with 400: :class:`BoundedH11Protocol` adds those three, as the smallest
subclass of uvicorn's h11 protocol (the ``http=`` setting takes a protocol class).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn import Config
from uvicorn.protocols.http.h11_impl import H11Protocol

from forgeflow.config import Settings


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus a deadline for each request head and a cap on open
    connections. Set up by :func:`server_config` through class attributes, since uvicorn
    builds one protocol object per connection from the class alone."""

    header_timeout: float = 10.0
    max_connections: int = 512
    max_header_bytes: int = 16 * 1024

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            # Past the cap a connection is closed at once: it costs a descriptor only
            # for as long as the accept takes.
            transport.close()
            return
        self._arm_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_head_deadline()  # the next request on this connection gets its own

    def _arm_head_deadline(self) -> None:
        waiting_for = self.cycle
        self.loop.call_later(self.header_timeout, self._head_deadline, waiting_for)

    def _head_deadline(self, waiting_for: Any) -> None:
        """Close the connection if no new request head arrived in time (an idle or a
        trickling client); a request that started meanwhile is left alone."""
        if self.cycle is waiting_for and not self.transport.is_closing():
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        # h11 refuses a head longer than its limit with the hint 431; uvicorn says 400.
        if len(self.conn.trailing_data[0]) <= self.max_header_bytes:
            super().send_400_response(msg)
            return
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]
        reason = b"Request Header Fields Too Large"
        for event in (
            h11.Response(status_code=431, headers=headers, reason=reason),
            h11.Data(data=b"request header fields too large"),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()


def server_config(app: Any, settings: Settings) -> Config:
    """The uvicorn settings of ``forgeflow serve`` (docs/security.md lists them)."""
    protocol = type(
        "ForgeflowH11Protocol",
        (BoundedH11Protocol,),
        {
            "header_timeout": settings.http_header_timeout_seconds,
            "max_connections": settings.http_max_connections,
            "max_header_bytes": settings.http_max_header_bytes,
        },
    )
    return Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        loop="none",
        http=protocol,
        h11_max_incomplete_event_size=settings.http_max_header_bytes,
        timeout_keep_alive=int(max(1, settings.http_keep_alive_seconds)),
        limit_concurrency=settings.http_max_connections,
        timeout_graceful_shutdown=int(settings.http_graceful_shutdown_seconds),
        server_header=False,
    )
