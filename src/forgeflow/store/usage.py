"""Token use per repository and the budgets' rows: what domain/budgets.py decides on.

A task's tokens count in the period it was created in (``tasks.created_at``).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, func, select, update

from forgeflow.domain import budgets
from forgeflow.domain.budgets import Budgets, Period, period_starts
from forgeflow.domain.json import JsonObject
from forgeflow.domain.records import Repository
from forgeflow.store import audit, events
from forgeflow.store.schema import repositories, sessions, tasks
from forgeflow.store.types import utcnow


def used(conn: Connection, repo_key: str, since: datetime) -> int:
    total = conn.execute(
        select(func.coalesce(func.sum(tasks.c.input_tokens + tasks.c.output_tokens), 0))
        .where(tasks.c.repo_key == repo_key)
        .where(tasks.c.created_at >= since)
    ).scalar_one()
    return int(total)


def task_tokens(conn: Connection, task_id: str) -> int:
    """The tokens one task used so far (all its turns)."""
    total = conn.execute(
        select(tasks.c.input_tokens + tasks.c.output_tokens).where(tasks.c.task_id == task_id)
    ).scalar()
    return int(total or 0)


def limits(
    conn: Connection, repo_key: str, defaults: Budgets, repo: Repository | None = None
) -> dict[Period, int | None]:
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
    return defaults.limits(daily, monthly)


def exceeded(
    conn: Connection, repo_key: str, defaults: Budgets, repo: Repository | None = None
) -> str | None:
    """The budget that is used up (domain.budgets.exceeded), or None; only a period
    with a limit is counted."""
    starts = period_starts(utcnow())
    limit = limits(conn, repo_key, defaults, repo)
    spent = {p: used(conn, repo_key, starts[p]) for p, n in limit.items() if n is not None}
    return budgets.exceeded(limit, spent, repo_key)


def note_tokens(conn: Connection, repo_key: str, added: int, defaults: Budgets) -> None:
    """After tokens were added: emit ``BudgetThresholdCrossed`` when a threshold was passed."""
    if added <= 0:
        return
    starts = period_starts(utcnow())
    for period, limit in limits(conn, repo_key, defaults).items():
        if limit is None:
            continue
        after = used(conn, repo_key, starts[period])
        if budgets.crossed(limit, defaults.threshold, after - added, after):
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


def report(conn: Connection, defaults: Budgets) -> list[JsonObject]:
    """Tokens (and cost) per repository and per session for today and this month, as
    ``GET /usage`` answers them."""
    starts = period_starts(utcnow())
    out: list[JsonObject] = []
    for (repo_key,) in conn.execute(select(repositories.c.repo_key).order_by("repo_key")):
        shown: JsonObject = {p: n for p, n in limits(conn, repo_key, defaults).items()}
        entry: JsonObject = {"repoKey": repo_key, "limits": shown}
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
