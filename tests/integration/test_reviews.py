"""A review task's one review, with the store and the Gitea emulator: its line comments
land at their positions, one outside the diff lands in the summary, a review whose
record a crash took is found by its marker and not posted twice, an intent a crash
stopped before its POST is posted from its record, and the agent's second submission
posts nothing. The emulator's reviews API answers as Gitea's pull_review.go does."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sqlalchemy import Connection

from forgeflow.agent.gitea_tools.handlers import ToolRefused
from forgeflow.domain import modes
from forgeflow.domain.bookkeeping import Comment
from forgeflow.domain.ids import RepoRef, ResourceKind, ResourceRef
from forgeflow.domain.markers import MarkerKind, parse_marker
from forgeflow.domain.records import Refs, Task
from forgeflow.domain.reviews import LineComment, ReviewDraft
from forgeflow.domain.states import TaskState
from forgeflow.gitea.client import GiteaClient
from forgeflow.store import Store, repos, tasks
from forgeflow.store import comments as comment_q
from forgeflow.store.details import comments_of
from forgeflow.tasks.review_prompt import ReviewLimits, ReviewPrompts
from forgeflow.tasks.reviews import KIND, PullReviews, Submitted
from forgeflow_testkit.gitea_emulator import GiteaEmulator

BOT = "ccweb-bot"
REPO = RepoRef("acme", "widget")
BASE = "".join(f"line {i}\n" for i in range(1, 41))
HEAD = BASE.replace("line 3\n", "line three\n").replace("line 30\n", "line 30\nline 30b\n")


def review_task(store: Store, task_id: str, pull: ResourceRef, head_sha: str) -> Task:
    """A review task of ``pull`` moved received → running, at ``head_sha``."""

    def create(c: Connection) -> None:
        repos.register(c, repo=REPO, clone_url="", default_branch="main", workspace_path="/w")
        tasks.insert_received(
            c,
            {
                "task_id": task_id,
                "delivery_key": f"default:{task_id}",
                "repo_key": REPO.key,
                "resource_key": pull.key,
                "session_key": pull.key,
                "comment_id": None,
                "author": "alice",
                "instruction": "review",
                "mode": modes.PR_REVIEW,
                "refs": Refs("main", "feature", head_sha, "acme/widget").json(),
            },
        )
        version = 1
        for state in (TaskState.QUEUED, TaskState.PREPARING, TaskState.RUNNING):
            version = tasks.transition(c, tasks.Transition(task_id, state, version)).state_version

    store.db.write_sync(create)
    task = store.db.read_sync(lambda c: tasks.get(c, task_id))
    assert task is not None
    return task


@dataclass
class World:
    emu: GiteaEmulator
    store: Store
    token: str
    pull: ResourceRef
    task: Task

    def submit(self, draft: ReviewDraft) -> Submitted:
        async def go() -> Submitted:
            gitea = GiteaClient(self.emu.url, self.token)
            try:  # a fresh PullReviews: as a new forgeflow process would make the call
                return await PullReviews(self.store, gitea, BOT).submit(self.pull.key, draft)
            finally:
                await gitea.aclose()

        return asyncio.run(go())

    def row(self) -> Comment:
        (row,) = [
            r
            for r in self.store.db.read_sync(lambda c: comments_of(c, self.task.task_id))
            if r.kind == KIND
        ]
        return row

    def reviews(self) -> list[dict[str, Any]]:
        return self.emu.reviews("acme", "widget", self.pull.number)

    def posts(self) -> int:
        return sum(1 for m, p, _s in self.emu.requests if m == "POST" and p.endswith("/reviews"))


@pytest.fixture
def world(tmp_path: Any, store: Store) -> Iterator[World]:
    with GiteaEmulator(tmp_path / "gitea") as emu:
        token = emu.add_user(BOT)
        emu.add_user("alice")
        emu.add_repo("acme", "widget", files={"app.txt": BASE})
        emu.set_permission("acme", "widget", BOT, "admin")
        emu.set_permission("acme", "widget", "alice", "write")
        head = emu.push_branch("acme", "widget", "feature", {"app.txt": HEAD}, pusher="alice")
        number = emu.add_pull("acme", "widget", title="Rename", head="feature", author="alice")
        pull = ResourceRef(REPO, ResourceKind.PULL_REQUEST, number)
        task = review_task(store, "gitea-task-review", pull, head)
        yield World(emu, store, token, pull, task)


DRAFT = ReviewDraft(
    "Two small things.",
    (
        LineComment("app.txt", "new", 3, "Spell it as a digit?", suggestion="line 3"),
        LineComment("app.txt", "old", 3, "This was fine."),
        LineComment("app.txt", "new", 31, "Why a b?"),
        LineComment("app.txt", "new", 15, "Unrelated: far from any hunk."),
    ),
)


def test_one_review_with_its_line_comments_at_their_positions(world: World) -> None:
    done = world.submit(DRAFT)
    assert (done.inline, done.moved, done.again) == (3, ("app.txt:15 (new)",), False)
    (review,) = world.reviews()
    assert review["id"] == done.review_id
    assert review["state"] == "COMMENT" and review["user"]["login"] == BOT
    assert review["commit_id"] == world.task.refs.head_sha  # type: ignore[union-attr]
    positions = [(c["path"], c["position"], c["original_position"]) for c in review["comments"]]
    assert positions == [("app.txt", 3, 0), ("app.txt", 0, 3), ("app.txt", 31, 0)]
    # The emulated Gitea is 1.22: the suggestion is a plain block (1.26 reads the block).
    assert review["comments"][0]["body"].endswith("Suggested replacement:\n\n```\nline 3\n```")
    # The comment outside the diff is in the summary with its location.
    assert "- `app.txt:15 (new)`: Unrelated: far from any hunk." in review["body"]
    marker = parse_marker(review["body"])
    assert marker is not None and marker.kind is MarkerKind.REVIEW
    assert marker.task_id == world.task.task_id
    row = world.row()
    assert (row.status, row.comment_id) == (comment_q.SENT, done.review_id)


def test_a_review_whose_record_a_crash_took_is_found_and_not_posted_again(world: World) -> None:
    first = world.submit(DRAFT)
    # What a kill -9 right after the POST leaves: the intent, pending.
    key = world.row().comment_key
    world.store.db.write_sync(
        lambda c: comment_q.record_result(c, key, status=comment_q.PENDING, comment_id=None)
    )
    again = world.submit(DRAFT)  # the retried turn submits again
    assert again.again and again.review_id == first.review_id
    assert len(world.reviews()) == 1 and world.posts() == 1
    assert world.row().status == comment_q.SENT
    # A second submission in the same task posts nothing either.
    assert world.submit(ReviewDraft("Another opinion.")).again
    assert len(world.reviews()) == 1 and world.posts() == 1


def test_an_intent_a_crash_stopped_before_its_post_is_posted_from_its_record(
    world: World,
) -> None:
    world.emu.fail_next("POST", f"/pulls/{world.pull.number}/reviews", status=500)
    with pytest.raises(Exception, match="500"):
        world.submit(DRAFT)
    assert world.reviews() == [] and world.row().status == comment_q.PENDING
    done = world.submit(ReviewDraft("A different text the retried turn wrote."))
    (review,) = world.reviews()
    assert review["id"] == done.review_id and review["body"].startswith("Two small things.")
    assert len(review["comments"]) == 3


def test_a_moved_head_puts_every_comment_in_the_summary(world: World) -> None:
    world.emu.push_branch("acme", "widget", "feature", {"other.txt": "x\n"}, pusher="alice")
    done = world.submit(DRAFT)
    (review,) = world.reviews()
    assert review["comments"] == [] and len(done.moved) == 4
    assert review["commit_id"] == world.task.refs.head_sha  # type: ignore[union-attr]


def test_no_review_task_running_is_refused(world: World) -> None:
    with pytest.raises(ToolRefused):
        asyncio.run(_submit_elsewhere(world))


async def _submit_elsewhere(world: World) -> None:
    gitea = GiteaClient(world.emu.url, world.token)
    try:
        other = ResourceRef(REPO, ResourceKind.PULL_REQUEST, world.pull.number + 1)
        await PullReviews(world.store, gitea, BOT).submit(other.key, DRAFT)
    finally:
        await gitea.aclose()


def test_the_emulator_answers_as_giteas_pull_review_go(world: World) -> None:
    api = f"{world.emu.url}/api/v1/repos/acme/widget/pulls/{world.pull.number}"
    auth = {"Authorization": f"token {world.token}"}
    empty = httpx.post(f"{api}/reviews", headers=auth, json={"event": "COMMENT", "body": ""})
    assert empty.status_code == 422
    alice = world.emu.add_user("carol")
    world.emu.set_permission("acme", "widget", "carol", "write")
    requested = httpx.post(
        f"{api}/requested_reviewers",
        headers={"Authorization": f"token {alice}"},
        json={"reviewers": [BOT]},
    )
    assert requested.status_code == 201 and requested.json()[0]["state"] == "REQUEST_REVIEW"
    pull = httpx.get(api, headers=auth).json()
    assert [u["login"] for u in pull["requested_reviewers"]] == [BOT]
    made = httpx.post(
        f"{api}/reviews",
        headers=auth,
        json={
            "event": "COMMENT",
            "body": "ok",
            "comments": [{"path": "app.txt", "body": "x", "old_position": 0, "new_position": 3}],
        },
    )
    assert made.status_code == 200, made.text
    review = made.json()
    assert set(review) >= {"id", "user", "state", "body", "commit_id", "comments_count"}
    listed = httpx.get(f"{api}/reviews", headers=auth).json()
    assert [r["state"] for r in listed] == ["COMMENT"]  # the request was consumed
    got = httpx.get(f"{api}/reviews/{review['id']}", headers=auth).json()
    assert got["comments_count"] == 1
    comments = httpx.get(f"{api}/reviews/{review['id']}/comments", headers=auth).json()
    assert comments[0]["position"] == 3 and comments[0]["pull_request_review_id"] == review["id"]
    assert httpx.get(api, headers=auth).json()["requested_reviewers"] is None


def test_a_big_pull_requests_prompt_inlines_what_fits_and_lists_the_rest(world: World) -> None:
    big = "".join(f"generated row {i}\n" for i in range(3000))
    world.emu.push_branch(
        "acme", "widget", "feature", {"yarn.lock": "lock\n", "big.txt": big}, pusher="alice"
    )
    head = world.emu.pull("acme", "widget", world.pull.number)["head"]["sha"]
    task = dataclasses.replace(world.task, refs=Refs("main", "feature", head, "acme/widget"))

    async def plan() -> str:
        gitea = GiteaClient(world.emu.url, world.token)
        try:
            made = await ReviewPrompts(gitea, ReviewLimits(diff_bytes=4_000)).plan(task)
            return made.prompt
        finally:
            await gitea.aclose()

    text = asyncio.run(plan())
    assert "line three" in text  # app.txt's diff fits
    assert "generated row 2999" not in text and "lock\n" not in text.split("Skipped")[0]
    assert "Not inlined (too large for the prompt" in text
    assert "- big.txt (" in text and "- yarn.lock (" in text
    assert f"head commit {head}" in text
    assert "UNTRUSTED pull request diff" in text


def test_a_gitea_that_reads_suggestions_gets_the_suggestion_block(world: World) -> None:
    world.emu.set_version("1.26.1")
    world.submit(DRAFT)
    (review,) = world.reviews()
    assert review["comments"][0]["body"] == "Spell it as a digit?\n\n```suggestion\nline 3\n```"
