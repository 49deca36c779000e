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
from pathlib import Path

import pytest

from forgeflow.config import load_settings
from forgeflow.domain.ids import RepoRef, ResourceKind, ResourceRef
from forgeflow.services import build_services
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


def test_a_pipelines_cleanup_waits_for_a_tasks_git_work_on_the_repository(
    emulator: GiteaEmulator, gate: Gate, tmp_path: Path, db_url: str
) -> None:
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
    repo = RepoRef("alice", "proj")
    issue = ResourceRef(repo, ResourceKind.ISSUE, 1)
    clone_url = f"{gate.url}/alice/proj.git"
    assert services.pipelines is not None
    cleanup_port = services.pipelines.ports.workspace

    async def scenario() -> None:
        # The manager the scheduler is built with (Services._start_scheduler).
        workspace = services.workspace
        checkout = await workspace.prepare_repo(repo, clone_url, "main")
        session = await workspace.prepare_session(issue, checkout, default_branch="main")
        waiting: list[str] = []
        waits = asyncio.Event()

        def on_wait(_repo: RepoRef, what: str) -> None:
            waiting.append(what)
            waits.set()

        workspace.locks.on_wait = on_wait
        gate.shut()
        task = asyncio.create_task(workspace.prepare_repo(repo, clone_url, "main"))
        await asyncio.to_thread(gate.held.wait)  # the task's fetch, inside the lock
        cleanup = asyncio.create_task(cleanup_port.cleanup(issue))
        waited = asyncio.create_task(waits.wait())
        done, _ = await asyncio.wait({cleanup, waited}, return_when=asyncio.FIRST_COMPLETED)
        # A manager of its own would have removed the worktree while the task fetched.
        assert waited in done and not cleanup.done(), "the cleanup did not wait"
        assert waiting == ["remove_session"]
        assert Path(session.path).is_dir()
        gate.opened.set()
        assert (await task).action == "fetched"
        assert await cleanup == {"resourceKey": issue.key, "removed": True}
        assert not Path(session.path).exists()
        await services.aclose()

    asyncio.run(scenario())
