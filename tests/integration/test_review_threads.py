"""Review threads with the store and the Gitea emulator (#24 item 4): a mention in a
line comment is found in its thread (file, line, hunk, every comment); the agent's
answer goes into that thread, as a one-comment review where Gitea has no reply
endpoint and as a reply where it has; a thread answer whose record a crash took is
found there and not posted again; verification finds the answer in the thread; the
webhooks Gitea sends for a new line comment and for a reply have Gitea's shapes."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from forgeflow.domain.ids import RepoRef, ResourceKind, ResourceRef
from forgeflow.domain.markers import Marker, MarkerKind, append_marker
from forgeflow.domain.records import Task
from forgeflow.gitea import webhook
from forgeflow.gitea.client import GiteaClient
from forgeflow.store import Store
from forgeflow.store import comments as comment_q
from forgeflow.store.details import comments_of
from forgeflow.tasks.replies import Replies
from forgeflow.tasks.threads import ReviewThreads
from forgeflow.tasks.tool_comments import ToolComments
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.running import running_task

BOT = "ccweb-bot"
REPO = RepoRef("acme", "widget")
BASE = "".join(f"line {i}\n" for i in range(1, 41))
HEAD = BASE.replace("line 3\n", "line three\n")
T = TypeVar("T")


@dataclass
class World:
    emu: GiteaEmulator
    store: Store
    token: str
    pull: ResourceRef
    first: int  # alice's line comment that opened the thread
    asked: int  # alice's reply in it that mentions the bot

    def call(self, what: Callable[[GiteaClient, ReviewThreads], Awaitable[T]]) -> T:
        """One call with fresh objects, as a new forgeflow process would make it."""

        async def go() -> T:
            gitea = GiteaClient(self.emu.url, self.token)
            try:
                return await what(gitea, ReviewThreads(gitea, BOT))
            finally:
                await gitea.aclose()

        return asyncio.run(go())

    def task(self, comment_id: int) -> Task:
        return running_task(self.store, "gitea-task-thread", self.pull, comment_id=comment_id)

    def post(self, task: Task, body: str) -> Any:
        return self.call(
            lambda g, t: ToolComments(self.store, g, BOT, t).post(task.session_key, body)
        )

    def thread(self) -> list[dict[str, Any]]:
        return self.emu.thread_comments(self.first)

    def posts(self, suffix: str) -> int:
        return sum(1 for m, p, _s in self.emu.requests if m == "POST" and p.endswith(suffix))


@pytest.fixture
def world(tmp_path: Any, store: Store) -> Iterator[World]:
    with GiteaEmulator(tmp_path / "gitea") as emu:
        token = emu.add_user(BOT)
        emu.add_user("alice")
        emu.add_repo("acme", "widget", files={"app.txt": BASE})
        emu.set_permission("acme", "widget", BOT, "admin")
        emu.set_permission("acme", "widget", "alice", "write")
        emu.push_branch("acme", "widget", "feature", {"app.txt": HEAD}, pusher="alice")
        number = emu.add_pull("acme", "widget", title="Rename", head="feature", author="alice")
        emu.line_comment(
            "acme", "widget", number, path="app.txt", line=3, body="Why the word?", by="alice"
        )
        emu.line_comment(
            "acme", "widget", number, path="app.txt", line=10, body="unrelated", by="alice"
        )
        first = emu.reviews("acme", "widget", number)[0]["comments"][0]
        emu.reply_in_thread(first["id"], body="@ccweb-bot can you make it a digit?", by="alice")
        asked = emu.thread_comments(first["id"])[-1]["id"]
        pull = ResourceRef(REPO, ResourceKind.PULL_REQUEST, number)
        yield World(emu, store, token, pull, first["id"], asked)


def test_a_mention_in_a_reply_is_located_with_its_whole_thread(world: World) -> None:
    task = world.task(world.asked)
    thread = world.call(lambda _g, t: t.locate(task))
    assert thread is not None
    assert (thread.path, thread.line, thread.side) == ("app.txt", 3, "new")
    assert [c.id for c in thread.comments] == [world.first, world.asked]
    assert thread.comments[0].body == "Why the word?"
    assert "+line three" in thread.diff_hunk and thread.diff_hunk.startswith("@@")
    # A plain comment of the pull request is no thread (GET answers it, 200).
    plain = world.emu.post_comment("acme", "widget", world.pull.number, author="alice", body="x")
    other = dataclasses.replace(task, task_id="t2", comment_id=plain["id"])
    assert world.call(lambda _g, t: t.locate(other)) is None


def test_without_the_reply_endpoint_the_answer_is_a_review_on_the_same_line(world: World) -> None:
    task = world.task(world.asked)
    posted = world.post(task, "It is a digit now.")
    assert not posted.again
    thread = world.thread()
    assert [c["user"]["login"] for c in thread] == ["alice", "alice", BOT]
    answer = thread[-1]
    assert (answer["path"], answer["position"], answer["body"]) == (
        "app.txt",
        3,
        "It is a digit now.",
    )
    assert answer["id"] == posted.comment.id
    assert world.posts("/replies") == 1 and world.posts("/reviews") == 1  # 404, then the review
    # Nothing of it in the timeline.
    timeline = world.emu.comments("acme", "widget", world.pull.number)
    assert not [c for c in timeline if c["user"]["login"] == BOT]


def test_with_the_reply_endpoint_the_answer_is_a_reply_in_the_conversation(world: World) -> None:
    world.emu.set_reply_api(True)
    posted = world.post(world.task(world.asked), "Done.")
    answer = world.thread()[-1]
    assert answer["id"] == posted.comment.id and answer["user"]["login"] == BOT
    review_of_first = world.thread()[0]["pull_request_review_id"]
    assert answer["pull_request_review_id"] == review_of_first
    assert world.posts("/reviews") == 0


def test_a_thread_answer_whose_record_a_crash_took_is_found_not_posted_again(world: World) -> None:
    task = world.task(world.asked)
    first = world.post(task, "Once only.")
    (row,) = [
        r
        for r in world.store.db.read_sync(lambda c: comments_of(c, task.task_id))
        if r.kind == comment_q.TOOL_POST
    ]
    world.store.db.write_sync(
        lambda c: comment_q.record_result(
            c, row.comment_key, status=comment_q.PENDING, comment_id=None
        )
    )
    again = world.post(task, "Once only.")
    assert again.again and again.comment.id == first.comment.id
    assert [c["body"] for c in world.thread()].count("Once only.") == 1
    assert world.posts("/reviews") == 1


def test_verification_and_the_fallback_look_and_post_in_the_thread(world: World) -> None:
    task = world.task(world.asked)
    turn = f"{task.task_id}:1"
    marker = Marker(task.task_id, turn, task.resource_key, MarkerKind.FINAL)
    world.post(task, append_marker("The answer.", marker))

    async def marked(gitea: GiteaClient, threads: ReviewThreads) -> list[int]:
        replies = Replies(world.store, gitea, BOT, threads=threads)
        return [c.id for c in await replies.marked(task, {MarkerKind.FINAL}, turn)]

    assert world.call(marked) == [world.thread()[-1]["id"]]

    async def fallback(gitea: GiteaClient, threads: ReviewThreads) -> int | None:
        return await Replies(world.store, gitea, BOT, threads=threads).fallback(task, "t:2", "F.")

    made = world.call(fallback)
    assert made == world.thread()[-1]["id"] and "kind=fallback" in world.thread()[-1]["body"]

    # The receipt stays in the timeline.
    async def receipt(gitea: GiteaClient, threads: ReviewThreads) -> int | None:
        return (await Replies(world.store, gitea, BOT, threads=threads).receipt(task)).comment_id

    rid = world.call(receipt)
    assert rid in [c["id"] for c in world.emu.comments("acme", "widget", world.pull.number)]


def test_the_webhooks_of_a_new_line_comment_and_a_reply_have_giteas_shapes(world: World) -> None:
    world.emu.add_hook("acme", "widget", url="http://127.0.0.1:9/hook", secret="s")
    (new,) = world.emu.line_comment(
        "acme",
        "widget",
        world.pull.number,
        path="app.txt",
        line=5,
        body="@ccweb-bot hi",
        by="alice",
    )
    # HookEventType.Event(): review kinds go out as X-Gitea-Event pull_request_comment.
    assert (new.event, new.event_type) == ("pull_request_comment", "pull_request_review_comment")
    payload = json.loads(new.content)
    assert payload["action"] == "reviewed" and "comment" not in payload
    assert payload["review"] == {"type": "pull_request_review_comment", "content": ""}
    assert payload["sender"]["login"] == "alice"
    (reply,) = world.emu.reply_in_thread(world.first, body="@ccweb-bot and?", by="alice")
    assert reply.event_type == "pull_request_comment"
    comment = json.loads(reply.content)["comment"]
    assert "path" not in comment and "position" not in comment
    pulls = f"/acme/widget/pulls/{world.pull.number}"
    assert comment["html_url"].endswith(f"{pulls}#issuecomment-{comment['id']}")
    event = webhook.normalise_comment("d", reply.event_type, json.loads(reply.content))
    assert event.resource == world.pull and event.comment_id == comment["id"]
    # GET answers 204 for a code comment; the bot's reviewed delivery names it as sender.
    assert world.call(lambda g, _t: g.is_plain_comment("acme", "widget", comment["id"])) is False
