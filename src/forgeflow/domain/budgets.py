"""Token budgets per repository and per day/month: the rules, without the counting.

A task's tokens count in the period it was created in, so a long task never moves a
budget backwards. A repository's own budget beats the configured default; ``None``
means no limit. The store counts (store/usage.py); these functions decide.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

Period = Literal["day", "month"]
PERIODS: tuple[Period, ...] = ("day", "month")
_NAMES: dict[Period, str] = {"day": "daily", "month": "monthly"}


@dataclass(frozen=True, slots=True)
class Budgets:
    """Defaults from configuration; ``None`` means no limit."""

    daily_tokens: int | None = None
    monthly_tokens: int | None = None
    threshold: float = 0.8
    price_input_per_mtok: float | None = None
    price_output_per_mtok: float | None = None

    def cost(self, input_tokens: int, output_tokens: int) -> float | None:
        if self.price_input_per_mtok is None and self.price_output_per_mtok is None:
            return None
        return round(
            (
                input_tokens * (self.price_input_per_mtok or 0)
                + output_tokens * (self.price_output_per_mtok or 0)
            )
            / 1_000_000,
            6,
        )

    def limits(self, daily: int | None, monthly: int | None) -> dict[Period, int | None]:
        """A repository's limits: its own budgets (``daily``, ``monthly``) else these."""
        return {
            "day": daily if daily is not None else self.daily_tokens,
            "month": monthly if monthly is not None else self.monthly_tokens,
        }


def period_starts(now: datetime) -> dict[Period, datetime]:
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return {"day": day, "month": day.replace(day=1)}


def exceeded(
    limits: Mapping[Period, int | None], used: Mapping[Period, int], repo_key: str
) -> str | None:
    """The budget that is used up (``the daily token budget of N tokens for r``), or None."""
    for period in PERIODS:
        limit = limits.get(period)
        if limit is not None and used[period] >= limit:
            return f"the {_NAMES[period]} token budget of {limit} tokens for {repo_key}"
    return None


def crossed(limit: int, threshold: float, before: int, after: int) -> bool:
    """Whether adding tokens took the use from ``before`` to ``after`` past the mark."""
    mark = threshold * limit
    return before < mark <= after
