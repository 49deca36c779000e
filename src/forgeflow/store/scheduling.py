"""The scheduler's SQL: claimable tasks and claiming them under a lease.

Restart recovery (work whose worker is gone) is in ``recovery.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Select, and_, bindparam, exists, func, or_, select
from sqlalchemy.exc import IntegrityError

from forgeflow.domain.json import JsonObject
from forgeflow.domain.records import Repository, Session, Task
from forgeflow.domain.states import ACTIVE_STATES, IN_LINE_STATES, WAITING_STATES, TaskState, values
from forgeflow.store import control, leases, repos, rows, sessions, sql
from forgeflow.store import tasks as task_q
from forgeflow.store import workers as worker_q
from forgeflow.store.bookkeeping_schema import workers
from forgeflow.store.schema import repositories, tasks
from forgeflow.store.tasks import StaleStateVersion, Transition
from forgeflow.store.types import utcnow


def candidates(
    conn: Connection,
    *,
    worker_id: str | None = None,
    ttl: timedelta | None = None,
    limit: int = 200,
    repo_key: str | None = None,
) -> list[Task]:
    """Claimable tasks, oldest first: queued, and retry_wait whose time has come.

    With ``worker_id``, only repositories bound to this worker, to nobody, or to a worker
    whose heartbeat is older than ``ttl`` (repository affinity). With ``repo_key``, only
    that repository's.
    """
    now = utcnow()
    affinity = worker_id is not None and ttl is not None
    params: dict[str, datetime | int | str | None] = {"now": now, "limit": limit}
    if repo_key is not None:
        params["repo_key"] = repo_key
    if affinity:
        assert ttl is not None
        params |= {"worker_id": worker_id, "stale_before": now - ttl}
    return rows.every(Task, conn, _candidates(repo_key is not None, affinity), params)


_CANDIDATES: dict[tuple[bool, bool], Select[Any]] = {}


def _candidates(by_repo: bool, affinity: bool) -> Select[Any]:
    """The candidates query, built once per shape: the claim loop asks after every
    acceptance and every task's end."""
    stmt = _CANDIDATES.get((by_repo, affinity))
    if stmt is not None:
        return stmt
    older = tasks.alias("older")
    stmt = (
        select(tasks)
        .join(repositories, repositories.c.repo_key == tasks.c.repo_key)
        .where(repositories.c.status == repos.ACTIVE)
        .where(
            or_(
                tasks.c.state == TaskState.QUEUED.value,
                and_(
                    tasks.c.state == TaskState.RETRY_WAIT.value,
                    tasks.c.next_retry_at <= bindparam("now"),
                ),
            )
        )
        .where(
            ~exists().where(
                older.c.resource_key == tasks.c.resource_key,
                older.c.created_at < tasks.c.created_at,
                older.c.state.in_(values(WAITING_STATES)),
            )
        )
        .order_by(tasks.c.created_at, tasks.c.task_id)
        .limit(bindparam("limit"))
    )
    if by_repo:
        stmt = stmt.where(tasks.c.repo_key == bindparam("repo_key"))
    if affinity:
        stmt = stmt.outerjoin(workers, workers.c.worker_id == repositories.c.worker_id).where(
            or_(
                repositories.c.worker_id.is_(None),
                repositories.c.worker_id == bindparam("worker_id"),
                workers.c.heartbeat_at.is_(None),
                workers.c.heartbeat_at < bindparam("stale_before"),
            )
        )
    _CANDIDATES[(by_repo, affinity)] = stmt
    return stmt


_NEXT_WAKE = select(func.min(tasks.c.next_retry_at)).where(
    tasks.c.state == TaskState.RETRY_WAIT.value
)


def next_wake(conn: Connection) -> Any:
    """When the earliest retry_wait task becomes due (or None)."""
    return sql.scalar(conn, _NEXT_WAKE, {})


@dataclass(frozen=True, slots=True)
class Claim:
    task: Task
    lease_id: str | None
    repo: Repository | None = None  # the repository, read in the same transaction
    session: Session | None = None  # and the session (its agent thread)


@dataclass(frozen=True, slots=True)
class Round:
    claims: list[Claim]
    next_due: datetime | None  # when the earliest retry_wait task becomes due
    # Busy repositories with tasks waiting: their next task is claimed at the handoff.
    waiting_repos: frozenset[str] = frozenset()


