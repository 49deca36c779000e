"""Retry policy of ARCHITECTURE §8: bounded attempts with exponential backoff."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retries: int = 1
    base_seconds: float = 5.0
    max_seconds: float = 300.0

    def delay(self, attempt: int) -> timedelta:
        """Backoff before retry number ``attempt`` (1-based): base, 2×base, 4×base, …"""
        seconds = min(self.base_seconds * (2 ** max(attempt - 1, 0)), self.max_seconds)
        return timedelta(seconds=seconds)
