"""A re-review's prompt, with the store, the Gitea emulator and forgeflow's own mirror
(filled by the mirror functions the preparation uses): a later review of the same pull
request carries the earlier review's findings and only the diff since its head; after a
force-push it says so and carries the whole diff; the mirror's diff is git's on
forgeflow's side, refusing a head it does not have."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Connection

from forgeflow.domain.ids import ResourceKind, ResourceRef
from forgeflow.domain.records import Task
from forgeflow.domain.reviews import MAX_DIFF_BYTES as LIMIT
from forgeflow.domain.reviews import ReviewDraft
from forgeflow.domain.states import TaskState
from forgeflow.gitea.client import GiteaClient
from forgeflow.store import Store, tasks
from forgeflow.store import reviews as review_q
from forgeflow.tasks.review_prompt import ReviewLimits, ReviewPrompts
from forgeflow.tasks.reviews import PullReviews
from forgeflow.workspace import mirror
from forgeflow.workspace.git import GitFailed
from forgeflow.workspace.manager import WorkspaceManager
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.integration.test_reviews import BASE, BOT, DRAFT, HEAD, REPO, review_task

NEXT = HEAD.replace("line 20\n", "line twenty\n")
REWRITTEN = BASE.replace("line 5\n", "line five\n")


@dataclass
class World:
    emu: GiteaEmulator
    store: Store
    token: str
    wm: WorkspaceManager
    clone_url: str
    number: int
    first: Task

    def fetch(self) -> str:
        """The pull request's head into the mirror, as a preparation fetches it."""

        async def go() -> str:
            path = self.wm.mirror(REPO)
            await mirror.ensure(self.wm.git, path, self.clone_url, "main")
            return await mirror.fetch_pull(
                self.wm.git, path, self.clone_url, self.clone_url, "feature", self.number
            )

        return asyncio.run(go())

    def task(self, task_id: str, head: str) -> Task:
        return review_task(self.store, task_id, self.first.resource, head)

    def review(self, task: Task, draft: ReviewDraft) -> None:
        """``task`` posts its review and ends (one active task per repository)."""

        async def go() -> None:
            gitea = GiteaClient(self.emu.url, self.token)
            try:
                await PullReviews(self.store, gitea, BOT).post(task, draft)
            finally:
                await gitea.aclose()

        asyncio.run(go())

        def end(c: Connection) -> None:
            version = int(task.state_version)
            for state in (TaskState.VERIFYING_REPLY, TaskState.SUCCEEDED):
                moved = tasks.transition(c, tasks.Transition(task.task_id, state, version))
                version = moved.state_version

        self.store.db.write_sync(end)

    def prompt(self, task: Task) -> str:
        async def go() -> str:
            gitea = GiteaClient(self.emu.url, self.token)
            try:
                prompts = ReviewPrompts(gitea, ReviewLimits(), store=self.store, mirror=self.wm)
                return (await prompts.plan(task)).prompt
            finally:
                await gitea.aclose()

        return asyncio.run(go())


@pytest.fixture
def world(tmp_path: Path, store: Store) -> Iterator[World]:
    with GiteaEmulator(tmp_path / "gitea") as emu:
        token = emu.add_user(BOT)
        emu.add_user("alice")
        info = emu.add_repo("acme", "widget", files={"app.txt": BASE})
        emu.set_permission("acme", "widget", BOT, "admin")
        emu.set_permission("acme", "widget", "alice", "write")
        head = emu.push_branch("acme", "widget", "feature", {"app.txt": HEAD}, pusher="alice")
        number = emu.add_pull("acme", "widget", title="Rename", head="feature", author="alice")
        wm = WorkspaceManager(tmp_path / "root", token=token, gitea_url=emu.url)
        pull = ResourceRef(REPO, ResourceKind.PULL_REQUEST, number)
        first = review_task(store, "gitea-task-first", pull, head)
        w = World(emu, store, token, wm, info["clone_url"], number, first)
        assert w.fetch() == head
        yield w


