"""Publishing a session's branch with the real git, the Gitea emulator's smart HTTP and
the store, crash cases included: a push whose record a crash took is found on Gitea and
not repeated; a push a crash stopped before it ran is made by the retry."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from forgeflow.domain.ids import RepoRef, ResourceKind, ResourceRef
from forgeflow.domain.paths import repo_workspace, session_worktree
from forgeflow.domain.records import Task
from forgeflow.store import Store, audit, pushes, repos, tasks
from forgeflow.tasks.publish import Publisher
from forgeflow.workspace.manager import WorkspaceManager
from forgeflow_testkit.gitea_emulator import GiteaEmulator

BOT = "ccweb-bot"
REPO = RepoRef("alice", "proj")
ISSUE = ResourceRef(REPO, ResourceKind.ISSUE, 7)
BRANCH = "ccweb/issue-7"


@dataclass
class World:
    emu: GiteaEmulator
    store: Store
    workspace: WorkspaceManager
    publisher: Publisher
    task: Task

    def commit(self, name: str) -> str:
        """A commit by "the agent" in the session's worktree."""
        path = session_worktree(str(self.workspace.root), ISSUE)
        Path(path, name).write_text(name + "\n")
        env = {
            **os.environ,
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_AUTHOR_NAME": "a",
            "GIT_AUTHOR_EMAIL": "a@x",
            "GIT_COMMITTER_NAME": "a",
            "GIT_COMMITTER_EMAIL": "a@x",
        }
        for args in (["add", name], ["commit", "-qm", name], ["rev-parse", "HEAD"]):
            out = subprocess.run(
                ["git", *args], cwd=path, env=env, capture_output=True, text=True, check=True
            )
        return out.stdout.strip()

    def pushed_events(self) -> list[dict[str, Any]]:
        query = audit.AuditQuery(task_id=self.task.task_id, action="publish.pushed")
        rows = self.store.db.read_sync(lambda c: audit.query(c, query))
        return [dict(r.metadata) for r in rows]


def _pushes_to(emu: GiteaEmulator, branch: str) -> int:
    """How many pushes moved ``branch`` on Gitea (its push webhooks, one per push)."""
    return sum(
        1
        for d in emu.deliveries
        if d.event == "push" and d.payload.get("ref") == f"refs/heads/{branch}"
    )


@pytest.fixture
def world(tmp_path: Path, store: Store) -> Iterator[World]:
    with GiteaEmulator(tmp_path / "gitea") as emu:
        token = emu.add_user(BOT)
        emu.add_user("alice")
        info = emu.add_repo("alice", "proj", files={"a.txt": "one\n"})
        emu.set_permission("alice", "proj", BOT, "write")
        emu.add_hook("alice", "proj", url="http://127.0.0.1:9/nowhere", secret="s")
        workspace = WorkspaceManager(tmp_path / "root", token=token)
        root = str(workspace.root)

        async def prepare() -> None:
            checkout = await workspace.prepare_repo(REPO, info["clone_url"], "main")
            await workspace.prepare_session(ISSUE, checkout, default_branch="main")

        asyncio.run(prepare())
        task_id = "gitea-task-publish"
        store.db.write_sync(
            lambda c: (
                repos.register(
                    c,
                    repo=REPO,
                    clone_url=info["clone_url"],
                    default_branch="main",
                    workspace_path=repo_workspace(root, REPO),
                ),
                tasks.insert_received(
                    c,
                    {
                        "task_id": task_id,
                        "delivery_key": "default:d1",
                        "repo_key": REPO.key,
                        "resource_key": ISSUE.key,
                        "session_key": ISSUE.key,
                        "comment_id": 1,
                        "author": "alice",
                        "instruction": "x",
                    },
                ),
            )
        )
        task = store.db.read_sync(lambda c: tasks.get(c, task_id))
        assert task is not None
        yield World(emu, store, workspace, Publisher(store, workspace), task)


def test_a_push_whose_record_a_crash_took_is_found_and_not_repeated(world: World) -> None:
    sha = world.commit("one.txt")
    first = asyncio.run(world.publisher.publish(world.task))
    assert (first.result, first.sha) == ("pushed", sha)
    assert world.emu.branch_sha("alice", "proj", BRANCH) == sha
    assert _pushes_to(world.emu, BRANCH) == 1
    # The crash: the push landed, its result was never written.
    (row,) = world.store.db.read_sync(lambda c: pushes.of_task(c, world.task.task_id))
    world.store.db.write_sync(lambda c: pushes.finish(c, row.push_key, pushes.PENDING))
    again = asyncio.run(world.publisher.publish(world.task))
    assert again.result in ("pushed", "up_to_date")
    (row,) = world.store.db.read_sync(lambda c: pushes.of_task(c, world.task.task_id))
    assert row.status == pushes.PUSHED
    assert _pushes_to(world.emu, BRANCH) == 1  # found on Gitea, not pushed twice
    assert [e["recovered"] for e in world.pushed_events()] == [False, True]


def test_a_push_a_crash_stopped_before_it_ran_is_made_by_the_retry(world: World) -> None:
    sha = world.commit("two.txt")
    # The crash: the intent is written, git push never ran.
    world.store.db.write_sync(
        lambda c: pushes.intend(
            c,
            task_id=world.task.task_id,
            session_key=ISSUE.key,
            target=BRANCH,
            old_sha=None,
            new_sha=sha,
        )
    )
    assert world.emu.branch_sha("alice", "proj", BRANCH) is None
    done = asyncio.run(world.publisher.publish(world.task))
    assert done.result in ("pushed", "up_to_date")
    assert world.emu.branch_sha("alice", "proj", BRANCH) == sha
    assert _pushes_to(world.emu, BRANCH) == 1
    (row,) = world.store.db.read_sync(lambda c: pushes.of_task(c, world.task.task_id))
    assert row.status == pushes.PUSHED


def test_nothing_new_is_nothing_pushed_and_the_default_branch_never_moves(world: World) -> None:
    main = world.emu.branch_sha("alice", "proj", "main")
    outcome = asyncio.run(world.publisher.publish(world.task))
    assert outcome.result == "nothing"
    assert world.emu.branch_sha("alice", "proj", BRANCH) is None
    assert world.store.db.read_sync(lambda c: pushes.of_task(c, world.task.task_id)) == []
    world.commit("three.txt")
    asyncio.run(world.publisher.publish(world.task))
    assert world.emu.branch_sha("alice", "proj", "main") == main


def test_the_mirror_never_pushes_the_default_branch(world: World) -> None:
    sha = world.commit("default.txt")
    asyncio.run(world.publisher.publish(world.task))  # the mirror exists, the commit is in it
    before = world.emu.branch_sha("alice", "proj", "main")
    url = world.store.db.read_sync(lambda c: repos.get(c, REPO.key))
    assert url is not None
    refused = asyncio.run(world.workspace.push(ISSUE.repo, url.clone_url, sha, "main"))
    assert refused == "forgeflow refuses to push to the default branch"
    assert world.emu.branch_sha("alice", "proj", "main") == before != sha
