"""Queries of the ``repositories`` table."""

from __future__ import annotations

from sqlalchemy import Connection, bindparam, select, update

from forgeflow.domain.events import repo_added
from forgeflow.domain.ids import INSTANCE_ID, RepoRef
from forgeflow.domain.records import Repository
from forgeflow.store import audit, events, rows, sql
from forgeflow.store.schema import repositories
from forgeflow.store.sql import insert_ignore
from forgeflow.store.types import utcnow

ACTIVE = "active"
DISABLED = "disabled"


def register(
    conn: Connection,
    *,
    repo: RepoRef,
    clone_url: str,
    default_branch: str,
    workspace_path: str,
    delivery_id: str | None = None,
) -> Repository:
    """Create the repository row once (compare-and-swap on the key); return the row."""
    known = get(conn, repo.key)
    if known is not None:
        return known
    now = utcnow()
    if insert_ignore(
        conn,
        repositories,
        {
            "repo_key": repo.key,
            "instance_id": INSTANCE_ID,
            "owner": repo.owner,
            "name": repo.name,
            "clone_url": clone_url,
            "workspace_path": workspace_path,
            "default_branch": default_branch,
            "status": ACTIVE,
            "registered_at": now,
            "updated_at": now,
            "version": 1,
        },
    ):
        audit.append(
            conn,
            audit.AuditEvent(
                action="repository.register",
                repo_key=repo.key,
                delivery_id=delivery_id,
                metadata={"workspacePath": workspace_path},
            ),
        )
        # Pipelines listening to RepoAdded start on the first registration.
        added = repo_added(
            repo.key, repo.owner, repo.name, clone_url, default_branch, "registration"
        )
        events.record(conn, [added])
    row = get(conn, repo.key)
    assert row is not None
    return row


# Built once: every accepted mention reads its repository row (see store/sql.py).
_GET = select(repositories).where(repositories.c.repo_key == bindparam("key"))
_STATUS = select(repositories.c.status).where(repositories.c.repo_key == bindparam("key"))


def get(conn: Connection, repo_key: str) -> Repository | None:
    return rows.first(Repository, conn, _GET, {"key": repo_key})


def status(conn: Connection, repo_key: str) -> str | None:
    value: str | None = sql.scalar(conn, _STATUS, {"key": repo_key})
    return value


def set_status(conn: Connection, repo_key: str, new_status: str, actor: str, reason: str) -> bool:
    """Enable or disable; True when the status changed. History is kept either way."""
    row = get(conn, repo_key)
    if row is None:
        raise KeyError(repo_key)
    if row.status == new_status:
        return False
    conn.execute(
        update(repositories)
        .where(repositories.c.repo_key == repo_key)
        .where(repositories.c.version == row.version)
        .values(status=new_status, version=row.version + 1, updated_at=utcnow())
    )
    audit.append(
        conn,
        audit.AuditEvent(
            action=f"repository.{'disable' if new_status == DISABLED else 'enable'}",
            actor=actor,
            repo_key=repo_key,
            metadata={"reason": reason, "from": row.status, "to": new_status},
        ),
    )
    return True


def mark_fetched(conn: Connection, repo_key: str) -> None:
    conn.execute(
        update(repositories)
        .where(repositories.c.repo_key == repo_key)
        .values(last_fetch_at=utcnow(), updated_at=utcnow())
    )


def list_all(conn: Connection) -> list[Repository]:
    return rows.every(Repository, conn, select(repositories).order_by("repo_key"), {})
