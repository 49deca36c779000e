"""A request for the bot's review delivered again: Gitea's replay (the same payload
under a new delivery id) is answered as a replayed mention is — a duplicate with the
first delivery's task, no second task — while a later request of the same reviewer
(Gitea moved the pull request's updated_at) is a request of its own."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import func, select

from forgeflow.store.bookkeeping_schema import audit_events
from forgeflow.store.schema import tasks, webhook_deliveries
from tests.support.world import BOT, World


def _count(world: World, table: Any, *where: Any) -> int:
    return int(
        world.ff.services.store.db.read_sync(
            lambda c: c.execute(select(func.count()).select_from(table).where(*where)).scalar_one()
        )
    )


def _review_tasks(world: World) -> int:
    return _count(world, tasks, tasks.c.mode == "pr_review")


def test_a_replayed_review_request_makes_no_second_task(world: World) -> None:
    gitea = world.gitea
    (first,) = gitea.request_review("acme", "widget", world.pull, reviewer=BOT, by="alice")
    assert first.status_code == 202, first.response
    task_id = json.loads(first.response)["taskId"]
    replay = gitea.redeliver(first)  # Gitea's "Replay": same bytes, a new delivery UUID
    assert replay.delivery_id != first.delivery_id and replay.content == first.content
    answer = json.loads(replay.response)
    assert replay.status_code == 200, replay.response
    assert (answer["status"], answer["reason"], answer["taskId"]) == (
        "duplicate",
        "request_already_accepted",
        task_id,
    )
    assert _review_tasks(world) == 1
    duplicate = webhook_deliveries.c.status == "duplicate"
    assert _count(world, webhook_deliveries, duplicate) == 1
    audited = audit_events.c.action == "webhook.duplicate"
    assert _count(world, audit_events, audited, audit_events.c.task_id == task_id) == 1
    # The same delivery id again (a network-level repeat) is answered from its record.
    same = gitea.redeliver(first, new_id=False)
    again = json.loads(same.response)
    assert (again["status"], again["originalStatus"], again["taskId"]) == (
        "duplicate",
        "accepted",
        task_id,
    )
    assert _review_tasks(world) == 1


def test_a_later_request_of_the_same_reviewer_is_a_new_one(world: World) -> None:
    gitea = world.gitea
    (first,) = gitea.request_review("acme", "widget", world.pull, reviewer=BOT, by="alice")
    gitea.advance_clock(5)  # Gitea's timestamps have a one-second resolution
    (second,) = gitea.request_review("acme", "widget", world.pull, reviewer=BOT, by="alice")
    assert (
        first.payload["pull_request"]["updated_at"] != second.payload["pull_request"]["updated_at"]
    )
    assert (first.status_code, second.status_code) == (202, 202), second.response
    assert json.loads(first.response)["taskId"] != json.loads(second.response)["taskId"]
    assert _review_tasks(world) == 2
