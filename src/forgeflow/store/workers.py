"""Worker nodes: registration, heartbeats, and repository affinity hand-over."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, select, update

from forgeflow.domain.bookkeeping import Worker
from forgeflow.store import audit, rows, sql
from forgeflow.store.bookkeeping_schema import workers
from forgeflow.store.schema import repositories
from forgeflow.store.sql import insert_ignore
from forgeflow.store.types import utcnow

_GET = select(workers).where(workers.c.worker_id == bindparam("worker_id"))


def get(conn: Connection, worker_id: str) -> Worker | None:
    return rows.first(Worker, conn, _GET, {"worker_id": worker_id})


def register(conn: Connection, *, worker_id: str, owner: str, host: str, pid: int) -> Worker | None:
    """Record this incarnation of the worker; returns the previous incarnation's row."""
    previous = get(conn, worker_id)
    now = utcnow()
    values = {"owner": owner, "host": host, "pid": pid, "started_at": now, "heartbeat_at": now}
    if previous is None:
        insert_ignore(conn, workers, {"worker_id": worker_id, **values})
    else:
        conn.execute(update(workers).where(workers.c.worker_id == worker_id).values(**values))
    audit.append(
        conn,
        audit.AuditEvent(
            action="worker.start",
            actor=owner,
            metadata={"workerId": worker_id, "host": host, "pid": pid},
        ),
    )
    return previous


def beat(conn: Connection, worker_id: str, owner: str) -> bool:
    result = conn.execute(
        update(workers)
        .where(workers.c.worker_id == worker_id)
        .where(workers.c.owner == owner)
        .values(heartbeat_at=utcnow())
    )
    return result.rowcount == 1


_BINDING = select(repositories.c.worker_id, repositories.c.version).where(
    repositories.c.repo_key == bindparam("key")
)


def claim_repository(conn: Connection, repo_key: str, *, worker_id: str, ttl: timedelta) -> bool:
    """Bind the repository's workspace to this worker, or confirm it is bound here.

    A repository bound to a worker whose heartbeat is older than ``ttl`` is taken over
    (and cloned afresh on this worker's disk).
    """
    repo = sql.first(conn, _BINDING, {"key": repo_key})
    if repo is None:
        return False
    if repo["worker_id"] == worker_id:
        return True
    if repo["worker_id"] is not None:
        holder = get(conn, repo["worker_id"])
        if holder is not None and holder.heartbeat_at > utcnow() - ttl:
            return False
    changed = conn.execute(
        update(repositories)
        .where(repositories.c.repo_key == repo_key)
        .where(repositories.c.version == repo["version"])
        .values(worker_id=worker_id, version=repo["version"] + 1, updated_at=utcnow())
    )
    if changed.rowcount != 1:
        return False
    audit.append(
        conn,
        audit.AuditEvent(
            action="repository.takeover" if repo["worker_id"] else "repository.affinity",
            repo_key=repo_key,
            metadata={"workerId": worker_id, "previous": repo["worker_id"]},
        ),
    )
    return True


def oldest_live_start(conn: Connection, ttl: timedelta) -> Any:
    """When the longest-running live worker started (heartbeat within ``ttl``); None
    when no worker is live. Whatever was written before it was written by a process
    that is gone now."""
    from sqlalchemy import func

    return conn.execute(
        select(func.min(workers.c.started_at)).where(workers.c.heartbeat_at > utcnow() - ttl)
    ).scalar_one_or_none()
