"""The Gitea client's connection slots, against a real socket that never answers."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import pytest

from forgeflow.gitea.client import GiteaClient, GiteaUnavailable

SLOTS = 16  # forgeflow.gitea.client._CONNECTIONS: what a burst of tasks may hold at once


class SilentServer:
    """Accepts TCP connections, reads nothing and answers nothing: every request on it
    waits until the client's timeout. Counts the connections it was given."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._accepted: list[socket.socket] = []
        self._lock = threading.Lock()
        self._grew = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._accepted.append(conn)
                self._grew.notify_all()

    def wait_for(self, count: int, timeout: float = 10.0) -> bool:
        with self._lock:
            return self._grew.wait_for(lambda: len(self._accepted) >= count, timeout)

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._accepted)

    def close(self) -> None:
        self._sock.close()
        with self._lock:
            for conn in self._accepted:
                conn.close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


def _failures(results: list[object]) -> list[str]:
    assert all(isinstance(r, GiteaUnavailable) for r in results), results
    return [str(r) for r in results]


def test_requests_beyond_the_slots_wait_and_that_wait_counts_against_the_timeout(
    silent: SilentServer,
) -> None:
    async def burst() -> list[object]:
        client = GiteaClient(silent.url, "secret-token", timeout=0.5)
        try:
            calls = [client.get_issue("acme", "widget", n) for n in range(1, SLOTS + 5)]
            return list(await asyncio.gather(*calls, return_exceptions=True))
        finally:
            await client.aclose()

    messages = _failures(asyncio.run(burst()))
    # Sixteen requests got a connection and timed out reading; the other four never
    # reached the pool: they gave up waiting for a slot within the same timeout.
    assert sum("ReadTimeout" in m for m in messages) == SLOTS
    assert sum("no free connection in time" in m for m in messages) == 4
    assert silent.connections == SLOTS
    assert not any("secret-token" in m for m in messages)


def test_a_permission_lookup_does_not_wait_behind_the_tasks_requests(
    silent: SilentServer,
) -> None:
    async def lookup_while_busy() -> tuple[int, BaseException | None]:
        client = GiteaClient(silent.url, "t", timeout=1.0)
        busy = [
            asyncio.create_task(client.get_issue("acme", "widget", n)) for n in range(SLOTS + 4)
        ]
        try:
            assert await asyncio.to_thread(silent.wait_for, SLOTS)
            try:
                await client.repo_permission("acme", "widget", "alice")
                error: BaseException | None = None
            except GiteaUnavailable as exc:
                error = exc
            return silent.connections, error
        finally:
            await asyncio.gather(*busy, return_exceptions=True)
            await client.aclose()

    connections, error = asyncio.run(lookup_while_busy())
    # Its own connection (the 17th), and it failed on the silent answer, not in a queue.
    assert connections == SLOTS + 1
    assert error is not None and "ReadTimeout" in str(error)
