"""The scheduler's SQL: claimable tasks, claiming under a lease, restart recovery."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Select, and_, bindparam, exists, func, or_, select
from sqlalchemy.exc import IntegrityError

from forgeflow.domain.retry import RetryPolicy
from forgeflow.domain.states import ACTIVE_STATES, TaskState
from forgeflow.store import control, leases, repos, sessions, sql
from forgeflow.store import tasks as task_q
from forgeflow.store import workers as worker_q
from forgeflow.store.schema import repositories, tasks, workers
from forgeflow.store.tasks import StaleStateVersion, Transition
from forgeflow.store.types import utcnow

# An older task of the same resource in one of these states goes first (FR-04: the
# order of comments on one issue is kept).
_WAITING = ("queued", "retry_wait", "blocked_workspace")


def candidates(
    conn: Connection,
    *,
    worker_id: str | None = None,
    ttl: timedelta | None = None,
    limit: int = 200,
    repo_key: str | None = None,
) -> list[dict[str, Any]]:
    """Claimable tasks, oldest first: queued, and retry_wait whose time has come.

    With ``worker_id``, only repositories bound to this worker, to nobody, or to a worker
    whose heartbeat is older than ``ttl`` (repository affinity). With ``repo_key``, only
    that repository's.
    """
    now = utcnow()
    affinity = worker_id is not None and ttl is not None
    params: dict[str, Any] = {"now": now, "limit": limit}
    if repo_key is not None:
        params["repo_key"] = repo_key
    if affinity:
        assert ttl is not None
        params |= {"worker_id": worker_id, "stale_before": now - ttl}
    return sql.rows(conn, _candidates(repo_key is not None, affinity), params)


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
        .where(repositories.c.status == "active")
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
                or_(*(older.c.state == s for s in _WAITING)),
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


_NEXT_WAKE = select(func.min(tasks.c.next_retry_at)).where(tasks.c.state == "retry_wait")


def next_wake(conn: Connection) -> Any:
    """When the earliest retry_wait task becomes due (or None)."""
    return sql.scalar(conn, _NEXT_WAKE, {})


@dataclass(frozen=True, slots=True)
class Claim:
    task: dict[str, Any]
    lease_id: str | None
    repo: dict[str, Any] | None = None  # the repository row, read in the same transaction
    session: dict[str, Any] | None = None  # and the session's (its agent thread)


@dataclass(frozen=True, slots=True)
class Round:
    claims: list[Claim]
    next_due: datetime | None  # when the earliest retry_wait task becomes due


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
    if control.get(conn)["global_paused"]:
        return None
    if conn.dialect.name == "postgresql":
        # Another worker holding this row is claiming it: skip instead of waiting.
        found = conn.execute(
            select(tasks).where(tasks.c.task_id == task_id).with_for_update(skip_locked=True)
        ).first()
        row = None if found is None else dict(found._mapping)
    else:
        row = task_q.get(conn, task_id)
    if row is None:
        return None
    if worker_id is not None and not worker_q.claim_repository(
        conn, row["repo_key"], worker_id=worker_id, ttl=ttl
    ):
        return None
    state = TaskState(row["state"])
    if state is TaskState.QUEUED:
        target = TaskState.PREPARING
    elif state is TaskState.RETRY_WAIT and row["next_retry_at"] <= utcnow():
        target = TaskState(row["retry_step"] or TaskState.PREPARING.value)
    else:
        return None
    lease_id = None
    if target in ACTIVE_STATES:
        lease_id = leases.acquire(conn, row["repo_key"], owner=owner, task_id=task_id, ttl=ttl)
        if lease_id is None:
            return None
    updated = task_q.transition(
        conn,
        Transition(
            task_id=task_id,
            to_state=target,
            expected_version=row["state_version"],
            action="task.claim",
            fields={"lease_id": lease_id, "claimed_by": owner, "next_retry_at": None},
            metadata={"leaseId": lease_id, "owner": owner}
            | ({"handoffFrom": handoff_from} if handoff_from else {}),
        ),
    )
    return Claim(
        updated, lease_id, repos.get(conn, row["repo_key"]), sessions.get(conn, row["session_key"])
    )


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
    waiting: set[str] | None = None,
) -> Round:
    """The candidates and their claims in one transaction (one trip to the writer
    instead of a read and then a write): every candidate whose repository this worker
    is not busy with and that it does not run already; and when the next ``retry_wait``
    task is due. ``waiting`` receives the busy repositories that have candidates (their
    next task is claimed at the handoff)."""
    wanted = []
    for cand in candidates(conn, worker_id=worker_id, ttl=ttl):
        if cand["repo_key"] in busy_repos:
            if waiting is not None:
                waiting.add(cand["repo_key"])
        elif cand["task_id"] not in running:
            wanted.append((cand["task_id"], cand["repo_key"]))
    claims = claim_many(conn, wanted, owner=owner, ttl=ttl, worker_id=worker_id)
    return Round(claims, next_wake(conn))


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
        (cand["task_id"], cand["repo_key"])
        for cand in candidates(conn, worker_id=worker_id, ttl=ttl, limit=20, repo_key=repo_key)
        if cand["task_id"] not in running
    ]
    return claim_many(
        conn, wanted, owner=owner, ttl=ttl, worker_id=worker_id, handoff_from=released_by
    )


def queue_position(conn: Connection, task: dict[str, Any]) -> int:
    """How many unfinished tasks of the same repository are ahead (0 = next)."""
    from sqlalchemy import func

    ahead = conn.execute(
        select(func.count())
        .select_from(tasks)
        .where(tasks.c.repo_key == task["repo_key"])
        .where(tasks.c.created_at < task["created_at"])
        .where(tasks.c.state.in_(("queued", "retry_wait", "preparing", "running", "aborting")))
    ).scalar_one()
    return int(ahead)


def recover(
    conn: Connection,
    *,
    owner: str,
    node_prefix: str,
    retry: RetryPolicy,
    ttl: timedelta | None = None,
) -> list[dict[str, Any]]:
    """ARCHITECTURE §5.5: release dead leases and move interrupted work on.

    Work is interrupted when its lease expired or was left by a dead incarnation of
    this same worker node; work that holds no lease (``verifying_reply``) when its
    worker's heartbeat is older than ``ttl``. Safe to run at any time and from several
    workers at once: a task another worker moved first is left to it. Returns the tasks
    that changed.
    """
    now = utcnow()
    for held in leases.stale(conn, now=now, dead_owner_prefix=node_prefix, live_owner=owner):
        leases.expire(
            conn, held, reason="expired" if held["expires_at"] <= now else "owner_restarted"
        )
    changed = []
    in_work = [s.value for s in ACTIVE_STATES] + [TaskState.VERIFYING_REPLY.value]
    stmt = select(tasks).where(tasks.c.state.in_(in_work))
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    for row in conn.execute(stmt).mappings().all():
        task = dict(row)
        lease = leases.get(conn, task["repo_key"])
        if lease is not None and lease["task_id"] == task["task_id"]:
            continue  # a live worker still holds it
        if task["state"] == TaskState.VERIFYING_REPLY.value and not _verifier_gone(
            conn, task["claimed_by"] or "", owner=owner, node_prefix=node_prefix, ttl=ttl
        ):
            continue
        try:
            changed.append(interrupt(conn, task, retry, error_code="interrupted_by_restart"))
        except StaleStateVersion:
            continue  # another worker recovered it first
    return changed


def abandon(conn: Connection, task_id: str, *, owner: str, retry: RetryPolicy) -> bool:
    """The execution of a task crashed in this worker: give its lease back and move it
    on as an interruption, instead of leaving it until the lease expires."""
    task = task_q.get(conn, task_id)
    if task is None or task["claimed_by"] != owner:
        return False
    if task["state"] not in [s.value for s in ACTIVE_STATES] + [TaskState.VERIFYING_REPLY.value]:
        return False
    if task["lease_id"]:
        leases.release(conn, task["repo_key"], task["lease_id"])
    interrupt(conn, task, retry, error_code="internal_error")
    return True


def _verifier_gone(
    conn: Connection, claimed_by: str, *, owner: str, node_prefix: str, ttl: timedelta | None
) -> bool:
    """Whether the worker verifying a reply is gone (no lease tells us for this state)."""
    if not claimed_by or claimed_by == owner:
        return False
    if claimed_by.startswith(node_prefix):
        return True  # this node's dead predecessor
    if ttl is None:
        return False
    holder = worker_q.get(conn, claimed_by.split("/", 1)[0])
    return holder is None or holder["heartbeat_at"] < utcnow() - ttl


def interrupt(
    conn: Connection, task: dict[str, Any], retry: RetryPolicy, *, error_code: str
) -> dict[str, Any]:
    """Interrupted work: one more try after backoff, then ``failed`` (FR-07)."""
    state = TaskState(task["state"])
    base = {
        "task_id": task["task_id"],
        "expected_version": task["state_version"],
        "actor": "system",
        "error_code": error_code,
    }
    if state is TaskState.ABORTING:
        return task_q.transition(
            conn,
            Transition(
                to_state=TaskState.ABORTED,
                action="task.recover",
                fields={"lease_id": None, "claimed_by": None},
                **base,
            ),
        )
    if state is TaskState.VERIFYING_REPLY:
        # Verification only reads Gitea; redoing it costs no attempt.
        return task_q.transition(
            conn,
            Transition(
                to_state=TaskState.RETRY_WAIT,
                action="task.recover",
                fields={
                    "retry_step": "verifying_reply",
                    "next_retry_at": utcnow(),
                    "lease_id": None,
                    "claimed_by": None,
                },
                **base,
            ),
        )
    again = retry.next_try(int(task["attempt"]), utcnow())
    if again is None:
        return task_q.transition(
            conn,
            Transition(
                to_state=TaskState.FAILED,
                action="task.recover",
                fields={
                    "lease_id": None,
                    "claimed_by": None,
                    "execution_error": f"{error_code} after {task['attempt']} retries",
                },
                **base,
            ),
        )
    return task_q.transition(
        conn,
        Transition(
            to_state=TaskState.RETRY_WAIT,
            action="task.recover",
            fields={
                "attempt": again.attempt,
                "retry_step": TaskState.PREPARING.value,
                "next_retry_at": again.at,
                "lease_id": None,
                "claimed_by": None,
            },
            metadata={"attempt": again.attempt},
            **base,
        ),
    )