def claim(
    conn: Connection,
    task_id: str,
    *,
    owner: str,
    ttl: timedelta,
    worker_id: str | None = None,
    handoff_from: str | None = None,
) -> Claim | None:
    """Move one task into work under its repository's lease, or return None.
    ``handoff_from``: the task whose lease release claims this one (audit only)."""
    if control.get(conn).global_paused:
        return None
    if conn.dialect.name == "postgresql":
        # Another worker holding this row is claiming it: skip instead of waiting.
        stmt = select(tasks).where(tasks.c.task_id == task_id).with_for_update(skip_locked=True)
        row = rows.first(Task, conn, stmt, {})
    else:
        row = task_q.get(conn, task_id)
    if row is None:
        return None
    if worker_id is not None and not worker_q.claim_repository(
        conn, row.repo_key, worker_id=worker_id, ttl=ttl
    ):
        return None
    target = _claimed_state(row)
    if target is None:
        return None
    lease_id = None
    if target in ACTIVE_STATES:
        lease_id = leases.acquire(conn, row.repo_key, owner=owner, task_id=task_id, ttl=ttl)
        if lease_id is None:
            return None
    metadata: JsonObject = {"leaseId": lease_id, "owner": owner}
    if handoff_from:
        metadata["handoffFrom"] = handoff_from
    updated = task_q.transition(
        conn,
        Transition(
            task_id=task_id,
            to_state=target,
            expected_version=row.state_version,
            action="task.claim",
            fields={"lease_id": lease_id, "claimed_by": owner, "next_retry_at": None},
            metadata=metadata,
        ),
    )
    return Claim(
        updated, lease_id, repos.get(conn, row.repo_key), sessions.get(conn, row.session_key)
    )


def _claimed_state(task: Task) -> TaskState | None:
    """Where a claim moves ``task``: a queued task is prepared, a due retry resumes at
    the step that failed; anything else is not claimable (now)."""
    state = TaskState(task.state)
    if state is TaskState.QUEUED:
        return TaskState.PREPARING
    due = task.next_retry_at is not None and task.next_retry_at <= utcnow()
    if state is TaskState.RETRY_WAIT and due:
        return TaskState(task.retry_step or TaskState.PREPARING.value)
    return None


def claim_many(
    conn: Connection,
    wanted: list[tuple[str, str]],
    *,
    owner: str,
    ttl: timedelta,
    worker_id: str | None = None,
    handoff_from: str | None = None,
) -> list[Claim]:
    """:func:`claim` each (task id, repository key) in turn, all in one transaction (one
    commit per claim round instead of one per task); each claim in its own savepoint, so
    one that the database refuses (another task holds the repository) leaves the others
    alone."""
    claimed: list[Claim] = []
    leased: set[str] = set()
    for task_id, repo_key in wanted:
        if repo_key in leased:
            continue  # its lease was taken a moment ago, in this transaction
        try:
            with conn.begin_nested():
                got = claim(
                    conn,
                    task_id,
                    owner=owner,
                    ttl=ttl,
                    worker_id=worker_id,
                    handoff_from=handoff_from,
                )
        except (IntegrityError, StaleStateVersion):
            continue
        if got is not None:
            claimed.append(got)
            if got.lease_id is not None:
                leased.add(repo_key)
    return claimed


def claim_round(
    conn: Connection,
    *,
    busy_repos: frozenset[str],
    running: frozenset[str],
    owner: str,
    ttl: timedelta,
    worker_id: str | None = None,
) -> Round:
    """The candidates and their claims in one transaction (one trip to the writer
    instead of a read and then a write): every candidate whose repository this worker
    is not busy with and that it does not run already; when the next ``retry_wait``
    task is due; and the busy repositories that have candidates."""
    wanted = []
    waiting: set[str] = set()
    for cand in candidates(conn, worker_id=worker_id, ttl=ttl):
        if cand.repo_key in busy_repos:
            waiting.add(cand.repo_key)
        elif cand.task_id not in running:
            wanted.append((cand.task_id, cand.repo_key))
    claims = claim_many(conn, wanted, owner=owner, ttl=ttl, worker_id=worker_id)
    return Round(claims, next_wake(conn), frozenset(waiting))


def claim_next(
    conn: Connection,
    repo_key: str,
    *,
    released_by: str,
    running: frozenset[str],
    owner: str,
    ttl: timedelta,
    worker_id: str | None = None,
) -> list[Claim]:
    """The repository's next task(s), claimed in the caller's transaction, the one in
    which ``released_by`` gives the repository's lease back (the handoff)."""
    wanted = [
        (cand.task_id, cand.repo_key)
        for cand in candidates(conn, worker_id=worker_id, ttl=ttl, limit=20, repo_key=repo_key)
        if cand.task_id not in running
    ]
    return claim_many(
        conn, wanted, owner=owner, ttl=ttl, worker_id=worker_id, handoff_from=released_by
    )


def queue_position(conn: Connection, task: Task) -> int:
    """How many unfinished tasks of the same repository are ahead (0 = next)."""
    ahead = conn.execute(
        select(func.count())
        .select_from(tasks)
        .where(tasks.c.repo_key == task.repo_key)
        .where(tasks.c.created_at < task.created_at)
        .where(tasks.c.state.in_(values(IN_LINE_STATES)))
    ).scalar_one()
    return int(ahead)
