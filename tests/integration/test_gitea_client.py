"""The Gitea client: its connection limits against a real socket that never answers, and
its permission cache against the emulator."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from forgeflow.domain.permissions import Permission
from forgeflow.gitea.client import GiteaClient, GiteaUnavailable, PermissionCache
from forgeflow_testkit.gitea_emulator import GiteaEmulator

SLOTS = 16  # forgeflow.gitea.transport.CONNECTIONS: what a burst of tasks may hold at once


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
                asyncio.create_task(client.issue("acme", "widget", n)) for n in range(1, SLOTS + 5)
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
        busy = [asyncio.create_task(client.issue("acme", "widget", n)) for n in range(SLOTS + 4)]
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


class RecordingProxy:
    """An HTTP proxy that answers every request itself (200, a permission) and keeps
    the request lines it was sent."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        body = b'{"permission": "write"}'
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                self.lines.append(data.split(b"\r\n", 1)[0].decode())
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                )

    def close(self) -> None:
        self._sock.close()


@pytest.mark.parametrize("bypass", [False, True])
def test_the_proxy_of_the_environment_applies_unless_no_proxy_names_the_host(
    silent: SilentServer, monkeypatch: pytest.MonkeyPatch, bypass: bool
) -> None:
    proxy = RecordingProxy()
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1" if bypass else "")
    monkeypatch.delenv("http_proxy", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)

    async def ask() -> object:
        client = GiteaClient(silent.url, "t", timeout=0.5)
        try:
            return await client.repo_permission("acme", "widget", "alice")
        except GiteaUnavailable as exc:
            return exc
        finally:
            await client.aclose()

    try:
        outcome = asyncio.run(ask())
    finally:
        proxy.close()
    if bypass:  # straight to the (silent) server
        assert proxy.lines == [] and isinstance(outcome, GiteaUnavailable)
        assert silent.connections == 1
    else:  # through the proxy, which answered
        assert proxy.lines == [
            f"GET {silent.url}/api/v1/repos/acme/widget/collaborators/alice/permission HTTP/1.1"
        ]
        assert outcome is Permission.WRITE
        assert silent.connections == 0


def test_a_burst_of_permission_lookups_for_one_commenter_is_one_request(
    tmp_path: Path,
) -> None:
    gitea = GiteaEmulator(tmp_path / "repos")
    gitea.start()
    try:
        token = gitea.add_user("bot")
        gitea.add_user("alice")
        gitea.add_repo("acme", "widget")
        gitea.set_permission("acme", "widget", "alice", "write")
        gitea.set_permission("acme", "widget", "bot", "admin")
        # The look-up takes a while, as a busy Gitea's does: all ten ask meanwhile.
        gitea.fail_next("GET", "/collaborators/alice/permission", status=0, delay=0.3)

        async def burst() -> list[Permission]:
            client = GiteaClient(gitea.url, token)
            cache = PermissionCache(client, ttl_seconds=60)
            try:
                return await asyncio.gather(
                    *(cache.permission("acme", "widget", "alice") for _ in range(10))
                )
            finally:
                await client.aclose()

        answers = asyncio.run(burst())
        assert answers == [Permission.WRITE] * 10, gitea.requests
        asked = [r for r in gitea.requests if r[1].endswith("/collaborators/alice/permission")]
        assert len(asked) == 1, asked
    finally:
        gitea.stop()
