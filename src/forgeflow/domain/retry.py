"""How often and when a task's work is tried again after it failed or was interrupted.

A failure of the task's own work (a clone, a turn, the agent's runtime) and an
interruption by a restart are both tried again after a backoff, a bounded number of
times; after that the task fails. The one rule is :meth:`RetryPolicy.next_try`, used by
a run's own failures and by restart recovery alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True, slots=True)
class Retry:
    attempt: int  # which retry this is, 1-based (the task's ``attempt`` column)
    at: datetime  # when it may start


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retries: int = 1
    base_seconds: float = 5.0
    max_seconds: float = 300.0

    def delay(self, attempt: int) -> timedelta:
        """Backoff before retry number ``attempt`` (1-based): base, 2×base, 4×base, …"""
        seconds = min(self.base_seconds * (2 ** max(attempt - 1, 0)), self.max_seconds)
        return timedelta(seconds=seconds)

    def next_try(self, retried: int, now: datetime) -> Retry | None:
        """After a failed try of a task that was retried ``retried`` times already: its
        next retry, or None when its retries are spent and the task fails."""
        attempt = retried + 1
        if attempt > self.max_retries:
            return None
        return Retry(attempt, now + self.delay(attempt))
