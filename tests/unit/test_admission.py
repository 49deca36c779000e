"""The refusal rules of a mention (domain/admission.py) and the budget rules they use
(domain/budgets.py): decided in the domain, recorded by the store."""

from __future__ import annotations

from datetime import UTC, datetime

from forgeflow.domain.admission import Refusal, admit
from forgeflow.domain.budgets import Budgets, crossed, exceeded, period_starts
from forgeflow.domain.permissions import Permission


def test_permission_comes_first_and_the_budget_is_then_not_counted() -> None:
    counted: list[str] = []

    def over() -> str | None:
        counted.append("counted")
        return "the daily token budget of 10 tokens for a/b"

    refused = admit(permitted=False, over_budget=over)
    assert refused.refusal is Refusal.INSUFFICIENT_PERMISSION and refused.detail is None
    assert counted == []
    over_budget = admit(permitted=True, over_budget=over)
    assert over_budget.refusal is Refusal.BUDGET_EXCEEDED and not over_budget.admitted
    assert over_budget.detail == "over the daily token budget of 10 tokens for a/b"
    assert admit(permitted=True, over_budget=lambda: None).admitted


def test_a_permission_allows_its_own_level_and_below() -> None:
    assert Permission.WRITE.allows(Permission.WRITE)
    assert Permission.ADMIN.allows(Permission.READ)
    assert not Permission.READ.allows(Permission.WRITE)
    assert Permission.NONE.allows(Permission.NONE)


def test_a_repositorys_own_budget_beats_the_default_and_none_is_no_limit() -> None:
    defaults = Budgets(daily_tokens=100, monthly_tokens=None)
    assert defaults.limits(None, None) == {"day": 100, "month": None}
    assert defaults.limits(5, 50) == {"day": 5, "month": 50}


def test_a_budget_is_exceeded_when_its_use_reaches_the_limit() -> None:
    limits = {"day": 100, "month": 1000}
    assert exceeded(limits, {"day": 99, "month": 999}, "a/b") is None
    assert exceeded(limits, {"day": 100, "month": 0}, "a/b") == (
        "the daily token budget of 100 tokens for a/b"
    )
    assert exceeded({"day": None, "month": 10}, {"month": 10}, "a/b") == (
        "the monthly token budget of 10 tokens for a/b"
    )


def test_the_threshold_is_crossed_once_by_the_tokens_that_pass_it() -> None:
    assert crossed(100, 0.8, 79, 80)
    assert not crossed(100, 0.8, 80, 95)
    assert not crossed(100, 0.8, 10, 79)


def test_periods_start_at_midnight_and_on_the_first() -> None:
    starts = period_starts(datetime(2026, 3, 17, 15, 4, 5, tzinfo=UTC))
    assert starts == {
        "day": datetime(2026, 3, 17, tzinfo=UTC),
        "month": datetime(2026, 3, 1, tzinfo=UTC),
    }
