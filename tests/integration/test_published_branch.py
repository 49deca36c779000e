"""A session's published branch is its durable state (#27): wherever its worktree is
made anew (another worker's disk, a lost workspace folder) it starts from the branch on
Gitea, never from the default branch; a local branch behind it is fast-forwarded when
clean, and one that diverged (or is behind with work in it) blocks, naming both heads,
with nothing reset. Real git, the real jail, the Gitea emulator's smart HTTP."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from forgeflow.domain.ids import RepoRef, ResourceKind, ResourceRef
from forgeflow.workspace.manager import SessionWorktree, WorkspaceDirty, WorkspaceManager
from forgeflow_testkit.gitea_emulator import GiteaEmulator

T = TypeVar("T")
BOT = "ccweb-bot"
BRANCH = "ccweb/issue-1"
REPO = RepoRef("alice", "proj")
ISSUE = ResourceRef(REPO, ResourceKind.ISSUE, 1)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def git(cwd: Path | str, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@dataclass
class World:
    emu: GiteaEmulator
    token: str
    tmp: Path
    clone_url: str

    def manager(self, root: str, **kw: Any) -> WorkspaceManager:
        return WorkspaceManager(self.tmp / root, token=self.token, **kw)

    def session(self, wm: WorkspaceManager) -> SessionWorktree:
        checkout = run(wm.prepare_repo(REPO, self.clone_url, "main", session=ISSUE))
        return run(wm.prepare_session(ISSUE, checkout, default_branch="main"))


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with GiteaEmulator(tmp_path / "gitea") as emu:
        token = emu.add_user(BOT)
        emu.add_user("alice")
        info = emu.add_repo("alice", "proj", files={"a.txt": "one\n"})
        emu.set_permission("alice", "proj", BOT, "write")
        yield World(emu, token, tmp_path, info["clone_url"])


def commit(worktree: SessionWorktree, name: str, text: str) -> str:
    Path(worktree.path, name).write_text(text)
    git(worktree.path, "add", name)
    git(worktree.path, "commit", "-qm", f"{name}: {text.strip()}")
    return git(worktree.path, "rev-parse", "HEAD")


def publish(world: World, wm: WorkspaceManager, sha: str) -> None:
    assert run(wm.push(REPO, world.clone_url, sha, BRANCH)) is None
    assert world.emu.branch_sha("alice", "proj", BRANCH) == sha


def test_another_workers_worktree_continues_the_published_branch(world: World) -> None:
    first = world.manager("w1")
    one = world.session(first)
    c1 = commit(one, "fix.txt", "one")
    publish(world, first, c1)

    # Another disk (a worker that took the repository over): the worktree is made from
    # the published branch, with the first commit in it.
    second = world.manager("w2")
    taken = world.session(second)
    assert taken.created and taken.published == c1 and taken.status.head == c1
    assert taken.branch == BRANCH and Path(taken.path, "fix.txt").read_text() == "one"
    c2 = commit(taken, "fix.txt", "two")
    publish(world, second, c2)  # a fast-forward: refused otherwise
    assert world.emu.branch_log("alice", "proj", BRANCH)[:2] == [c2, c1]


def test_a_lost_workspace_folder_is_rebuilt_from_the_branch(world: World) -> None:
    wm = world.manager("w1")
    c1 = commit(world.session(wm), "fix.txt", "one")
    publish(world, wm, c1)
    shutil.rmtree(world.tmp / "w1")  # mirror, clone and worktrees: all gone
    again = world.session(world.manager("w1"))
    assert again.created and again.status.head == c1 and again.status.clean


def test_a_skipped_fetch_still_fetches_the_session_branch(world: World) -> None:
    wm = world.manager("w1")
    c1 = commit(world.session(wm), "fix.txt", "one")
    publish(world, wm, c1)
    # A worker whose mirror is current for main but knows no worktree of the session:
    # its fetch is skipped (main did not move), the session branch alone is fetched.
    other = world.manager("w2", fetch_interval=60)
    world.session(other)  # the mirror, the clone and a worktree (made before c2)
    c2 = world.emu.push_branch("alice", "proj", BRANCH, {"fix.txt": "by hand\n"})
    shutil.rmtree(Path(world.session(other).path))
    other = world.manager("w2", fetch_interval=60)  # a restart: no worktree known

    async def head() -> str | None:
        return world.emu.branch_sha("alice", "proj", "main")

    checkout = run(other.prepare_repo(REPO, world.clone_url, "main", session=ISSUE,
                                      branch_head=head))  # fmt: skip
    assert checkout.action == "reused"
    got = run(other.prepare_session(ISSUE, checkout, default_branch="main"))
    assert got.published == c2 and got.status.head == c2 and got.fast_forwarded
    # A session Gitea has no branch of: the one-ref fetch finds none, main it is.
    issue2 = ResourceRef(REPO, ResourceKind.ISSUE, 2)
    checkout = run(other.prepare_repo(REPO, world.clone_url, "main", session=issue2,
                                      branch_head=head))  # fmt: skip
    assert checkout.action == "reused"
    fresh = run(other.prepare_session(issue2, checkout, default_branch="main"))
    assert fresh.created and fresh.published is None and fresh.status.head == checkout.head


def test_a_clean_branch_behind_the_published_one_is_fast_forwarded(world: World) -> None:
    wm = world.manager("w1")
    one = world.session(wm)
    c1 = commit(one, "fix.txt", "one")
    publish(world, wm, c1)
    c2 = world.emu.push_branch("alice", "proj", BRANCH, {"more.txt": "x\n"}, message="more")
    again = world.session(wm)
    assert again.fast_forwarded and not again.created and again.status.head == c2
    assert Path(one.path, "more.txt").read_text() == "x\n"


def test_a_diverged_branch_blocks_naming_both_heads_and_nothing_is_reset(world: World) -> None:
    wm = world.manager("w1")
    one = world.session(wm)
    c1 = commit(one, "fix.txt", "one")
    publish(world, wm, c1)
    theirs = world.emu.push_branch("alice", "proj", BRANCH, {"fix.txt": "theirs\n"})
    ours = commit(one, "fix.txt", "ours")
    with pytest.raises(WorkspaceDirty) as blocked:
        world.session(wm)
    details = blocked.value.details
    assert (details["reason"], details["localHead"], details["publishedHead"]) == (
        "diverged",
        ours,
        theirs,
    )
    assert ours in str(blocked.value) and theirs in str(blocked.value)
    assert git(one.path, "rev-parse", "HEAD") == ours
    assert Path(one.path, "fix.txt").read_text() == "ours"
    assert world.emu.branch_sha("alice", "proj", BRANCH) == theirs


def test_a_branch_behind_with_uncommitted_work_blocks(world: World) -> None:
    wm = world.manager("w1")
    one = world.session(wm)
    c1 = commit(one, "fix.txt", "one")
    publish(world, wm, c1)
    theirs = world.emu.push_branch("alice", "proj", BRANCH, {"more.txt": "x\n"})
    Path(one.path, "fix.txt").write_text("wip\n")
    with pytest.raises(WorkspaceDirty) as blocked:
        world.session(wm)
    assert blocked.value.details["reason"] == "behind"
    assert (blocked.value.details["localHead"], blocked.value.details["publishedHead"]) == (
        c1,
        theirs,
    )
    assert git(one.path, "rev-parse", "HEAD") == c1
    assert Path(one.path, "fix.txt").read_text() == "wip\n"


def test_gitea_s_word_on_the_session_branch_spares_the_one_ref_fetch(world: World) -> None:
    """With the API's lookup, a skipped fetch fetches the session branch only when Gitea
    has it at a head the mirror lacks: a new session (no branch) costs no git exchange."""
    from forgeflow.workspace.published import Said

    wm = world.manager("w1")
    c1 = commit(world.session(wm), "fix.txt", "one")
    publish(world, wm, c1)
    other = world.manager("w2", fetch_interval=60)
    world.session(other)  # the mirror (with c1 on the session branch) and the clone

    async def main_head() -> str | None:
        return world.emu.branch_sha("alice", "proj", "main")

    def lookup(branch: str) -> Any:
        async def said() -> Said:
            return Said(world.emu.branch_sha("alice", "proj", branch))

        return said

    def fetches() -> int:
        # git's first request of each fetch is refused for want of credentials, then sent
        # again with them: the answered one is counted.
        return sum(p.endswith("/info/refs") and s == 200 for _m, p, s in world.emu.requests)

    def fresh_session(resource: ResourceRef, branch: str) -> SessionWorktree:
        wm2 = world.manager("w2", fetch_interval=60)  # a restart: no worktree known
        checkout = run(wm2.prepare_repo(REPO, world.clone_url, "main", session=resource,
                                        branch_head=main_head))  # fmt: skip
        assert checkout.action == "reused"
        return run(wm2.prepare_session(resource, checkout, default_branch="main",
                                       published_head=lookup(branch)))  # fmt: skip

    # No branch on Gitea: the default branch, and not one git request.
    before = fetches()
    issue2 = ResourceRef(REPO, ResourceKind.ISSUE, 2)
    fresh = fresh_session(issue2, "ccweb/issue-2")
    assert fresh.created and fresh.published is None and fetches() == before
    # Gitea's head is the mirror's: no fetch either.
    shutil.rmtree(Path(world.session(other).path))
    same = fresh_session(ISSUE, BRANCH)
    assert same.published == c1 and same.status.head == c1 and fetches() == before
    # Gitea's branch moved: it is fetched, and the worktree follows it.
    c2 = world.emu.push_branch("alice", "proj", BRANCH, {"fix.txt": "by hand\n"})
    moved = fresh_session(ISSUE, BRANCH)
    assert moved.published == c2 and moved.status.head == c2 and fetches() == before + 1
