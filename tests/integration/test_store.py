"""Store behaviour the rest of forgeflow relies on, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import update
from sqlalchemy.exc import IntegrityError

from forgeflow.domain.states import TERMINAL_STATES, IllegalTransition, TaskState
from forgeflow.store import StaleStateVersion, Store, Transition, audit, tasks
from forgeflow.store.schema import tasks as tasks_table


def _task(store: Store, n: int, repo: str = "default:a/b") -> str:
    task_id = f"gitea-task-{n}"
    store.db.write_sync(
        lambda c: tasks.insert_received(
            c,
            {
                "task_id": task_id,
                "delivery_key": f"default:d{n}",
                "repo_key": repo,
                "resource_key": f"{repo}:issue:{n}",
                "session_key": f"{repo}:issue:{n}",
                "comment_id": n,
                "author": "alice",
                "instruction": "x",
            },
        )
    )
    return task_id


def test_database_refuses_two_active_tasks_on_one_repository(store: Store) -> None:
    a, b, other = _task(store, 1), _task(store, 2), _task(store, 3, repo="default:a/c")

    def force(task_id: str) -> None:
        store.db.write_sync(
            lambda c: c.execute(
                update(tasks_table).where(tasks_table.c.task_id == task_id).values(state="running")
            )
        )

    force(a)
    force(other)  # another repository is free to run in parallel
    with pytest.raises(IntegrityError):
        force(b)


def test_refused_transition_keeps_its_alert(store: Store) -> None:
    task_id = _task(store, 1)
    with pytest.raises(IllegalTransition):
        asyncio.run(store.transition(Transition(task_id, TaskState.SUCCEEDED, 1)))
    with pytest.raises(StaleStateVersion):
        asyncio.run(store.transition(Transition(task_id, TaskState.QUEUED, 7)))
    row = asyncio.run(store.transition(Transition(task_id, TaskState.QUEUED, 1)))
    assert row.state == "queued" and row.state_version == 2
    events = store.db.read_sync(lambda c: audit.query(c, audit.AuditQuery(task_id=task_id)))
    assert [(e.action, e.error_code) for e in events] == [
        ("task.transition_refused", "illegal_transition"),
        ("task.transition_refused", "stale_state_version"),
        ("task.transition", None),
    ]


def test_a_terminal_task_never_moves(store: Store) -> None:
    # The one transition function refuses every move out of every terminal state.
    for n, state in enumerate(sorted(TERMINAL_STATES), start=1):
        task_id = _task(store, n)
        store.db.write_sync(
            lambda c, t=task_id, s=state: c.execute(
                update(tasks_table).where(tasks_table.c.task_id == t).values(state=s.value)
            )
        )
        for target in TaskState:
            with pytest.raises(IllegalTransition):
                asyncio.run(store.transition(Transition(task_id, target, 1)))
        row = store.db.read_sync(lambda c, t=task_id: tasks.get(c, t))
        assert row is not None and row.state == state and row.state_version == 1


def test_a_move_out_of_work_gives_the_claim_back(store: Store) -> None:
    """The claim is the transition's business: a move into work keeps it, one out of work
    clears it, whatever the caller's fields say."""
    task_id = _task(store, 1)
    asyncio.run(store.transition(Transition(task_id, TaskState.QUEUED, 1)))
    claimed = {"claimed_by": "w/1"}
    row = asyncio.run(store.transition(Transition(task_id, TaskState.PREPARING, 2, fields=claimed)))
    assert row.claimed_by == "w/1"
    row = asyncio.run(store.transition(Transition(task_id, TaskState.RUNNING, 3)))
    assert row.claimed_by == "w/1"
    row = asyncio.run(
        store.transition(Transition(task_id, TaskState.RETRY_WAIT, 4, fields=claimed))
    )
    assert row.claimed_by is None


def test_transitions_emit_domain_events_once(store: Store) -> None:
    from forgeflow.store import events

    task_id = _task(store, 1)
    asyncio.run(store.transition(Transition(task_id, TaskState.QUEUED, 1)))
    asyncio.run(store.transition(Transition(task_id, TaskState.CANCELLED, 2)))
    seen = store.db.read_sync(lambda c: events.all_of(c))
    assert [e.event_type for e in seen] == [
        "TaskStatusChanged",
        "TaskCreated",
        "TaskStatusChanged",
        "TaskCancelled",
    ]
    assert seen[-1].payload["toState"] == "cancelled"
    # The same event key twice is recorded once.
    again = store.db.write_sync(
        lambda c: events.emit(c, "TaskCancelled", dedupe_key=f"{task_id}:3", payload={})
    )
    assert again is False


def test_the_sql_helpers_store_what_sqlalchemy_stores(store: Store) -> None:
    # On SQLite the hot INSERTs run on the driver's cursor (store/sql.py); the rows must
    # be the same as SQLAlchemy's own path writes, value for value and type for type.
    from datetime import UTC, datetime

    from sqlalchemy import select, text

    from forgeflow.store.bookkeeping_schema import audit_events
    from forgeflow.store.sql import insert_ignore, insert_row

    when = datetime(2026, 11, 30, 13, 10, 29, 445190, tzinfo=UTC)

    def values(event_id: str) -> dict[str, object]:
        return {
            "event_id": event_id,
            "task_id": "t",
            "actor": "gitea:user:alice",
            "action": "webhook.accept",
            "state_version": 2,
            "comment_id": 7,
            "timestamp": when,
            "metadata": {"b": [1, "x"], "a": None},
        }

    def write(conn: object) -> None:
        insert_row(conn, audit_events, values("direct"))  # type: ignore[arg-type]
        conn.execute(audit_events.insert(), values("plain"))  # type: ignore[attr-defined]
        assert insert_ignore(conn, audit_events, values("ignored"))  # type: ignore[arg-type]
        assert not insert_ignore(conn, audit_events, values("ignored"))  # type: ignore[arg-type]

    store.db.write_sync(write)
    columns = [c for c in audit_events.columns if c.name not in ("seq", "event_id")]
    with store.db.reader.connect() as conn:
        rows = {
            r.event_id: r
            for r in conn.execute(select(audit_events.c.event_id, *columns)).fetchall()
        }
        assert set(rows) == {"direct", "plain", "ignored"}
        assert rows["direct"][1:] == rows["plain"][1:] == rows["ignored"][1:]
        assert rows["direct"].timestamp == when
        assert rows["direct"].metadata == {"a": None, "b": [1, "x"]}
        if store.db.is_sqlite:  # the stored text itself, not only what it reads back as
            raw = text("SELECT timestamp, metadata, typeof(timestamp) FROM audit_events")
            assert len({tuple(r) for r in conn.execute(raw)}) == 1

    with pytest.raises(IntegrityError):  # the driver's error, as SQLAlchemy's class
        store.db.write_sync(lambda c: insert_row(c, audit_events, values("direct")))
