"""What a takeover loses, said in the answer.

A session's published branch survives its worker (workspace/published.py); what was on
that worker's disk and not pushed (uncommitted files, commits not pushed yet) does not.
When a task's worktree had to be made anew and the session last ran on another worker
that is gone, the preparation records ``session.work_lost`` (worker, branch, last
pushed commit) with its move to ``running``; the answer then says so in one line, beside
the publishing note (verify.py). The audit row is the whole mechanism: it outlives a
restart between the preparation and the answer, and a retry's second row changes
nothing (the newest one is said).
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Connection

from forgeflow.domain.records import Task
from forgeflow.store import audit, pushes, workers
from forgeflow.store.audit import AuditEvent
from forgeflow.store.types import utcnow
from forgeflow.tasks.moves import task_event

ACTION = "session.work_lost"
_CLAIMS = 50  # claims of the session looked at: far more than a task's attempts


def previous_worker(
    conn: Connection, session_key: str, task_id: str, owner: str, ttl: timedelta
) -> str | None:
    """The worker the session ran on before this process claimed ``task_id``, when that
    is another worker and it is not alive (heartbeat older than ``ttl``, or no row)."""
    claims = audit.query(
        conn,
        audit.AuditQuery(
            session_key=session_key, action="task.claim", newest_first=True, limit=_CLAIMS
        ),
    )
    mine = owner.split("/", 1)[0]
    for row in claims:
        who = str(row.metadata.get("owner") or "")
        if who == owner and row.task_id == task_id:
            continue  # this process's own claims of this task
        worker = who.split("/", 1)[0]
        if not worker or worker == mine:
            return None  # the same worker's disk: nothing of it was lost by a takeover
        holder = workers.get(conn, worker)
        if holder is not None and holder.heartbeat_at > utcnow() - ttl:
            return None
        return worker
    return None


def lost_event(
    conn: Connection,
    task: Task,
    *,
    owner: str,
    ttl: timedelta,
    branch: str,
    published: str | None,
) -> AuditEvent | None:
    """The ``session.work_lost`` row for a task whose worktree was made anew here, or
    None when the session was not last on a dead worker."""
    worker = previous_worker(conn, task.session_key, task.task_id, owner, ttl)
    if worker is None:
        return None
    last = published
    if last is None:
        push = pushes.last(conn, task.session_key)
        last = push.new_sha if push is not None and push.status == pushes.PUSHED else None
    return task_event(
        task, ACTION, metadata={"worker": worker, "branch": branch, "lastPushed": last}
    )


def note(conn: Connection, task_id: str) -> str | None:
    """The answer's line about lost work; None when nothing was lost."""
    rows = audit.query(
        conn, audit.AuditQuery(task_id=task_id, action=ACTION, newest_first=True, limit=1)
    )
    if not rows:
        return None
    meta = rows[0].metadata
    worker = str(meta.get("worker") or "?")[:200]
    branch = str(meta.get("branch") or "")[:255]
    last = meta.get("lastPushed")
    head = (
        f"the session goes on from its last pushed commit `{str(last)[:10]}` of `{branch}`"
        if isinstance(last, str) and last
        else f"nothing of it had been pushed to `{branch}`, so the session starts afresh"
    )
    return (
        f"forgeflow: this session last ran on worker `{worker}`, which is gone; work not "
        f"pushed from there (uncommitted changes, unpushed commits) is lost, and {head}."
    )
