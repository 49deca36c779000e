"""The one retry rule: bounded retries with exponential backoff, then the task fails."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from forgeflow.domain.retry import Retry, RetryPolicy

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_retries_back_off_until_they_are_spent() -> None:
    policy = RetryPolicy(max_retries=3, base_seconds=5.0, max_seconds=12.0)
    assert policy.next_try(0, NOW) == Retry(1, NOW + timedelta(seconds=5))
    assert policy.next_try(1, NOW) == Retry(2, NOW + timedelta(seconds=10))
    assert policy.next_try(2, NOW) == Retry(3, NOW + timedelta(seconds=12))  # capped
    assert policy.next_try(3, NOW) is None


def test_no_retries_fails_at_once() -> None:
    assert RetryPolicy(max_retries=0).next_try(0, NOW) is None
