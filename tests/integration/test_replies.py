"""Exactly-once comments: a crash between the POST and its record never posts twice."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from forgeflow.domain.bookkeeping import Comment
from forgeflow.domain.ids import RepoRef, ResourceKind, ResourceRef
from forgeflow.domain.records import Task
from forgeflow.gitea.client import GiteaClient, GiteaError
from forgeflow.store import Store, acceptance, task_reads, workers
from forgeflow.store import comments as comment_q
from forgeflow.store.bookkeeping_schema import comments
from forgeflow.store.types import utcnow
from forgeflow.tasks.replies import Replies
from forgeflow.tasks.verify import Found, look
from forgeflow_testkit.gitea_emulator import GiteaEmulator

BOT = "ccweb-bot"


@pytest.fixture
def setup(tmp_path: Path, store: Store) -> Iterator[tuple[GiteaEmulator, str, Task]]:
    with GiteaEmulator(tmp_path / "git") as gitea:
        token = gitea.add_user(BOT)
        gitea.add_user("alice")
        gitea.add_repo("acme", "widget")
        gitea.set_permission("acme", "widget", BOT, "admin")
        gitea.set_permission("acme", "widget", "alice", "write")
        issue = gitea.add_issue("acme", "widget", title="t", author="alice")
        resource = ResourceRef(RepoRef("acme", "widget"), ResourceKind.ISSUE, issue)
        store.db.write_sync(
            lambda c: acceptance.accept(
                c,
                acceptance.Accept(
                    delivery_key="default:d1",
                    delivery_id="d1",
                    event_type="issue_comment",
                    payload_hash="sha256:x",
                    retention=timedelta(days=1),
                    resource=resource,
                    clone_url="",
                    default_branch="main",
                    workspace_path="/w",
                    comment_id=1,
                    author="alice",
                    instruction="go",
                    refs=None,
                    permitted=True,
                    permission="write",
                ),
            )
        )
        task = store.db.read_sync(lambda c: task_reads.list_page(c, task_reads.TaskFilter())[0][0])
        yield gitea, token, task


def _bot_comments(gitea: GiteaEmulator, task: Task) -> list[dict[str, Any]]:
    number = int(task.resource_key.rsplit(":", 1)[1])
    return [c for c in gitea.comments("acme", "widget", number) if c["user"]["login"] == BOT]


def _forget_the_record(store: Store) -> None:
    """What a kill -9 right after the POST leaves: the intent, pending, with no result."""
    store.db.write_sync(
        lambda c: c.execute(
            update(comments).values(
                status="pending", comment_id=None, updated_at=utcnow() - timedelta(minutes=5)
            )
        )
    )


def test_receipt_after_a_crash_between_post_and_record_is_not_posted_again(
    setup: tuple[GiteaEmulator, str, Task], store: Store
) -> None:
    gitea, token, task = setup

    async def scenario() -> tuple[int | None, int | None]:
        client = GiteaClient(gitea.url, token)
        replies = Replies(store, client, BOT)
        try:
            first = await replies.receipt(task)
            _forget_the_record(store)
            second = await replies.receipt(task)
            return first.comment_id, second.comment_id
        finally:
            await client.aclose()

    first, second = asyncio.run(scenario())
    assert first is not None and first == second
    assert len(_bot_comments(gitea, task)) == 1


def test_a_deferred_receipt_record_is_written_by_its_caller_or_found_after_a_crash(
    setup: tuple[GiteaEmulator, str, Task], store: Store
) -> None:
    """The preparing step writes the receipt's record with its move to running; a crash
    before that move leaves the intent pending, and the next attempt finds the comment."""
    gitea, token, task = setup
    key = f"{task.task_id}:receipt"

    def row() -> Comment:
        found = store.db.read_sync(lambda c: comment_q.get(c, key))
        assert found is not None
        return found

    async def scenario() -> tuple[int | None, int | None, int | None]:
        client = GiteaClient(gitea.url, token)
        replies = Replies(store, client, BOT)
        try:
            posted = await replies.receipt(task, defer=True)
            assert posted.record is not None and row().status == "pending"
            # The caller's commit carries it: sent, with the time of the POST.
            store.db.write_sync(posted.record)
            assert row().status == "sent" and row().comment_id == posted.comment_id
            again = await replies.receipt(task)  # already sent: nothing is posted
            assert again.record is None
            # A crash between the POST and the caller's commit: the record is lost.
            _forget_the_record(store)
            after_crash = await replies.receipt(task, defer=True)
            return posted.comment_id, again.comment_id, after_crash.comment_id
        finally:
            await client.aclose()

    posted, again, after_crash = asyncio.run(scenario())
    assert posted is not None and posted == again == after_crash
    assert len(_bot_comments(gitea, task)) == 1
    assert row().status == "sent"


def test_a_fresh_intent_of_another_poster_is_left_alone(
    setup: tuple[GiteaEmulator, str, Task], store: Store
) -> None:
    gitea, token, task = setup

    async def scenario() -> int | None:
        client = GiteaClient(gitea.url, token)
        replies = Replies(store, client, BOT)
        try:
            gitea.fail_next("POST", r"/comments$", status=500)
            with pytest.raises(GiteaError):
                await replies.receipt(task)
            # The failed POST aged its intent, so the next poster may take it over.
            return (await replies.receipt(task)).comment_id
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) is not None
    assert len(_bot_comments(gitea, task)) == 1


def test_verifier_ambiguity_is_unknown(
    setup: tuple[GiteaEmulator, str, Task], store: Store
) -> None:
    gitea, token, task = setup
    number = int(task.resource_key.rsplit(":", 1)[1])
    marker = (
        f"<!-- ccweb taskId={task.task_id} turnKey={task.task_id}:1 "
        f"resourceKey={task.resource_key} kind=final -->"
    )

    async def verify() -> Found:
        client = GiteaClient(gitea.url, token)
        try:
            return (await look(Replies(store, client, BOT), task, f"{task.task_id}:1")).result
        finally:
            await client.aclose()

    assert asyncio.run(verify()) is Found.MISSING
    gitea.post_comment("acme", "widget", number, author="alice", body=f"forged\n\n{marker}")
    assert asyncio.run(verify()) is Found.MISSING  # not the bot's: ignored
    gitea.post_comment("acme", "widget", number, author=BOT, body=f"answer\n\n{marker}")
    assert asyncio.run(verify()) is Found.FOUND
    gitea.post_comment("acme", "widget", number, author=BOT, body=f"again\n\n{marker}")
    assert asyncio.run(verify()) is Found.UNKNOWN


TTL = timedelta(seconds=30)


def _intent_of_a_process_then_killed(store: Store, task: dict[str, Any]) -> None:
    """What kill -9 leaves when it lands between a receipt's intent and its POST."""
    store.db.write_sync(
        lambda c: comment_q.record_intent(
            c,
            comment_key=f"{task.task_id}:receipt",
            task_id=task.task_id,
            kind="receipt",
            resource_key=task.resource_key,
            turn_key=f"{task.task_id}:0",
            body_hash="sha256:x",
        )
    )


