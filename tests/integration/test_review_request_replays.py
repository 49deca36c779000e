"""A review request's replay is one task even when both deliveries are accepted at the
same instant (#24): the accepted delivery of a review request is unique by its payload
(``ux_webhook_deliveries_by_payload``), so the second transaction waits for the
first and answers with its task. On SQLite writes are serial; the race is PostgreSQL's,
and this test holds the first transaction open while the second runs."""

from __future__ import annotations

import threading
from datetime import timedelta

from sqlalchemy import Connection, func, select

from forgeflow.domain.ids import RepoRef, ResourceKind, ResourceRef
from forgeflow.domain.intake import DeliveryRecord
from forgeflow.store import Store, acceptance
from forgeflow.store.schema import tasks, webhook_deliveries

PULL = ResourceRef(RepoRef("acme", "widget"), ResourceKind.PULL_REQUEST, 4)


def _request(delivery: str, payload_hash: str = "sha256:same") -> acceptance.Accept:
    return acceptance.Accept(
        delivery_key=f"default:{delivery}",
        delivery_id=delivery,
        event_type="pull_request_review_request",
        payload_hash=payload_hash,
        retention=timedelta(days=1),
        resource=PULL,
        clone_url="",
        default_branch="main",
        workspace_path="/w",
        comment_id=None,
        author="alice",
        instruction="review",
        refs=None,
        permitted=True,
        permission="write",
        mode="pr_review",
        replay_by_payload=True,
    )


def test_two_replays_accepted_at_the_same_instant_make_one_task(store: Store) -> None:
    # An earlier request: the repository is known, so its row locks nothing below.
    store.db.write_sync(lambda c: acceptance.accept(c, _request("d0", "sha256:earlier")))
    first_in, go_on = threading.Event(), threading.Event()
    records: dict[str, DeliveryRecord] = {}

    def held(conn: Connection) -> DeliveryRecord:
        record = acceptance.accept(conn, _request("d1"))
        first_in.set()
        go_on.wait(10)  # the transaction stays open while the replay runs
        return record

    def first() -> None:
        records["d1"] = store.db.write_sync(held)

    def second() -> None:
        records["d2"] = store.db.write_sync(lambda c: acceptance.accept(c, _request("d2")))

    one = threading.Thread(target=first)
    one.start()
    assert first_in.wait(10)
    two = threading.Thread(target=second)
    two.start()
    two.join(1.0)  # on PostgreSQL it waits for the first; on SQLite for the writer
    go_on.set()
    one.join(10)
    two.join(10)
    assert records["d1"].status == "accepted" and records["d1"].task_id
    assert records["d2"].duplicate and records["d2"].task_id == records["d1"].task_id
    assert records["d2"].reason == "request_already_accepted"
    count = store.db.read_sync(lambda c: c.execute(select(func.count()).select_from(tasks)))
    assert count.scalar_one() == 2  # d0's and d1's
    statuses = store.db.read_sync(
        lambda c: dict(
            c.execute(select(webhook_deliveries.c.delivery_id, webhook_deliveries.c.status)).all()
        )
    )
    assert statuses == {"d0": "accepted", "d1": "accepted", "d2": "duplicate"}


def test_another_request_of_the_same_pull_request_is_a_task_of_its_own(store: Store) -> None:
    a = store.db.write_sync(lambda c: acceptance.accept(c, _request("d1", "sha256:one")))
    b = store.db.write_sync(lambda c: acceptance.accept(c, _request("d2", "sha256:two")))
    assert not b.duplicate and b.task_id and b.task_id != a.task_id
