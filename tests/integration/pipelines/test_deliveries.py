"""The delivery log's retention on a real store (SQLite and PostgreSQL): a call prunes
the rows whose ``delivery_retention_days`` ran out, and only those."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from forgeflow.domain.pipeline_records import ArmedTrigger
from forgeflow.pipelines import deliveries
from forgeflow.store import Store
from forgeflow.store import hook_deliveries as dq
from forgeflow.store.pipeline_schema import pipeline_hook_deliveries as log
from forgeflow.store.types import utcnow

NOW = utcnow()
TRIGGER = ArmedTrigger(
    trigger_id="trg-1",
    template_key="p",
    trigger_type="webhook",
    event_type="",
    match=None,
    schedule=None,
    webhook_token="t",
    is_enabled=True,
    last_fired_at=None,
    next_fire_at=None,
    created_at=NOW,
    updated_at=NOW,
    template_enabled=True,
)


def test_a_call_prunes_the_expired_rows(store: Store) -> None:
    call = deliveries.Call(TRIGGER, timedelta(days=30), 10, "idempotency-key:a")
    db = store.db
    old = db.write_sync(lambda c: deliveries.record(c, call, "refused", 401, reason="x"))
    kept = db.write_sync(lambda c: deliveries.record(c, call, "accepted", 202, body={"a": 1}))
    past = utcnow() - timedelta(seconds=1)
    db.write_sync(
        lambda c: c.execute(update(log).where(log.c.delivery_id == old).values(expires_at=past))
    )
    new = db.write_sync(lambda c: deliveries.record(c, call, "duplicate", 200))
    rows, total = db.read_sync(lambda c: dq.page(c, "trg-1", None, 50, 0))
    assert total == 2
    assert {r.delivery_id for r in rows} == {kept, new}
    accepted = db.read_sync(lambda c: dq.get(c, "trg-1", kept))
    assert accepted is not None and accepted.body == {"a": 1}
    assert accepted.expires_at > utcnow() + timedelta(days=29)


def test_a_large_or_refused_body_is_not_kept(store: Store) -> None:
    big = deliveries.Call(TRIGGER, timedelta(days=1), deliveries.BODY_KEPT + 1)
    db = store.db
    a = db.write_sync(lambda c: deliveries.record(c, big, "accepted", 202, body={"a": 1}))
    small = deliveries.Call(TRIGGER, timedelta(days=1), 5)
    r = db.write_sync(lambda c: deliveries.record(c, small, "refused", 400, body={"b": 2}))
    for delivery_id in (a, r):
        row = db.read_sync(lambda c, d=delivery_id: dq.get(c, "trg-1", d))
        assert row is not None and row.body is None
        assert not deliveries.delivery_json(row)["replayable"]
