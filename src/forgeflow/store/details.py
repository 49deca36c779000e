"""Read-only queries behind task detail: the comments of a task."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from forgeflow.store.schema import comments
from forgeflow.store.types import iso


def comments_of(conn: Connection, task_id: str) -> list[dict[str, Any]]:
    rows = conn.execute(
        select(comments).where(comments.c.task_id == task_id).order_by(comments.c.created_at)
    )
    return [
        {
            "commentKey": r.comment_key,
            "taskId": r.task_id,
            "kind": r.kind,
            "resourceKey": r.resource_key,
            "turnId": r.turn_id,
            "turnKey": r.turn_key,
            "commentId": r.comment_id,
            "bodyHash": r.body_hash,
            "status": r.status,
            "createdAt": iso(r.created_at),
        }
        for r in rows
    ]