def _worker_starts(store: Store, worker_id: str = "w1") -> None:
    store.db.write_sync(
        lambda c: workers.register(
            c, worker_id=worker_id, owner=f"{worker_id}/{utcnow().timestamp()}", host="h", pid=1
        )
    )


def _receipt_after_restart(
    gitea: GiteaEmulator, token: str, store: Store, task: dict[str, Any], *, wait: bool
) -> tuple[int | None, float]:
    async def scenario() -> tuple[int | None, float]:
        client = GiteaClient(gitea.url, token)
        replies = Replies(store, client, BOT, workers_ttl=TTL)
        started = asyncio.get_running_loop().time()
        try:
            posted = await replies.receipt(task, wait_in_flight=wait)
            return posted.comment_id, asyncio.get_running_loop().time() - started
        finally:
            await client.aclose()

    return asyncio.run(scenario())


def test_a_receipt_whose_poster_was_killed_before_the_post_is_posted_by_the_restart(
    setup: tuple[GiteaEmulator, str, Task], store: Store
) -> None:
    """The lost receipt of a kill -9: the intent was fresh, the restarted worker left it
    to its (dead) poster for IN_FLIGHT, and a task that ended sooner had no receipt."""
    gitea, token, task = setup
    _intent_of_a_process_then_killed(store, task)
    _worker_starts(store)  # the restart: no live worker existed when the intent was written
    for wait in (False, True):  # the outbox does not wait, a preparation does
        posted, took = _receipt_after_restart(gitea, token, store, task, wait=wait)
        assert posted is not None and took < 5.0
    assert [c["id"] for c in _bot_comments(gitea, task)] == [posted]
    row = store.db.read_sync(lambda c: comment_q.get(c, f"{task.task_id}:receipt"))
    assert row is not None and row.status == "sent" and row.comment_id == posted


def test_a_receipt_posted_just_before_a_kill_is_found_not_posted_again(
    setup: tuple[GiteaEmulator, str, Task], store: Store
) -> None:
    gitea, token, task = setup

    async def post_then_die() -> int | None:
        client = GiteaClient(gitea.url, token)
        try:  # the record was to go with the next commit, which the kill prevented
            posted = await Replies(store, client, BOT).receipt(task, defer=True)
            return posted.comment_id
        finally:
            await client.aclose()

    first = asyncio.run(post_then_die())
    _worker_starts(store)
    again, took = _receipt_after_restart(gitea, token, store, task, wait=True)
    assert first is not None and again == first and took < 5.0
    assert len(_bot_comments(gitea, task)) == 1


def test_a_fresh_intent_of_a_live_worker_is_not_taken_over(
    setup: tuple[GiteaEmulator, str, Task], store: Store
) -> None:
    """A worker that was already running when the intent was written may be posting it
    right now: it is left to it (until IN_FLIGHT), nothing is posted a second time."""
    gitea, token, task = setup
    _worker_starts(store, "w-old")
    _intent_of_a_process_then_killed(store, task)
    posted, _took = _receipt_after_restart(gitea, token, store, task, wait=False)
    assert posted is None and _bot_comments(gitea, task) == []
