"""The Gitea client's connection limits, against a real socket that never answers."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
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


def test_requests_beyond_the_limit_wait_and_that_wait_counts_against_the_timeout(
    silent: SilentServer,
) -> None:
    async def burst() -> tuple[list[object], int, float]:
        client = GiteaClient(silent.url, "secret-token", timeout=1.0)
        started = time.monotonic()
        try:
            calls = [
                asyncio.create_task(client.get_issue("acme", "widget", n))
                for n in range(1, SLOTS + 5)
            ]
            assert await asyncio.to_thread(silent.wait_for, SLOTS)
            # No 17th connection while the sixteen hang (their timeout is 1 s away).
            await asyncio.sleep(0.3)
            while_hanging = silent.connections
            results = list(await asyncio.gather(*calls, return_exceptions=True))
            return results, while_hanging, time.monotonic() - started
        finally:
            await client.aclose()

    results, while_hanging, elapsed = asyncio.run(burst())
    messages = _failures(results)
    assert while_hanging == SLOTS
    # All twenty gave up within the one timeout: the four that waited for a connection
    # did not get a second timeout on top of their wait.
    assert all("timed out" in m for m in messages)
    assert elapsed < 2 * 1.0
    assert not any("secret-token" in m for m in messages)


def test_a_permission_lookup_does_not_wait_behind_the_tasks_requests(
    silent: SilentServer,
) -> None:
    async def lookup_while_busy() -> tuple[bool, object]:
        client = GiteaClient(silent.url, "t", timeout=2.0)
        busy = [
            asyncio.create_task(client.get_issue("acme", "widget", n)) for n in range(SLOTS + 4)
        ]
        try:
            assert await asyncio.to_thread(silent.wait_for, SLOTS)
            lookup = asyncio.create_task(client.repo_permission("acme", "widget", "alice"))
            # Its own connection, the 17th, while the tasks' sixteen still hang.
            own_connection = await asyncio.to_thread(silent.wait_for, SLOTS + 1, 1.0)
            outcome = (await asyncio.gather(lookup, return_exceptions=True))[0]
            return own_connection, outcome
        finally:
            await asyncio.gather(*busy, return_exceptions=True)
            await client.aclose()

    own_connection, outcome = asyncio.run(lookup_while_busy())
    assert own_connection
    # It reached the server and timed out on its silence.
    assert isinstance(outcome, GiteaUnavailable) and "timed out" in str(outcome)
