"""Queries of the ``sessions`` table: one row (and one Codex thread) per resource."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from forgeflow.domain.ids import ResourceRef
from forgeflow.store.schema import sessions
from forgeflow.store.sql import insert_ignore
from forgeflow.store.types import iso, utcnow

RUNTIME = {"app": "codexapp", "mode": "yolo"}
MCP = {"server": "gitea", "transport": "stdio", "hostRef": "gitea-main"}


def ensure(conn: Connection, resource: ResourceRef) -> dict[str, Any]:
    """The session of ``resource``, created on first use; the thread comes later."""
    now = utcnow()
    insert_ignore(
        conn,
        sessions,
        {
            "session_key": resource.session_key,
            "resource_key": resource.key,
            "repo_key": resource.repo.key,
            "kind": resource.kind.value,
            "number": resource.number,
            "runtime": RUNTIME,
            "mcp": MCP,
            "status": "active",
            "created_at": now,
            "updated_at": now,
            "version": 1,
        },
    )
    row = get(conn, resource.session_key)
    assert row is not None
    return row


def get(conn: Connection, session_key: str) -> dict[str, Any] | None:
    row = conn.execute(select(sessions).where(sessions.c.session_key == session_key)).first()
    return dict(row._mapping) if row else None


def to_json(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "sessionKey": row["session_key"],
        "resourceKey": row["resource_key"],
        "repoKey": row["repo_key"],
        "kind": row["kind"],
        "number": row["number"],
        "threadId": row["thread_id"],
        "runtime": row["runtime"],
        "mcp": row["mcp"],
        "status": row["status"],
        "lastTaskId": row["last_task_id"],
        "lastTurnId": row["last_turn_id"],
        "createdAt": iso(row["created_at"]),
        "updatedAt": iso(row["updated_at"]),
        "version": row["version"],
    }
