"""The one-shot jail runner against real bubblewrap: the repository's trees at their
paths, nothing of forgeflow's environment, bounded output, a time limit that ends the
whole jail, and no bind of a path the agent replaced with a symlink."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from forgeflow.agent.jail import JailRefused
from forgeflow.agent.oneshot import JailRunner
from forgeflow.domain.ids import RepoRef

REPO = RepoRef("acme", "widget")


@pytest.fixture(params=[True, False], ids=["jailed", "unjailed"])
def runner(request: pytest.FixtureRequest, tmp_path: Path) -> JailRunner:
    return JailRunner(tmp_path / "ws", jailed=request.param)


def test_a_command_sees_its_trees_and_a_cleared_environment(
    runner: JailRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORGEFLOW_GITEA_TOKEN", "host-secret-value")
    clone = runner.paths(REPO).clone
    script = "pwd; env; cat; echo made > made.txt; echo oops >&2; exit 3"
    result = asyncio.run(
        runner.run(
            ["sh", "-c", script],
            repository=REPO,
            cwd=str(clone),
            stdin=b"from-stdin\n",
            timeout=30,
            output_limit=100_000,
        )
    )
    out = result.stdout.decode()
    assert result.returncode == 3 and result.stderr == b"oops\n", result
    assert out.splitlines()[0] == str(clone) and "from-stdin" in out
    assert "host-secret-value" not in out and "FORGEFLOW_" not in out
    assert (clone / "made.txt").read_text() == "made\n"  # the clone is bound read-write
    assert not result.truncated and not result.timed_out


def test_output_past_the_limit_ends_the_command(runner: JailRunner) -> None:
    result = asyncio.run(
        runner.run(["sh", "-c", "yes"], repository=REPO, cwd="/tmp", timeout=30, output_limit=4096)
    )
    assert result.truncated and len(result.stdout) == 4096 and result.returncode != 0


def test_the_time_limit_ends_the_whole_jail(runner: JailRunner, tmp_path: Path) -> None:
    clone = runner.paths(REPO).clone
    # A child in the background keeps writing; once the limit passed it must be gone.
    script = "(while true; do date +%s%N >> ticks; sleep 0.05; done) & sleep 60"
    result = asyncio.run(
        runner.run(["sh", "-c", script], repository=REPO, cwd=str(clone), timeout=1,
                   output_limit=1000)
    )  # fmt: skip
    assert result.timed_out and result.returncode != 0
    size = (clone / "ticks").stat().st_size
    asyncio.run(asyncio.sleep(0.5))
    assert (clone / "ticks").stat().st_size == size, "a jailed process outlived the limit"


def test_a_host_file_is_given_as_stdin(runner: JailRunner, tmp_path: Path) -> None:
    data = tmp_path / "bundle.bin"
    data.write_bytes(os.urandom(300_000))
    result = asyncio.run(
        runner.run(["sh", "-c", "wc -c"], repository=REPO, cwd="/tmp", stdin=data,
                   timeout=30, output_limit=100)
    )  # fmt: skip
    assert result.stdout.split() == [b"300000"]


def test_a_symlinked_tree_is_not_bound(tmp_path: Path) -> None:
    runner = JailRunner(tmp_path / "ws")
    paths = runner.paths(REPO)
    paths.make(runner.root)
    paths.home.rmdir()
    paths.home.symlink_to("/etc")  # what an escaped agent would plant
    with pytest.raises(JailRefused, match="not a directory"):
        asyncio.run(runner.run(["true"], repository=REPO, cwd="/tmp", timeout=5, output_limit=10))
    assert paths.home.is_symlink()


def test_the_jail_may_not_make_user_namespaces(tmp_path: Path) -> None:
    runner = JailRunner(tmp_path / "ws")
    result = asyncio.run(
        runner.run(["unshare", "-U", "true"], repository=REPO, cwd="/tmp", timeout=10,
                   output_limit=10_000)
    )  # fmt: skip
    assert result.returncode != 0 and b"unshare failed" in result.stderr, result
