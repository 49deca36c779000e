"""`forgeflow serve` waits for its git children on pidfds, not on a thread per child."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from forgeflow.cli import _watch_children_with_pidfds
from forgeflow.workspace.git import GitRunner, GitTimeout

pytestmark = pytest.mark.skipif(
    sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"),
    reason="Python 3.12+ picks pidfds itself; this kernel/Python has none",
)


@pytest.fixture
def restore_watcher() -> Iterator[None]:
    yield
    asyncio.set_child_watcher(None)  # the next loop gets asyncio's default again


def test_git_children_are_reaped_without_a_thread_each(
    tmp_path: Path, restore_watcher: None
) -> None:
    async def run() -> tuple[str, list[int], int]:
        _watch_children_with_pidfds()
        watcher = type(asyncio.get_child_watcher()).__name__
        git = GitRunner(root=str(tmp_path / "ws"), token=None)
        threads: list[int] = []
        for _ in range(5):
            result = await git.run("--version")
            assert result.returncode == 0 and result.stdout.startswith("git version")
            threads.append(threading.active_count())
        return watcher, threads, threading.active_count()

    before = threading.active_count()
    watcher, during, _ = asyncio.run(run())
    assert watcher == "PidfdChildWatcher"
    # asyncio's default (ThreadedChildWatcher) starts one thread per child it waits for.
    assert during == [before] * 5


def test_a_git_past_its_time_limit_is_killed_and_reaped(
    tmp_path: Path, restore_watcher: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = tmp_path / "bin"
    slow.mkdir()
    (slow / "git").write_text("#!/bin/sh\nexec sleep 30\n")
    (slow / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{slow}{os.pathsep}{os.environ['PATH']}")

    async def run() -> int:
        _watch_children_with_pidfds()
        spawned: list[int] = []
        git = GitRunner(
            root=str(tmp_path / "ws"), token=None, on_spawn=lambda a, e, p, c: spawned.append(p.pid)
        )
        with pytest.raises(GitTimeout):
            await git.run("status", time_limit=0.3)
        return spawned[0]

    pid = asyncio.run(run())
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # already reaped: no zombie left behind
