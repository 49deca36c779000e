"""Which earlier worker a session's lost work is named after (tasks/lost.py), on both
databases: the claims in the audit and the workers' heartbeats decide."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Connection, update

from forgeflow.store import Store, audit, workers
from forgeflow.store.bookkeeping_schema import workers as workers_table
from forgeflow.store.types import utcnow
from forgeflow.tasks import lost

SESSION = "default:acme/widget:issue:1"
TTL = timedelta(seconds=30)


def claim(store: Store, task_id: str, owner: str) -> None:
    store.db.write_sync(
        lambda c: audit.append(
            c,
            audit.AuditEvent(
                action="task.claim",
                task_id=task_id,
                session_key=SESSION,
                metadata={"owner": owner},
            ),
        )
    )


def beat_ago(store: Store, worker: str, seconds: float) -> None:
    def write(c: Connection) -> None:
        workers.register(c, worker_id=worker, owner=f"{worker}/x", host="h", pid=1)
        c.execute(
            update(workers_table)
            .where(workers_table.c.worker_id == worker)
            .values(heartbeat_at=utcnow() - timedelta(seconds=seconds))
        )

    store.db.write_sync(write)


def previous(store: Store, task_id: str, owner: str) -> str | None:
    return store.db.read_sync(lambda c: lost.previous_worker(c, SESSION, task_id, owner, TTL))


def test_the_dead_worker_the_session_last_ran_on_is_named(store: Store) -> None:
    assert previous(store, "t1", "w1/a") is None  # a session's first task
    claim(store, "t1", "w1/a")
    assert previous(store, "t1", "w1/a") is None  # its own claim
    beat_ago(store, "w1", 300)  # w1 stopped beating long ago
    claim(store, "t2", "w2/b")
    assert previous(store, "t2", "w2/b") == "w1"
    # The same task retried on another worker after its own was killed mid-turn.
    claim(store, "t3", "w1/a")
    claim(store, "t3", "w2/b")
    assert previous(store, "t3", "w2/b") == "w1"
    # A later task on the worker that took over: its previous claim is its own worker's.
    claim(store, "t4", "w2/c")
    assert previous(store, "t4", "w2/c") is None


def test_a_live_earlier_worker_or_the_same_worker_restarted_names_none(store: Store) -> None:
    claim(store, "t1", "w1/a")
    beat_ago(store, "w1", 1)  # alive: its disk, and the work on it, are still there
    claim(store, "t2", "w2/b")
    assert previous(store, "t2", "w2/b") is None
    claim(store, "t3", "w2/old")  # another incarnation of w2 (a restart on its disk)
    claim(store, "t4", "w2/new")
    assert previous(store, "t4", "w2/new") is None
