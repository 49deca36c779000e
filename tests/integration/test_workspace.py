"""Workspace Manager against the real git client and the Gitea emulator's smart HTTP
(Basic auth with a token): one clone per repository, one worktree per session, nothing
reset or cleaned, and the token never where git or a person could read it back."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

import forgeflow.workspace.git as gitcmd
from forgeflow.domain.ids import InvalidName, RepoRef, ResourceKind, ResourceRef
from forgeflow.workspace.manager import (
    GitAuthFailed,
    GitFailed,
    GitTimeout,
    PullRequestRefs,
    RepoCheckout,
    WorkspaceDirty,
    WorkspaceManager,
)
from forgeflow_testkit.gitea_emulator import GiteaEmulator

T = TypeVar("T")
BOT = "ccweb-bot"


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
    proc = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    return proc.stdout.strip()


@dataclass
class World:
    emu: GiteaEmulator
    token: str
    root: Path
    clone_url: str
    repo: RepoRef = field(default_factory=lambda: RepoRef("alice", "proj"))

    def manager(self, token: str | None = None, **kw: Any) -> WorkspaceManager:
        return WorkspaceManager(self.root, token=self.token if token is None else token, **kw)

    def issue(self, n: int) -> ResourceRef:
        return ResourceRef(self.repo, ResourceKind.ISSUE, n)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with GiteaEmulator(tmp_path / "gitea") as emu:
        token = emu.add_user(BOT)
        emu.add_user("alice")
        info = emu.add_repo("alice", "proj", files={"a.txt": "one\n", "b.txt": "bee\n"})
        emu.set_permission("alice", "proj", BOT, "write")
        yield World(emu, token, tmp_path / "root", info["clone_url"])


@dataclass
class Spawned:
    argv: list[str]
    env: dict[str, str]
    proc: asyncio.subprocess.Process | None = None
    cwd: str | None = None


@pytest.fixture
def spawned() -> list[Spawned]:
    """Filled, through the runner's ``on_spawn`` seam, with what forgeflow handed to every
    git process it started; pass ``observe(spawned)`` to the manager."""
    return []


def observe(seen: list[Spawned]) -> Any:
    def record(
        argv: list[str], env: Mapping[str, str], proc: asyncio.subprocess.Process, cwd: str | None
    ) -> None:
        seen.append(Spawned(list(argv), dict(env), proc, cwd))

    return record


def files_containing(root: Path, needle: bytes) -> list[Path]:
    return [
        p
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and needle in p.read_bytes()
    ]


# -- the persistent clone -------------------------------------------------------------


def test_first_use_clones_later_fetches_and_sees_new_commit(world: World) -> None:
    wm = world.manager()
    first = run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    assert first.action == "cloned"
    assert first.path == str(world.root / "default" / "alice" / "proj")
    assert (Path(first.path) / "a.txt").read_text() == "one\n"

    new_sha = world.emu.push_branch("alice", "proj", "main", {"c.txt": "new\n"})
    second = run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    assert second.action == "fetched"
    assert second.head == new_sha != first.head
    # Fetched, never checked out: the clone's files are what the clone wrote.
    assert not (Path(second.path) / "c.txt").exists()
    assert git(second.path, "status", "--porcelain") == ""
    # No staging directory left next to the clone.
    assert sorted(os.listdir(world.root / "default" / "alice")) == ["proj"]


def test_token_reaches_git_only_through_askpass(
    world: World, spawned: list[Spawned], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORGEFLOW_GITEA_TOKEN", world.token)
    monkeypatch.setenv("FORGEFLOW_WEBHOOK_SECRET", "hook-secret-value")
    monkeypatch.setenv("GIT_DIR", "/nonexistent")  # an inherited git variable must not leak
    wm = world.manager(on_spawn=observe(spawned))
    checkout = run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    run(wm.prepare_session(world.issue(1), checkout, default_branch="main"))
    pull = make_fork_pull(world)
    run(wm.prepare_session(pull_ref(world, pull), checkout, default_branch="main", pull=pull))

    assert spawned, "no git process was observed"
    askpass = world.root / ".mirrors" / ".forgeflow-askpass"
    assert stat.S_IMODE(askpass.stat().st_mode) == 0o700
    assert world.token not in askpass.read_text()
    network = [s for s in spawned if "fetch" in s.argv and "--" in s.argv]
    assert len(network) == 3  # the mirror's first fetch, its fetch, the PR head's
    for s in spawned:
        assert all(world.token not in arg for arg in s.argv), s.argv
        assert "core.hooksPath=/dev/null" in s.argv and "credential.helper=" in s.argv
        assert not any(k.startswith("FORGEFLOW_") and k not in gitcmd_vars() for k in s.env)
        # The inherited GIT_DIR never reaches git; host git works in the mirror only.
        assert "GIT_DIR" not in s.env and s.env["GIT_TERMINAL_PROMPT"] == "0"
        secret_holders = [k for k, v in s.env.items() if world.token in v]
        if s in network:
            assert secret_holders == ["FORGEFLOW_GIT_PASSWORD"]
            assert s.env["GIT_ASKPASS"] == str(askpass)
            # and only for the Gitea the clone URL names
            assert s.env[gitcmd.ALLOWED_VAR] == world.clone_url.split("/alice/")[0] + "/"
        else:  # local commands never get the credentials
            assert secret_holders == [] and "GIT_ASKPASS" not in s.env
    # Nothing under the root (clone config, worktree admin files, FETCH_HEAD...) has it.
    assert files_containing(world.root, world.token.encode()) == []
    assert world.token not in git(checkout.path, "config", "--list")


def gitcmd_vars() -> set[str]:
    return {gitcmd.USERNAME_VAR, gitcmd.PASSWORD_VAR, gitcmd.ALLOWED_VAR}


def test_wrong_or_missing_token_is_auth_failure_without_leftovers(world: World) -> None:
    wrong = "0123456789abcdef-wrong-token"
    with pytest.raises(GitAuthFailed) as bad:
        run(world.manager(token=wrong).prepare_repo(world.repo, world.clone_url, "main"))
    assert bad.value.code == "git_auth_failed"
    assert wrong not in str(bad.value) and wrong not in repr(bad.value.details)

    with pytest.raises(GitAuthFailed):
        run(
            WorkspaceManager(world.root, token=None).prepare_repo(
                world.repo, world.clone_url, "main"
            )
        )
    # A failed first fetch leaves neither a half mirror nor its staging directory, and
    # no clone was started.
    assert os.listdir(world.root / ".mirrors" / "default" / "alice") == []
    assert not (world.root / "default").exists()


def test_token_never_in_error_text(world: World) -> None:
    wm = world.manager()
    checkout = run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    pull = PullRequestRefs(7, "main", "no-such-branch", "a" * 40, world.clone_url)
    ref = ResourceRef(world.repo, ResourceKind.PULL_REQUEST, 7)
    with pytest.raises(GitFailed) as err:
        run(wm.prepare_session(ref, checkout, default_branch="main", pull=pull))
    assert "no-such-branch" in str(err.value)
    assert world.token not in str(err.value) and world.token not in repr(err.value.details)


def test_urls_and_refs_that_could_smuggle_something_are_refused(world: World) -> None:
    wm = world.manager()
    for url in (
        world.clone_url.replace("http://", "http://bot:pa55word@"),
        "ext::sh -c touch% /tmp/pwned",
        "file:///etc",
        "--upload-pack=touch /tmp/pwned",
    ):
        with pytest.raises(GitFailed) as err:
            run(wm.prepare_repo(world.repo, url, "main"))
        assert "pa55word" not in str(err.value)
    assert not world.root.joinpath("default").exists()

    checkout = run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    ref = ResourceRef(world.repo, ResourceKind.PULL_REQUEST, 3)
    for head in ("main:refs/heads/main", "-x", "a..b", "refs/heads/x y"):
        pull = PullRequestRefs(3, "main", head, "b" * 40, world.clone_url)
        with pytest.raises(GitFailed):
            run(wm.prepare_session(ref, checkout, default_branch="main", pull=pull))
    assert git(checkout.path, "for-each-ref", "--format=%(refname)", "refs/forgeflow") == ""


def test_hand_edited_main_clone_is_dirty_and_left_byte_for_byte(world: World) -> None:
    wm = world.manager()
    checkout = run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    main = Path(checkout.path)
    edited = b"one\r\nhand edit \xff\x00 bytes\n"
    (main / "a.txt").write_bytes(edited)
    (main / "notes.tmp").write_bytes(b"untracked\n")
    world.emu.push_branch("alice", "proj", "main", {"c.txt": "later\n"})

    with pytest.raises(WorkspaceDirty) as err:
        run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    assert err.value.code == "workspace_dirty"
    assert err.value.details["reasons"] == ["modified"]
    assert err.value.details["status"]["modified"] == ["a.txt"]
    assert err.value.details["status"]["untracked"] == ["notes.tmp"]
    assert (main / "a.txt").read_bytes() == edited
    assert (main / "notes.tmp").read_bytes() == b"untracked\n"
    # Touching nothing includes not fetching.
    assert git(main, "rev-parse", "origin/main") == checkout.head


def test_stale_index_lock_in_main_clone_is_dirty(world: World) -> None:
    wm = world.manager()
    checkout = run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    lock = Path(checkout.path) / ".git" / "index.lock"
    lock.write_bytes(b"")
    with pytest.raises(WorkspaceDirty) as err:
        run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    assert err.value.details["reasons"] == ["index_lock"]
    assert lock.exists()


@pytest.mark.parametrize("stage", ["cloning", "checking_out"])
def test_a_clone_a_kill_interrupted_is_made_again(world: World, stage: str) -> None:
    """What a worker's kill -9 in the middle of the first clone leaves (the marker folder,
    and below it or in its place a partial repository) is cloned again, not a clone that
    blocks its repository for ever (a chaos run on PostgreSQL found one)."""
    target = world.root / "default" / "alice" / "proj"
    marker = target / ".forgeflow-cloning"
    (marker / "c").mkdir(parents=True)
    git(str(marker / "c"), "init", "-q")
    if stage == "checking_out":  # the objects are in, the files are not yet
        git(str(marker / "c"), "fetch", "-q", str(world.emu.git_root / "alice/proj.git"), "main")
        (marker / "c" / ".git").rename(target / ".git")
    else:
        (marker / "c" / ".git" / "HEAD").unlink()  # git had not got that far
    checkout = run(world.manager().prepare_repo(world.repo, world.clone_url, "main"))
    assert checkout.action == "cloned"
    assert sorted(os.listdir(target)) == [".git", "a.txt", "b.txt"]
    assert git(str(target), "status", "--porcelain") == ""
    assert git(str(target), "rev-parse", "HEAD") == checkout.head


def test_directory_that_is_not_our_clone_is_dirty(world: World) -> None:
    target = world.root / "default" / "alice" / "proj"
    target.mkdir(parents=True)
    (target / "keep.txt").write_text("mine")
    with pytest.raises(WorkspaceDirty):
        run(world.manager().prepare_repo(world.repo, world.clone_url, "main"))
    assert os.listdir(target) == ["keep.txt"]

    # (A git repository there, whatever its origin, is the agent's clone: forgeflow
    # takes nothing from it but what the jail prints, and fetches into it as data.)

    # An empty directory holds nothing to lose: the clone takes its place.
    other = RepoRef("alice", "empty")
    world.emu.add_repo("alice", "empty")
    world.emu.set_permission("alice", "empty", BOT, "read")
    (world.root / "default" / "alice" / "empty").mkdir()
    url = world.clone_url.replace("/proj.git", "/empty.git")
    assert run(world.manager().prepare_repo(other, url, "main")).action == "cloned"


def test_a_session_that_exists_skips_a_recent_fetch(world: World) -> None:
    wm = world.manager(fetch_interval=0.5)
    checkout = run(wm.prepare_repo(world.repo, world.clone_url, "main", session=world.issue(1)))
    run(wm.prepare_session(world.issue(1), checkout, default_branch="main"))
    pushed = world.emu.push_branch("alice", "proj", "main", {"c.txt": "new\n"})

    reused = run(wm.prepare_repo(world.repo, world.clone_url, "main", session=world.issue(1)))
    assert reused.action == "reused" and reused.head == checkout.head
    # A new session starts from a fresh fetch, and so does one without a session.
    fresh = run(wm.prepare_repo(world.repo, world.clone_url, "main", session=world.issue(2)))
    assert fresh.action == "fetched" and fresh.head == pushed
    assert run(wm.prepare_repo(world.repo, world.clone_url, "main")).action == "fetched"
    # Reused or not, the main clone is checked every time (with nothing to deliver, in
    # the session's own jail step: one jail for the two).
    (Path(checkout.path) / "a.txt").write_text("hand edit\n")
    with pytest.raises(WorkspaceDirty) as dirty:
        got = run(wm.prepare_repo(world.repo, world.clone_url, "main", session=world.issue(1)))
        run(wm.prepare_session(world.issue(1), got, default_branch="main"))
    assert dirty.value.details["reasons"] == ["modified"]
    (Path(checkout.path) / "a.txt").write_text("one\n")
    # A failure forgets the last fetch: the next task fetches.
    again = run(wm.prepare_repo(world.repo, world.clone_url, "main", session=world.issue(1)))
    assert again.action == "fetched"
    assert (
        run(wm.prepare_repo(world.repo, world.clone_url, "main", session=world.issue(1))).action
        == "reused"
    )
    time.sleep(0.6)
    later = run(wm.prepare_repo(world.repo, world.clone_url, "main", session=world.issue(1)))
    assert later.action == "fetched"

    # A new session asks for Gitea's head: fetched only when the branch moved.
    async def head_is(sha: str) -> str | None:
        return sha

    def new(sha: str) -> RepoCheckout:
        fresh = world.issue(9)
        return run(wm.prepare_repo(world.repo, world.clone_url, "main", session=fresh,
                                   branch_head=lambda: head_is(sha)))  # fmt: skip

    assert new(later.head).action == "reused"
    moved = world.emu.push_branch("alice", "proj", "main", {"d.txt": "more\n"})
    got = new(moved)
    assert got.action == "fetched" and got.head == moved
    # A manager that never fetched this clone (a restart) asks git for the clone's head.
    restarted = world.manager(fetch_interval=0.5)
    for sha, action in ((moved, "reused"), ("0" * 40, "fetched")):
        checked = run(restarted.prepare_repo(world.repo, world.clone_url, "main",
                                             session=world.issue(10),
                                             branch_head=lambda sha=sha: head_is(sha)))  # fmt: skip
        assert checked.action == action and checked.head == moved

    # With an interval of 0 (the manager's default), every task fetches.
    always = world.manager()
    for _ in range(2):
        got = run(always.prepare_repo(world.repo, world.clone_url, "main", session=world.issue(1)))
        assert got.action == "fetched"


def test_an_origin_the_agent_rewrote_changes_nothing_of_forgeflows(
    world: World, spawned: list[Spawned]
) -> None:
    wm = world.manager(on_spawn=observe(spawned))
    checkout = run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    git(checkout.path, "remote", "set-url", "origin", "http://example.invalid/x/y.git")
    git(checkout.path, "config", "url.http://127.0.0.1:9/.insteadOf", "http://")
    world.emu.push_branch("alice", "proj", "main", {"c.txt": "later\n"})
    spawned.clear()
    again = run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    # The new commit came from Gitea into the mirror, and from there into the clone.
    assert again.action == "fetched" and again.head != checkout.head
    assert git(checkout.path, "rev-parse", "origin/main") == again.head
    mirror = str(world.root / ".mirrors/default/alice/proj.git")
    clone, sessions = str(world.root / "default"), str(world.root / ".sessions")
    for s in spawned:  # forgeflow's own git ran only in its mirror
        assert s.cwd is not None and s.cwd.startswith(str(world.root / ".mirrors")), s
        assert not any(a.startswith((clone, sessions)) for a in s.argv), s.argv
    assert any(s.cwd == mirror for s in spawned)


# -- sessions -------------------------------------------------------------------------


def test_sessions_are_isolated_and_keep_their_own_work(world: World) -> None:
    wm = world.manager()
    checkout = run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    one = run(wm.prepare_session(world.issue(1), checkout, default_branch="main"))
    two = run(wm.prepare_session(world.issue(2), checkout, default_branch="main"))
    assert one.created and one.branch == "ccweb/issue-1" and one.status.head == checkout.head
    assert one.path == str(world.root / ".sessions" / "default" / "alice" / "proj" / "issue-1")
    assert two.branch == "ccweb/issue-2" and two.status.clean

    Path(one.path, "a.txt").write_text("agent's change\n")
    Path(one.path, "wip.py").write_text("print('wip')\n")

    assert run(wm.worktree_status(two.path)).clean
    assert Path(two.path, "a.txt").read_text() == "one\n"
    assert not Path(two.path, "wip.py").exists()

    again = run(wm.prepare_session(world.issue(1), checkout, default_branch="main"))
    assert not again.created and not again.upstream_moved
    assert again.status.modified == ["a.txt"] and again.status.untracked == ["wip.py"]
    assert again.status.summary()["counts"] == {"modified": 1, "untracked": 1, "unmerged": 0}
    assert Path(one.path, "a.txt").read_text() == "agent's change\n"
    # The session's own work does not make the main clone dirty.
    assert run(wm.prepare_repo(world.repo, world.clone_url, "main")).action == "fetched"


def test_worktree_index_lock_unmerged_and_occupied_paths_are_dirty(world: World) -> None:
    wm = world.manager()
    checkout = run(wm.prepare_repo(world.repo, world.clone_url, "main"))

    one = run(wm.prepare_session(world.issue(1), checkout, default_branch="main"))
    lock = Path(git(one.path, "rev-parse", "--absolute-git-dir")) / "index.lock"
    lock.write_bytes(b"")
    with pytest.raises(WorkspaceDirty) as err:
        run(wm.prepare_session(world.issue(1), checkout, default_branch="main"))
    assert err.value.details["reason"] == "index_lock" and lock.exists()

    two = Path(run(wm.prepare_session(world.issue(2), checkout, default_branch="main")).path)
    git(two, "checkout", "-q", "-b", "side")
    (two / "a.txt").write_text("side\n")
    git(two, "commit", "-qam", "side")
    git(two, "checkout", "-q", "ccweb/issue-2")
    (two / "a.txt").write_text("session\n")
    git(two, "commit", "-qam", "session")
    git(two, "merge", "side")
    with pytest.raises(WorkspaceDirty) as err:
        run(wm.prepare_session(world.issue(2), checkout, default_branch="main"))
    assert err.value.details["reason"] == "unmerged"
    assert "<<<<<<<" in (two / "a.txt").read_text()

    taken = world.root / ".sessions" / "default" / "alice" / "proj" / "issue-3"
    taken.mkdir(parents=True)
    (taken / "x").write_text("someone else's")
    with pytest.raises(WorkspaceDirty) as err:
        run(wm.prepare_session(world.issue(3), checkout, default_branch="main"))
    assert err.value.details["reason"] == "occupied"
    assert os.listdir(taken) == ["x"]


def test_a_copy_of_another_sessions_worktree_is_not_ours(world: World) -> None:
    wm = world.manager()
    checkout = run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    one = run(wm.prepare_session(world.issue(1), checkout, default_branch="main"))
    copy = world.root / ".sessions" / "default" / "alice" / "proj" / "issue-2"
    shutil.copytree(one.path, copy, symlinks=True)
    with pytest.raises(WorkspaceDirty) as err:
        run(wm.prepare_session(world.issue(2), checkout, default_branch="main"))
    assert err.value.details["reason"] == "occupied"
    assert run(wm.prepare_session(world.issue(1), checkout, default_branch="main")).status.clean


def test_a_worktree_of_another_repository_is_not_ours(world: World, tmp_path: Path) -> None:
    # git's files are read directly in the common case: a real worktree that belongs
    # to another clone must still be refused, and with git's own verdict.
    wm = world.manager()
    checkout = run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    other = tmp_path / "other"
    git(tmp_path, "init", "-q", "-b", "main", str(other))
    (other / "f").write_text("x\n")
    git(other, "add", "f")
    git(other, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    taken = world.root / ".sessions" / "default" / "alice" / "proj" / "issue-4"
    taken.parent.mkdir(parents=True, exist_ok=True)
    git(other, "worktree", "add", "-q", "-b", "ccweb/issue-4", str(taken))
    with pytest.raises(WorkspaceDirty) as err:
        run(wm.prepare_session(world.issue(4), checkout, default_branch="main"))
    assert err.value.details["reason"] == "occupied"
    assert (taken / "f").read_text() == "x\n"


def test_a_worktree_deleted_by_hand_comes_back_with_its_branch(world: World) -> None:
    wm = world.manager()
    checkout = run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    one = run(wm.prepare_session(world.issue(1), checkout, default_branch="main"))
    Path(one.path, "work.txt").write_text("committed work\n")
    git(one.path, "add", "work.txt")
    git(one.path, "commit", "-qm", "work")
    head = git(one.path, "rev-parse", "HEAD")
    shutil.rmtree(one.path)  # still registered in the main clone, its directory gone
    again = run(wm.prepare_session(world.issue(1), checkout, default_branch="main"))
    assert again.created and again.branch == "ccweb/issue-1" and again.status.head == head
    assert Path(again.path, "work.txt").read_text() == "committed work\n"


def test_repository_hooks_never_run(world: World) -> None:
    wm = world.manager()
    checkout = run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    marker = world.root.parent / "hook-ran"
    hooks = Path(checkout.path) / ".git" / "hooks"
    for name in ("post-checkout", "reference-transaction", "post-merge", "pre-auto-gc"):
        hook = hooks / name
        hook.write_text(f"#!/bin/sh\necho {name} >> '{marker}'\n")
        hook.chmod(0o755)
    world.emu.push_branch("alice", "proj", "main", {"c.txt": "x\n"})
    checkout = run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    run(wm.prepare_session(world.issue(1), checkout, default_branch="main"))
    assert not marker.exists()


def make_fork_pull(world: World) -> PullRequestRefs:
    world.emu.add_user("bob")
    world.emu.set_permission("alice", "proj", "bob", "read")
    world.emu.add_repo("bob", "proj", fork_of=("alice", "proj"))
    world.emu.set_permission("bob", "proj", BOT, "read")
    world.emu.push_branch("bob", "proj", "feature", {"feature.txt": "v1\n"}, message="v1")
    index = world.emu.add_pull(
        "alice", "proj", title="feat", head="feature", author="bob", head_repo=("bob", "proj")
    )
    return pull_refs(world, index)


def pull_refs(world: World, index: int) -> PullRequestRefs:
    data = world.emu.pull("alice", "proj", index)
    head = data["head"]
    return PullRequestRefs(
        number=index,
        base_ref=data["base"]["ref"],
        head_ref=head["ref"],
        head_sha=head["sha"],
        head_clone_url=head["repo"]["clone_url"],
    )


def pull_ref(world: World, pull: PullRequestRefs) -> ResourceRef:
    return ResourceRef(world.repo, ResourceKind.PULL_REQUEST, pull.number)


def test_pull_request_session_from_fork_fast_forwards_when_clean(world: World) -> None:
    wm = world.manager()
    checkout = run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    pull = make_fork_pull(world)
    assert "/bob/proj.git" in pull.head_clone_url
    resource = pull_ref(world, pull)

    first = run(wm.prepare_session(resource, checkout, default_branch="main", pull=pull))
    assert first.created and first.branch == f"ccweb/pull_request-{pull.number}"
    assert first.status.head == pull.head_sha and not first.upstream_moved
    assert Path(first.path, "feature.txt").read_text() == "v1\n"

    world.emu.push_branch("bob", "proj", "feature", {"feature.txt": "v2\n"}, message="v2")
    moved = pull_refs(world, pull.number)
    second = run(wm.prepare_session(resource, checkout, default_branch="main", pull=moved))
    assert second.fast_forwarded and not second.upstream_moved and not second.created
    assert second.status.head == moved.head_sha
    assert Path(first.path, "feature.txt").read_text() == "v2\n"

    # Uncommitted work of the agent: upstream moved, the worktree is left alone.
    Path(first.path, "feature.txt").write_text("agent wip\n")
    world.emu.push_branch("bob", "proj", "feature", {"feature.txt": "v3\n"}, message="v3")
    third_refs = pull_refs(world, pull.number)
    third = run(wm.prepare_session(resource, checkout, default_branch="main", pull=third_refs))
    assert third.upstream_moved and not third.fast_forwarded
    assert third.status.head == moved.head_sha and third.status.modified == ["feature.txt"]
    assert Path(first.path, "feature.txt").read_text() == "agent wip\n"


def test_remove_session_only_when_clean(world: World) -> None:
    wm = world.manager()
    checkout = run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    one = run(wm.prepare_session(world.issue(1), checkout, default_branch="main"))
    Path(one.path, "wip.txt").write_text("keep me")
    with pytest.raises(WorkspaceDirty):
        run(wm.remove_session(world.issue(1)))
    assert Path(one.path, "wip.txt").read_text() == "keep me"

    Path(one.path, "wip.txt").unlink()
    assert run(wm.remove_session(world.issue(1))) is True
    assert not Path(one.path).exists()
    assert git(checkout.path, "rev-parse", "--verify", "ccweb/issue-1") == checkout.head
    assert run(wm.remove_session(world.issue(1))) is False
    # The kept branch is checked out again on the next prepare.
    assert run(wm.prepare_session(world.issue(1), checkout, default_branch="main")).created


# -- names, paths, time limits ----------------------------------------------------------


@pytest.mark.parametrize("bad", ["..", ".", "a/b", "-rf", "a\0b", "x" * 200, "", "a b", "x.git"])
def test_hostile_names_are_refused_before_any_path_exists(bad: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidName):
        ResourceRef(RepoRef(bad, "proj"), ResourceKind.ISSUE, 1)
    with pytest.raises(InvalidName):
        ResourceRef(RepoRef("alice", bad), ResourceKind.PULL_REQUEST, 1)
    assert list(tmp_path.iterdir()) == []


def test_nothing_is_created_outside_the_root(world: World, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    world.root.joinpath("default").mkdir(parents=True)
    # A symlink planted inside the root must not lead the clone elsewhere.
    world.root.joinpath("default", "alice").symlink_to(outside)
    wm = world.manager()
    with pytest.raises(WorkspaceDirty) as err:
        run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    assert err.value.details["reason"] == "outside_root"
    assert list(outside.iterdir()) == []

    world.root.joinpath("default", "alice").unlink()
    before = set(tmp_path.iterdir())
    checkout = run(wm.prepare_repo(world.repo, world.clone_url, "main"))
    run(wm.prepare_session(world.issue(1), checkout, default_branch="main"))
    assert set(tmp_path.iterdir()) == before
    assert list(outside.iterdir()) == []
    with pytest.raises(ValueError, match="belong"):
        foreign = RepoCheckout(str(outside), "cloned", checkout.head)
        run(wm.prepare_session(world.issue(2), foreign, default_branch="main"))


@pytest.fixture
def silent_server() -> Iterator[str]:
    """Accepts connections and never answers a byte."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/alice/proj.git"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def test_git_timeout_kills_git_quickly(
    silent_server: str, tmp_path: Path, spawned: list[Spawned]
) -> None:
    wm = WorkspaceManager(
        tmp_path / "root", token="some-token-value", git_timeout=1.0, on_spawn=observe(spawned)
    )
    started = time.monotonic()
    with pytest.raises(GitTimeout) as err:
        run(wm.prepare_repo(RepoRef("alice", "proj"), silent_server, "main"))
    assert time.monotonic() - started < 8
    assert err.value.code == "git_timeout" and "some-token-value" not in str(err.value)
    assert os.listdir(tmp_path / "root" / ".mirrors" / "default" / "alice") == []
    # git and its helpers (git-remote-http) ran in one process group, all of it ended.
    [_init, clone] = spawned
    assert clone.proc is not None and clone.proc.returncode is not None
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.killpg(clone.proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("a git process of the timed-out clone is still alive")
