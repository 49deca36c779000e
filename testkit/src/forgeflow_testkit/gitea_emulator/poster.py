"""The emulator's webhook sender: keep-alive POSTs over the standard library's http.client.

Not httpx: a delivery through httpx's sync client cost ≈ 0.5 ms of CPU against ≈ 0.12 ms
here, and in the benchmarks (bench/latency.py, bench/ingest.py) the emulator runs in the
benchmark's own process, sharing the machine's cores with the forgeflow it measures: CPU
it spends is taken from the figures.
"""

from __future__ import annotations

import http.client
import select
import threading
from urllib.parse import urlsplit

_RESET = (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected)


class _ClosedWhileIdle(ConnectionResetError):
    """A kept connection failed as one the server had closed while it was idle."""


class Poster:
    """One keep-alive connection per thread and origin; a connection the server has
    closed meanwhile (readable while idle: EOF) is replaced before it is used."""

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def post(self, url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
        """(status, response text); raises OSError or http.client.HTTPException.

        A kept connection the server closed while this request went out is tried once
        more on a new one, as Go's transport does for a server-closed idle connection
        (net/http transport.go, shouldRetryRequest). Go retries only when nothing was read;
        a reset cannot tell, and a repeat under the same delivery id is one delivery to
        forgeflow (it deduplicates by that id)."""
        try:
            return self._post_once(url, body, headers)
        except _ClosedWhileIdle:
            return self._post_once(url, body, headers)

    def _post_once(self, url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn = self._connection(parts.scheme, parts.netloc)
        reused = conn.sock is not None
        try:
            conn.request("POST", target, body=body, headers=headers)
            response = conn.getresponse()
            text = response.read().decode("utf-8", errors="replace")
        except _RESET as exc:
            self._drop(parts.scheme, parts.netloc)
            if reused:
                raise _ClosedWhileIdle(str(exc)) from exc
            raise
        except BaseException:
            self._drop(parts.scheme, parts.netloc)
            raise
        if response.will_close:
            self._drop(parts.scheme, parts.netloc)
        return response.status, text

    def _connection(self, scheme: str, netloc: str) -> http.client.HTTPConnection:
        conns: dict[tuple[str, str], http.client.HTTPConnection] = self._local.__dict__.setdefault(
            "conns", {}
        )
        conn = conns.get((scheme, netloc))
        if conn is not None and conn.sock is not None and _closed_by_peer(conn):
            self._drop(scheme, netloc)
            conn = None
        if conn is None:
            cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
            conn = cls(netloc, timeout=self._timeout)
            conns[(scheme, netloc)] = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def _drop(self, scheme: str, netloc: str) -> None:
        conn = self._local.__dict__.get("conns", {}).pop((scheme, netloc), None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()


def _closed_by_peer(conn: http.client.HTTPConnection) -> bool:
    readable, _, _ = select.select([conn.sock], [], [], 0)
    return bool(readable)
