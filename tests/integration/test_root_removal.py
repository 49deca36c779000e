"""Removing an environment's root (agent/envroot.py) on the real filesystem with real
``flock``s: a root a jail holds stays (held in this process, or by another process
through util-linux ``flock``), one no one holds is renamed away and deleted without
following a link inside it, a link at a root's place is never followed, and a removal
a crash left half-done is finished. The roots here are plain folders with a ``usr``:
what removal sees of a root built by mmdebstrap (tests/acceptance/test_environments.py
removes a real one)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from forgeflow.agent.envroot import RootBuilder, RootUse, use_file
from forgeflow.agent.port import AgentError

KEY = "0123456789abcdef01234567"


def make_root(folder: Path, key: str, outside: Path) -> Path:
    root = folder / key
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "tool").write_text("#!/bin/sh\n")
    # Links inside a root, to what is outside it: removal unlinks, never follows.
    (root / "usr" / "outside-dir").symlink_to(outside)
    (root / "etc").mkdir()
    (root / "etc" / "outside-file").symlink_to(outside / "keep.txt")
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    (path / "keep.txt").write_text("not the root's")
    return path


def test_a_held_root_stays_and_a_released_one_goes(tmp_path: Path, outside: Path) -> None:
    folder = tmp_path / "roots"
    root = make_root(folder, KEY, outside)
    builder = RootBuilder(folder)
    use = RootUse(root)
    assert asyncio.run(builder.remove(KEY)) is False
    assert builder.ready(KEY)
    use.release()
    assert asyncio.run(builder.remove(KEY)) is True
    assert not root.exists() and not builder.ready(KEY)
    assert (outside / "keep.txt").read_text() == "not the root's"
    assert sorted(p.name for p in folder.iterdir()) == [f"{KEY}.lock", f"{KEY}.use"]
    # Gone, a jail starting on it is refused (its task is retried).
    with pytest.raises(AgentError) as refused:
        RootUse(root)
    assert refused.value.code == "environment_not_ready"


def test_a_root_held_by_another_process_stays(tmp_path: Path, outside: Path) -> None:
    folder = tmp_path / "roots"
    make_root(folder, KEY, outside)
    holder = subprocess.Popen(
        ["flock", "--shared", str(use_file(folder / KEY)), "sh", "-c", "echo held; read x"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert asyncio.run(RootBuilder(folder).remove(KEY)) is False
        assert (folder / KEY / "usr").is_dir()
    finally:
        holder.communicate("\n", timeout=10)
    assert asyncio.run(RootBuilder(folder).remove(KEY)) is True


def test_a_link_at_a_roots_place_is_not_followed(tmp_path: Path, outside: Path) -> None:
    folder = tmp_path / "roots"
    folder.mkdir()
    (outside / "usr").mkdir()
    (folder / KEY).symlink_to(outside)
    builder = RootBuilder(folder)
    assert not builder.ready(KEY)
    assert asyncio.run(builder.remove(KEY)) is False
    assert (outside / "keep.txt").exists() and (outside / "usr").is_dir()
    with pytest.raises(ValueError, match="not a root's key"):
        asyncio.run(builder.remove("../outside"))


def test_a_half_done_removal_is_finished(tmp_path: Path, outside: Path) -> None:
    folder = tmp_path / "roots"
    root = make_root(folder, KEY, outside)
    left = folder / f".{KEY}.deadbeef.removing"
    root.rename(left)  # a crash after the rename, before the delete
    other = folder / f".{KEY}.cafe.tmp"  # a build under way: not touched
    other.mkdir()
    asyncio.run(RootBuilder(folder).delete_leftovers())
    assert not left.exists() and other.is_dir()
    assert (outside / "keep.txt").read_text() == "not the root's"
