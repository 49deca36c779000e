"""The pieces of the HTTP surface's bounds on their own: JSON depth, the per-address
throttle, value cutting, and the rejection log against a real SQLite store."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from sqlalchemy import select

from forgeflow.api.limits import json_depth
from forgeflow.guard import FailureThrottle, same_secret
from forgeflow.rejections import ACTOR, Rejection, RejectionLog, cut
from forgeflow.store import Store
from forgeflow.store.bookkeeping_schema import audit_events


def test_json_depth_counts_nesting_outside_strings() -> None:
    assert json_depth(b'{"a": [1, {"b": []}]}') == 4
    assert json_depth(json.dumps({"text": "[[[[{{{{", "q": 'x\\"[['}).encode()) == 1
    assert json_depth(b"[" * 500 + b"]" * 500) == 500
    assert json_depth(b"") == 0


def test_same_secret_is_false_for_non_ascii_and_true_for_the_secret() -> None:
    assert same_secret("token-é", "token-e") is False
    assert same_secret(b"\xff\xfe", "token") is False
    assert same_secret("token", "token") is True


def test_the_throttle_refuses_past_the_allowance_until_the_window_passes() -> None:
    throttle = FailureThrottle(allowed=3, window=0.3)
    for _ in range(3):
        assert throttle.retry_after("a") is None
        throttle.failed("a")
    wait = throttle.retry_after("a")
    assert wait is not None and 0 < wait <= 0.3
    assert throttle.retry_after("b") is None  # per address
    time.sleep(0.35)
    assert throttle.retry_after("a") is None
    throttle.failed("a")
    throttle.succeeded("a")
    assert throttle.retry_after("a") is None


def test_cut_keeps_values_short_and_printable() -> None:
    assert cut("x" * 5000) == "x" * 119 + "…"
    assert cut("a\nb\x00c") == "a?b?c"
    assert cut(None) is None


def test_the_rejection_log_writes_one_row_per_interval_then_the_count(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.migrate()
    log = RejectionLog(store, interval=0.5, retention_days=1)

    async def storm() -> None:
        for _ in range(50):
            await log.record(Rejection("webhook.reject", "invalid_signature", "10.0.0.1"))
        await log.record(Rejection("webhook.reject", "invalid_signature", "10.0.0.2"))
        await asyncio.sleep(0.6)
        # The next refusal after the interval writes the count of the last one.
        await log.record(Rejection("webhook.reject", "invalid_signature", "10.0.0.1"))
        await log.flush()

    asyncio.run(storm())
    rows = store.db.read_sync(
        lambda c: c.execute(
            select(audit_events.c.actor, audit_events.c.metadata).order_by(audit_events.c.seq)
        ).all()
    )
    store.close()
    counts = [(r.metadata["source"], r.metadata["count"]) for r in rows]
    assert counts == [("10.0.0.1", 1), ("10.0.0.2", 1), ("10.0.0.1", 49), ("10.0.0.1", 1)]
    assert {r.actor for r in rows} == {ACTOR}
    assert sum(c for _, c in counts) == 52  # every refusal is counted
