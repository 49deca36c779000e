"""Token use and budgets per repository (issue: "budgets per repository and per day/month").

A task's tokens count in the period it was created in, so a long task never moves a
budget backwards. Budgets come from the repository row, else from the configuration.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, select, update

from forgeflow.domain.records import Repository
from forgeflow.store import audit, events
from forgeflow.store.schema import repositories, sessions, tasks
from forgeflow.store.types import utcnow


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


def period_starts(now: datetime) -> dict[str, datetime]:
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return {"day": day, "month": day.replace(day=1)}


def used(conn: Connection, repo_key: str, since: datetime) -> int:
    total = conn.execute(
        select(func.coalesce(func.sum(tasks.c.input_tokens + tasks.c.output_tokens), 0))
        .where(tasks.c.repo_key == repo_key)
        .where(tasks.c.created_at >= since)
    ).scalar_one()
    return int(total)


def limits(
    conn: Connection, repo_key: str, defaults: Budgets, repo: Repository | None = None
) -> dict[str, int | None]:
    """The budgets of a repository; ``repo``, when the caller has read it, spares a query."""
    if repo is not None:
        daily, monthly = repo.daily_token_budget, repo.monthly_token_budget
    else:
        found = conn.execute(
            select(repositories.c.daily_token_budget, repositories.c.monthly_token_budget).where(
                repositories.c.repo_key == repo_key
            )
        ).first()
        daily, monthly = (found[0], found[1]) if found is not None else (None, None)
    return {
        "day": daily if daily is not None else defaults.daily_tokens,
        "month": monthly if monthly is not None else defaults.monthly_tokens,
    }


def exceeded(
    conn: Connection, repo_key: str, defaults: Budgets, repo: Repository | None = None
) -> str | None:
    """The name of a budget that is used up (``daily budget of N tokens``), or None."""
    starts = period_starts(utcnow())
    for period, limit in limits(conn, repo_key, defaults, repo).items():
        if limit is not None and used(conn, repo_key, starts[period]) >= limit:
            name = "daily" if period == "day" else "monthly"
            return f"the {name} token budget of {limit} tokens for {repo_key}"
    return None


def note_tokens(conn: Connection, repo_key: str, added: int, defaults: Budgets) -> None:
    """After tokens were added: emit ``BudgetThresholdCrossed`` when a threshold was passed."""
    if added <= 0:
        return
    starts = period_starts(utcnow())
    for period, limit in limits(conn, repo_key, defaults).items():
        if limit is None:
            continue
        after = used(conn, repo_key, starts[period])
        mark = defaults.threshold * limit
        if after - added < mark <= after:
            events.emit(
                conn,
                "BudgetThresholdCrossed",
                dedupe_key=f"{repo_key}:{period}:{starts[period].date()}",
                payload={
                    "repoKey": repo_key,
                    "period": period,
                    "limit": limit,
                    "used": after,
                    "threshold": defaults.threshold,
                },
                repo_key=repo_key,
            )
            audit.append(
                conn,
                audit.AuditEvent(
                    action="budget.threshold",
                    repo_key=repo_key,
                    metadata={"period": period, "limit": limit, "used": after},
                ),
            )


def set_budget(conn: Connection, repo_key: str, daily: int | None, monthly: int | None) -> None:
    conn.execute(
        update(repositories)
        .where(repositories.c.repo_key == repo_key)
        .values(daily_token_budget=daily, monthly_token_budget=monthly, updated_at=utcnow())
    )


def report(conn: Connection, defaults: Budgets) -> list[dict[str, Any]]:
    """Tokens (and cost) per repository and per session for today and this month."""
    starts = period_starts(utcnow())
    out = []
    for (repo_key,) in conn.execute(select(repositories.c.repo_key).order_by("repo_key")):
        entry: dict[str, Any] = {"repoKey": repo_key, "limits": limits(conn, repo_key, defaults)}
        for period, since in starts.items():
            row = conn.execute(
                select(
                    func.coalesce(func.sum(tasks.c.input_tokens), 0),
                    func.coalesce(func.sum(tasks.c.output_tokens), 0),
                )
                .where(tasks.c.repo_key == repo_key)
                .where(tasks.c.created_at >= since)
            ).one()
            entry[period] = {
                "inputTokens": int(row[0]),
                "outputTokens": int(row[1]),
                "cost": defaults.cost(int(row[0]), int(row[1])),
            }
        sess = conn.execute(
            select(
                sessions.c.session_key,
                func.coalesce(func.sum(tasks.c.input_tokens), 0),
                func.coalesce(func.sum(tasks.c.output_tokens), 0),
            )
            .join(tasks, tasks.c.session_key == sessions.c.session_key)
            .where(sessions.c.repo_key == repo_key)
            .group_by(sessions.c.session_key)
        )
        entry["sessions"] = [
            {"sessionKey": k, "inputTokens": int(i), "outputTokens": int(o)} for k, i, o in sess
        ]
        out.append(entry)
    return out
