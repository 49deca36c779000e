"""Whether a mention becomes a queued task or a rejected one: the refusal rules.

The intake knows the commenter's permission, the store counts the repository's tokens
in the acceptance transaction; this decides, and the store records what it decided.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class Refusal(StrEnum):
    """The spec's error codes of a rejected mention (its task's ``errorCode``)."""

    INSUFFICIENT_PERMISSION = "insufficient_permission"
    BUDGET_EXCEEDED = "budget_exceeded"
    # Not the spec's: a mention whose ``--`` options are unknown or not allowed.
    INVALID_OPTIONS = "invalid_options"


# The refusals answered with a comment (an unauthorised commenter gets none).
ANSWERED = frozenset({Refusal.BUDGET_EXCEEDED, Refusal.INVALID_OPTIONS})


@dataclass(frozen=True, slots=True)
class Admission:
    refusal: Refusal | None = None
    detail: str | None = None  # which budget is used up, for the task's error

    @property
    def admitted(self) -> bool:
        return self.refusal is None


def admit(
    *,
    permitted: bool,
    over_budget: Callable[[], str | None],
    bad_options: Callable[[], str | None] = lambda: None,
) -> Admission:
    """Permission first: a commenter who may not trigger is not told about budgets, and
    the budgets are not counted for them (``over_budget``: the used-up budget, counted
    by the store, or None). Then the mention's options (``bad_options``: what is wrong
    with them and the allowed values, or None), then the budgets."""
    if not permitted:
        return Admission(Refusal.INSUFFICIENT_PERMISSION)
    wrong = bad_options()
    if wrong is not None:
        return Admission(Refusal.INVALID_OPTIONS, wrong)
    over = over_budget()
    if over is not None:
        return Admission(Refusal.BUDGET_EXCEEDED, f"over {over}")
    return Admission()
