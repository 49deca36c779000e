"""Read-only queries behind task detail: turns and comments of a task."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from forgeflow.store.schema import comments, turns
from forgeflow.store.types import iso


def turns_of(conn: Connection, task_id: str) -> list[dict[str, Any]]:
    rows = conn.execute(select(turns).where(turns.c.task_id == task_id).order_by(turns.c.turn_key))
    return [
        {
            "turnKey": r.turn_key,
            "turnId": r.turn_id,
            "taskId": r.task_id,
            "threadId": r.thread_id,
            "kind": r.kind,
            "status": r.status,
            "eventSeq": r.event_seq,
            "inputTokens": r.input_tokens,
            "outputTokens": r.output_tokens,
            # The agent's final message: a draft task's (review/plan) result.
            "lastMessage": r.last_message,
            "startedAt": iso(r.started_at),
            "completedAt": iso(r.completed_at),
        }
        for r in rows
    ]


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
