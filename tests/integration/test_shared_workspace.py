"""One workspace manager per process, shared by tasks and pipelines: a pipeline's cleanup
of a session waits for a task's git work on the same repository (its lock), instead of
removing the worktree under it.

Real git against the Gitea emulator, reached through a forwarder the test can hold
shut: the task's fetch waits there, inside the repository's lock, for as long as the
test wants; no clock decides anything."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from forgeflow.config import load_settings
from forgeflow.domain.ids import RepoRef, ResourceKind, ResourceRef
from forgeflow.services import Services, build_services
from forgeflow_testkit.gitea_emulator import GiteaEmulator

BOT = "ccweb-bot"


class Gate:
    """A TCP forwarder to ``port``; while shut, a new connection waits until it opens."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.opened = threading.Event()
        self.opened.set()
        self.held = threading.Event()  # a connection arrived while shut
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def shut(self) -> None:
        self.held.clear()
        self.opened.clear()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._forward, args=(conn,), daemon=True).start()

    def _forward(self, conn: socket.socket) -> None:
        if not self.opened.is_set():
            self.held.set()
            self.opened.wait()
        upstream = socket.create_connection(("127.0.0.1", self.port))
        back = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
        back.start()
        _pump(conn, upstream)
        back.join()
        conn.close()
        upstream.close()

    def close(self) -> None:
        self.opened.set()
        self.stop.set()
        self.thread.join()
        self.listener.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):  # either side may go first
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[GiteaEmulator]:
    with GiteaEmulator(tmp_path / "gitea") as emu:
        yield emu


@pytest.fixture
def gate(emulator: GiteaEmulator) -> Iterator[Gate]:
    port = int(emulator.url.rsplit(":", 1)[1].split("/")[0])
    g = Gate(port)
    yield g
    g.close()


@dataclass
class Process:
    services: Services
    gate: Gate
    repo: RepoRef = field(default_factory=lambda: RepoRef("alice", "proj"))

    @property
    def issue(self) -> ResourceRef:
        return ResourceRef(self.repo, ResourceKind.ISSUE, 1)

    @property
    def clone_url(self) -> str:
        return f"{self.gate.url}/alice/proj.git"

    async def session(self) -> Path:
        """The issue's session worktree, prepared as a task prepares it."""
        workspace = self.services.workspace  # the one Services._start_scheduler uses
        checkout = await workspace.prepare_repo(self.repo, self.clone_url, "main")
        made = await workspace.prepare_session(self.issue, checkout, default_branch="main")
        return Path(made.path)

    def watch_waits(self) -> tuple[asyncio.Event, list[str]]:
        waits, waiting = asyncio.Event(), []

        def on_wait(_repo: RepoRef, what: str) -> None:
            waiting.append(what)
            waits.set()

        self.services.workspace.locks.on_wait = on_wait
        return waits, waiting

    async def cleanup(self) -> dict[str, Any]:
        """The pipelines' ``repos.cleanup`` of the issue, through their own port."""
        assert self.services.pipelines is not None
        return await self.services.pipelines.ports.workspace.cleanup(self.issue)


@pytest.fixture
def process(emulator: GiteaEmulator, gate: Gate, tmp_path: Path, db_url: str) -> Iterator[Process]:
    token = emulator.add_user(BOT)
    emulator.add_user("alice")
    emulator.add_repo("alice", "proj", files={"a.txt": "one\n"})
    emulator.set_permission("alice", "proj", BOT, "write")
    settings = load_settings(
        data_dir=tmp_path / "ff",
        database_url=db_url,
        gitea_url=gate.url,
        gitea_token=token,
        admin_token="admin-test-token-abcdef",
    )
    services = build_services(settings)
    yield Process(services, gate)
    asyncio.run(services.aclose())


async def _first(waits: asyncio.Event, cleanup: asyncio.Task[dict[str, Any]]) -> None:
    """Until the cleanup waits, or (a manager of its own) ends without waiting."""
    waited = asyncio.create_task(waits.wait())
    await asyncio.wait({cleanup, waited}, return_when=asyncio.FIRST_COMPLETED)
    waited.cancel()
    assert waits.is_set() and not cleanup.done(), "the cleanup did not wait"


def test_a_pipelines_cleanup_waits_for_a_tasks_git_work_on_the_repository(
    process: Process,
) -> None:
    async def scenario() -> None:
        worktree = await process.session()
        waits, waiting = process.watch_waits()
        process.gate.shut()
        fetch = asyncio.create_task(
            process.services.workspace.prepare_repo(process.repo, process.clone_url, "main")
        )
        await asyncio.to_thread(process.gate.held.wait)  # the task's fetch, inside the lock
        cleanup = asyncio.create_task(process.cleanup())
        await _first(waits, cleanup)
        assert waiting == ["remove_session"] and worktree.is_dir()
        process.gate.opened.set()
        assert (await fetch).action == "fetched"
        assert await cleanup == {"resourceKey": process.issue.key, "removed": True}
        assert not worktree.exists()

    asyncio.run(scenario())


def test_a_pipelines_cleanup_waits_for_a_task_working_in_the_repository(
    process: Process,
) -> None:
    async def scenario() -> None:
        worktree = await process.session()
        waits, waiting = process.watch_waits()
        working, turn_over = asyncio.Event(), asyncio.Event()

        async def task() -> None:  # its life from preparation to push, the turn between
            async with process.services.workspace.working(process.repo):
                working.set()
                await turn_over.wait()
                assert worktree.is_dir()  # still there at the turn's end

        running = asyncio.create_task(task())
        await working.wait()
        cleanup = asyncio.create_task(process.cleanup())
        await _first(waits, cleanup)
        assert waiting == ["remove_session"] and worktree.is_dir()
        turn_over.set()
        await running
        assert await cleanup == {"resourceKey": process.issue.key, "removed": True}
        assert not worktree.exists()

    asyncio.run(scenario())
