"""Repository leases ``{repoKey, leaseId, owner, expiresAt}``: at most one
holder per repository, renewed by a heartbeat, released only by its holder's ``leaseId``.

A lease is taken with compare-and-swap and released only by the holder of its
``leaseId``, so a worker that lost its lease can never unlock its successor's.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Connection, bindparam, delete, select, update

from forgeflow.domain.bookkeeping import Lease
from forgeflow.domain.ids import new_lease_id
from forgeflow.store import audit, rows
from forgeflow.store.bookkeeping_schema import repo_leases
from forgeflow.store.sql import insert_ignore
from forgeflow.store.types import utcnow

_GET = select(repo_leases).where(repo_leases.c.repo_key == bindparam("key"))


def get(conn: Connection, repo_key: str) -> Lease | None:
    return rows.first(Lease, conn, _GET, {"key": repo_key})


def acquire(
    conn: Connection, repo_key: str, *, owner: str, task_id: str, ttl: timedelta
) -> str | None:
    """Take the repository's lease for ``task_id``; ``None`` when someone holds it."""
    now = utcnow()
    held = get(conn, repo_key)
    if held is not None:
        if held.expires_at > now:
            return None
        expire(conn, held, reason="expired")
    lease_id = new_lease_id()
    if not insert_ignore(
        conn,
        repo_leases,
        {
            "repo_key": repo_key,
            "lease_id": lease_id,
            "owner": owner,
            "task_id": task_id,
            "acquired_at": now,
            "expires_at": now + ttl,
        },
    ):
        return None
    return lease_id


def expire(conn: Connection, held: Lease, *, reason: str) -> None:
    conn.execute(
        delete(repo_leases)
        .where(repo_leases.c.repo_key == held.repo_key)
        .where(repo_leases.c.lease_id == held.lease_id)
    )
    audit.append(
        conn,
        audit.AuditEvent(
            action="lease.release",
            repo_key=held.repo_key,
            task_id=held.task_id,
            error_code="lease_expired" if reason == "expired" else None,
            metadata={"leaseId": held.lease_id, "owner": held.owner, "reason": reason},
        ),
    )


def renew(conn: Connection, repo_key: str, lease_id: str, ttl: timedelta) -> bool:
    result = conn.execute(
        update(repo_leases)
        .where(repo_leases.c.repo_key == repo_key)
        .where(repo_leases.c.lease_id == lease_id)
        .values(expires_at=utcnow() + ttl)
    )
    return result.rowcount == 1


def release(conn: Connection, repo_key: str, lease_id: str) -> bool:
    result = conn.execute(
        delete(repo_leases)
        .where(repo_leases.c.repo_key == repo_key)
        .where(repo_leases.c.lease_id == lease_id)
    )
    return result.rowcount == 1


def stale(
    conn: Connection, *, now: datetime, dead_owner_prefix: str | None, live_owner: str
) -> list[Lease]:
    """Leases that expired, or that a dead predecessor of this worker left behind."""
    return [
        r
        for r in rows.every(Lease, conn, select(repo_leases), {})
        if r.expires_at <= now
        or (
            dead_owner_prefix is not None
            and r.owner.startswith(dead_owner_prefix)
            and r.owner != live_owner
        )
    ]