def test_a_second_review_carries_the_earlier_findings_and_only_the_diff_since(
    world: World,
) -> None:
    # The first review of the pull request: the whole diff, nothing of an earlier one.
    first_prompt = world.prompt(world.first)
    assert "+line three" in first_prompt and "earlier review" not in first_prompt
    world.review(world.first, DRAFT)
    old = world.first.refs.head_sha  # type: ignore[union-attr]
    new = world.emu.push_branch("acme", "widget", "feature", {"app.txt": NEXT}, pusher="alice")
    assert world.fetch() == new
    second = world.task("gitea-task-second", new)
    text = world.prompt(second)
    # The earlier findings, each with its location, the moved one too, fenced.
    assert "UNTRUSTED earlier review" in text
    assert "- `app.txt:3 (new)`: Spell it as a digit?" in text
    assert "- `app.txt:3 (old)`: This was fine." in text
    assert "- `app.txt:15 (new)`: Unrelated: far from any hunk." in text
    assert f"at commit {old}" in text and "which of the earlier review's findings" in text
    # Only the diff since: the new change, not the first commit's.
    assert f"git diff {old} {new}" in text
    assert "+line twenty" in text and "-line 20" in text
    assert "+line three" not in text and "+line 30b" not in text
    assert "UNTRUSTED diff since the earlier review" in text
    assert "call submit_review once" in text


def test_after_a_force_push_the_whole_diff_and_why(world: World) -> None:
    world.review(world.first, DRAFT)
    old = world.first.refs.head_sha  # type: ignore[union-attr]
    new = world.emu.push_branch(
        "acme", "widget", "feature", {"app.txt": REWRITTEN}, pusher="alice", force=True
    )
    assert world.fetch() == new
    text = world.prompt(world.task("gitea-task-forced", new))
    assert f"{old} is not an ancestor of the head {new}" in text
    assert "- `app.txt:3 (new)`: Spell it as a digit?" in text  # still the findings
    assert "+line five" in text and "+line three" not in text  # the whole (new) diff
    assert "UNTRUSTED pull request diff" in text


def test_the_same_head_again_carries_the_whole_diff(world: World) -> None:
    world.review(world.first, DRAFT)
    head = world.first.refs.head_sha  # type: ignore[union-attr]
    text = world.prompt(world.task("gitea-task-again", head))
    assert f"The head {head} has not moved since the earlier review" in text
    assert "+line three" in text


def test_the_earlier_review_is_the_last_one_posted_in_another_task(world: World) -> None:
    world.review(world.first, DRAFT)
    read = world.store.db.read_sync
    key = world.first.resource_key
    found = read(lambda c: review_q.last_posted(c, key, other_than="gitea-task-other"))
    assert found is not None and found.task_id == world.first.task_id
    assert found.record is not None and found.record.moved[0].location == "app.txt:15 (new)"
    # A retried task's own review is no earlier one.
    assert read(lambda c: review_q.last_posted(c, key, other_than=world.first.task_id)) is None
    (listed,) = read(lambda c: review_q.of_resource(c, key))
    assert listed.posted and len(listed.record.comments) == 3  # type: ignore[union-attr]


def test_the_mirrors_diff_since_needs_both_commits_and_ancestry(world: World) -> None:
    old = world.first.refs.head_sha  # type: ignore[union-attr]
    new = world.emu.push_branch("acme", "widget", "feature", {"app.txt": NEXT}, pusher="alice")
    diff = asyncio.run(world.wm.diff_since(REPO, old, old, limit=LIMIT))
    assert diff == ""
    with pytest.raises(GitFailed, match="not in the mirror"):
        asyncio.run(world.wm.diff_since(REPO, old, new, limit=LIMIT))  # not fetched yet
    world.fetch()
    assert "+line twenty" in (asyncio.run(world.wm.diff_since(REPO, old, new, limit=LIMIT)) or "")
    assert asyncio.run(world.wm.diff_since(REPO, new, old, limit=LIMIT)) is None  # not an ancestor
    assert asyncio.run(world.wm.diff_since(REPO, "9" * 40, new, limit=LIMIT)) is None  # never seen
    with pytest.raises(GitFailed, match="not a commit id"):
        asyncio.run(world.wm.diff_since(REPO, "HEAD~1", new, limit=LIMIT))
    # Read no further than the limit: git is ended there (its output is any size).
    cut = asyncio.run(world.wm.diff_since(REPO, old, new, limit=100))
    assert cut is not None and len(cut) == 100
