"""When a schedule trigger fires next (pure). Times are UTC.

``every:<seconds>`` keeps its cadence from the first fire time; a cron expression
(five fields, or ``@daily`` and friends, by croniter) is evaluated in UTC. After
downtime a schedule fires once for everything it missed, then goes on from the first
slot after now — never N catch-up runs.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from croniter import croniter  # type: ignore[import-untyped]


class InvalidSchedule(ValueError):
    code = "invalid_schedule"


def interval_of(schedule: str) -> float | None:
    """The seconds of an ``every:<seconds>`` schedule; None for a cron expression."""
    if not schedule.startswith("every:"):
        return None
    rest = schedule.removeprefix("every:")
    if not rest.isdigit() or int(rest) <= 0:
        raise InvalidSchedule(f"{schedule!r}: every:<seconds> takes a positive whole number")
    return float(rest)


def next_fire(schedule: str, *, now: datetime, due: datetime | None = None) -> datetime:
    """The next fire time after ``now``.

    ``due`` is the fire time being consumed (None when the schedule is new or enabled
    again): an interval then keeps its cadence, ``due + k·interval`` for the smallest
    ``k`` that lies after ``now``; a new interval schedule first fires one interval
    from now.
    """
    seconds = interval_of(schedule)
    if seconds is not None:
        if due is None:
            return now + timedelta(seconds=seconds)
        missed = max(0, math.floor((now - due).total_seconds() / seconds))
        return due + timedelta(seconds=seconds * (missed + 1))
    if not croniter.is_valid(schedule):
        raise InvalidSchedule(f"{schedule!r} is not 'every:<seconds>' or a cron expression")
    value: datetime = croniter(schedule, now).get_next(datetime)
    return value
