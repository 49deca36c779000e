"""The agent's comments through its Gitea tools, exactly once, with the store and the
Gitea emulator: a post or an edit whose record a crash took is found on Gitea and not
repeated; one a crash stopped before it ran is made by the retry; the edit rule reads
the records, so it holds for a new process (a restart) and only for the session's own
tool comments."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from forgeflow.agent.gitea_tools import Posted
from forgeflow.agent.gitea_tools.handlers import ToolRefused
from forgeflow.domain.bookkeeping import Comment
from forgeflow.domain.ids import RepoRef, ResourceKind, ResourceRef, sha256_ref
from forgeflow.domain.records import Task
from forgeflow.gitea.client import GiteaClient, GiteaError
from forgeflow.gitea.models import Comment as GiteaComment
from forgeflow.store import Store
from forgeflow.store import comments as comment_q
from forgeflow.store.details import comments_of
from forgeflow.tasks.tool_comments import ToolComments
from forgeflow_testkit.gitea_emulator import GiteaEmulator
from tests.support.running import running_task

BOT = "ccweb-bot"
REPO = RepoRef("acme", "widget")


@dataclass
class World:
    emu: GiteaEmulator
    store: Store
    token: str
    issue: ResourceRef
    task: Task

    def run(self, call: Any) -> Any:
        """One call on a fresh ToolComments, as a new forgeflow process would make it."""

        async def go() -> Any:
            gitea = GiteaClient(self.emu.url, self.token)
            try:
                return await call(ToolComments(self.store, gitea, BOT))
            finally:
                await gitea.aclose()

        return asyncio.run(go())

    def post(self, body: str, session: str | None = None) -> Posted:
        posted: Posted = self.run(lambda t: t.post(session or self.issue.key, body))
        return posted

    def edit(self, comment_id: int, body: str) -> GiteaComment:
        edited: GiteaComment = self.run(lambda t: t.edit(self.issue.key, comment_id, body))
        return edited

    def rows(self, kind: str) -> list[Comment]:
        found = self.store.db.read_sync(lambda c: comments_of(c, self.task.task_id))
        return [r for r in found if r.kind == kind]

    def lose_result(self, row: Comment) -> None:
        """What a kill -9 right after the POST or PATCH leaves: the intent, pending."""
        self.store.db.write_sync(
            lambda c: comment_q.record_result(
                c, row.comment_key, status=comment_q.PENDING, comment_id=None
            )
        )

    def calls(self, method: str, suffix: str) -> int:
        return sum(1 for m, p, _s in self.emu.requests if m == method and p.endswith(suffix))


@pytest.fixture
def world(tmp_path: Any, store: Store) -> Iterator[World]:
    with GiteaEmulator(tmp_path / "gitea") as emu:
        token = emu.add_user(BOT)
        emu.add_user("alice")
        emu.add_repo("acme", "widget")
        emu.set_permission("acme", "widget", BOT, "admin")
        emu.set_permission("acme", "widget", "alice", "write")
        number = emu.add_issue("acme", "widget", title="t", author="alice")
        issue = ResourceRef(REPO, ResourceKind.ISSUE, number)
        yield World(emu, store, token, issue, running_task(store, "gitea-task-tools", issue))


def _bodies(world: World) -> list[str]:
    comments = world.emu.comments("acme", "widget", world.issue.number)
    return [c["body"] for c in comments if c["user"]["login"] == BOT]


def test_a_post_whose_record_a_crash_took_is_found_and_not_posted_again(world: World) -> None:
    first = world.post("Looking into it.")
    assert not first.again
    (row,) = world.rows(comment_q.TOOL_POST)
    assert (row.status, row.comment_id) == (comment_q.SENT, first.comment.id)
    assert row.body_hash == sha256_ref(b"Looking into it.")
    world.lose_result(row)
    again = world.post("Looking into it.")  # the retried turn posts the same text
    assert again.again and again.comment.id == first.comment.id
    assert _bodies(world) == ["Looking into it."]
    assert world.calls("POST", "/comments") == 1
    (row,) = world.rows(comment_q.TOOL_POST)
    assert (row.status, row.comment_id) == (comment_q.SENT, first.comment.id)
    # Recorded now: the same text once more is answered from the record.
    assert world.post("Looking into it.").comment.id == first.comment.id
    assert world.calls("POST", "/comments") == 1


def test_a_post_a_crash_stopped_before_it_ran_is_made_by_the_retry(world: World) -> None:
    body = "Working on it."
    world.store.db.write_sync(
        lambda c: comment_q.record_intent(
            c,
            comment_key=comment_q.tool_post_key(world.task.task_id, body),
            task_id=world.task.task_id,
            kind=comment_q.TOOL_POST,
            resource_key=world.issue.key,
            turn_key=None,
            body_hash=sha256_ref(body.encode()),
        )
    )
    posted = world.post(body)
    assert not posted.again
    assert _bodies(world) == [body]
    (row,) = world.rows(comment_q.TOOL_POST)
    assert (row.status, row.comment_id) == (comment_q.SENT, posted.comment.id)


def test_an_edit_whose_record_a_crash_took_is_not_patched_again(world: World) -> None:
    posted = world.post("Looking into it.")
    world.edit(posted.comment.id, "Looked into it.")
    assert world.calls("PATCH", f"/comments/{posted.comment.id}") == 1
    (row,) = world.rows(comment_q.TOOL_EDIT)
    assert (row.status, row.comment_id) == (comment_q.SENT, posted.comment.id)
    world.lose_result(row)
    again = world.edit(posted.comment.id, "Looked into it.")
    assert again.body == "Looked into it."
    assert world.calls("PATCH", f"/comments/{posted.comment.id}") == 1  # found, not redone
    (row,) = world.rows(comment_q.TOOL_EDIT)
    assert (row.status, row.comment_id) == (comment_q.SENT, posted.comment.id)
    # A text set again after another one is a new change: it is made.
    world.edit(posted.comment.id, "Fixed.")
    world.edit(posted.comment.id, "Looked into it.")
    assert world.calls("PATCH", f"/comments/{posted.comment.id}") == 3
    assert _bodies(world) == ["Looked into it."]


def test_the_edit_rule_reads_the_records_of_the_session(world: World) -> None:
    mine = world.post("Looking into it.")
    # A new process (a restart) may edit it: the rule is the store's, not a process's.
    assert world.edit(mine.comment.id, "Looked into it.").body == "Looked into it."
    # The bot's comment not posted through the tools (a receipt), a user's, and one the
    # tools posted in another session's task: refused, and Gitea is not asked to edit.
    gitea = world.emu
    receipt = gitea.post_comment("acme", "widget", world.issue.number, author=BOT, body="r")
    users = gitea.post_comment("acme", "widget", world.issue.number, author="alice", body="u")
    # (Another repository's: one task at a time runs per repository.)
    gitea.add_repo("acme", "gadget")
    gitea.set_permission("acme", "gadget", BOT, "admin")
    number = gitea.add_issue("acme", "gadget", title="o", author=BOT)
    other_issue = ResourceRef(RepoRef("acme", "gadget"), ResourceKind.ISSUE, number)
    running_task(world.store, "gitea-task-other", other_issue)
    theirs = world.post("Elsewhere.", session=other_issue.key)
    for comment_id in (receipt["id"], users["id"], theirs.comment.id):
        with pytest.raises(ToolRefused, match=f"comment {comment_id} was not posted by you"):
            world.edit(comment_id, "hijack")
    assert world.calls("PATCH", "") == 1


def test_a_post_whose_record_a_crash_took_can_still_be_edited(world: World) -> None:
    posted = world.post("Looking into it.")
    (row,) = world.rows(comment_q.TOOL_POST)
    world.lose_result(row)
    # The rule settles the session's pending posts by looking before it refuses.
    assert world.edit(posted.comment.id, "Looked into it.").body == "Looked into it."
    (row,) = world.rows(comment_q.TOOL_POST)
    assert (row.status, row.comment_id) == (comment_q.SENT, posted.comment.id)


def test_no_running_turn_no_comment(world: World) -> None:
    with pytest.raises(ToolRefused, match="no turn of this session is running"):
        world.post("hello", session=ResourceRef(REPO, ResourceKind.ISSUE, 99).key)
    assert world.calls("POST", "/comments") == 0


def test_a_post_gitea_failed_is_looked_for_then_made_by_the_next_call(world: World) -> None:
    world.emu.fail_next("POST", r"/comments$", status=500)
    with pytest.raises(GiteaError):
        world.post("Looking into it.")
    (row,) = world.rows(comment_q.TOOL_POST)
    assert (row.status, row.comment_id) == (comment_q.PENDING, None)  # it may have landed
    lists = world.calls("GET", "/comments")
    posted = world.post("Looking into it.")
    assert not posted.again and _bodies(world) == ["Looking into it."]
    assert world.calls("GET", "/comments") == lists + 1  # looked before posting
    (row,) = world.rows(comment_q.TOOL_POST)
    assert (row.status, row.comment_id) == (comment_q.SENT, posted.comment.id)
