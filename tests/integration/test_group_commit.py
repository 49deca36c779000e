"""SQLite group commit (store/groupcommit.py): queued writes share one transaction, a
failing one is rolled back alone, and nobody hears back before the COMMIT."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, event, text

from forgeflow.store import Store


@pytest.fixture
def sqlite_store(sqlite_url: str) -> Iterator[Store]:
    s = Store(sqlite_url)
    s.migrate()
    with s.db.writer.begin() as conn:
        conn.execute(text("CREATE TABLE probe (n INTEGER PRIMARY KEY)"))
    yield s
    s.close()


def _count_commits(store: Store) -> list[int]:
    commits = [0]

    def _on_commit(_conn: Any) -> None:
        commits[0] += 1

    event.listen(store.db.writer, "commit", _on_commit)
    return commits


def _insert(n: int) -> Any:
    def unit(conn: Connection) -> int:
        conn.execute(text("INSERT INTO probe (n) VALUES (:n)"), {"n": n})
        return n

    return unit


def _sync(scenario: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """These tests drive the store's async API; the suite runs coroutines with asyncio.run."""

    @functools.wraps(scenario)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(scenario(*args, **kwargs))

    return run


def _rows(store: Store) -> list[int]:
    with store.db.reader.connect() as conn:
        return [r[0] for r in conn.execute(text("SELECT n FROM probe ORDER BY n"))]


@_sync
async def test_queued_writes_commit_together_and_a_failure_stays_alone(
    sqlite_store: Store,
) -> None:
    commits = _count_commits(sqlite_store)
    gate = threading.Event()

    def blocker(conn: Connection) -> str:
        # Holds the writer thread, so the next units queue up behind it.
        gate.wait(10)
        return "first"

    def failing(conn: Connection) -> None:
        conn.execute(text("INSERT INTO probe (n) VALUES (99)"))
        raise ValueError("this unit fails after writing")

    first = asyncio.ensure_future(sqlite_store.write(blocker))
    await asyncio.sleep(0.05)
    queued = [asyncio.ensure_future(sqlite_store.write(_insert(n))) for n in (1, 2)]
    bad = asyncio.ensure_future(sqlite_store.write(failing))
    queued.append(asyncio.ensure_future(sqlite_store.write(_insert(3))))
    await asyncio.sleep(0.05)
    assert not any(f.done() for f in [*queued, bad])
    gate.set()
    assert await first == "first"
    assert [await f for f in queued] == [1, 2, 3]
    with pytest.raises(ValueError, match="fails after writing"):
        await bad
    # The failing unit's row is gone with its savepoint; the others are all there.
    assert _rows(sqlite_store) == [1, 2, 3]
    # The blocker alone, then the four queued units in one transaction.
    assert commits[0] == 2


@_sync
async def test_a_lone_failing_write_keeps_nothing(sqlite_store: Store) -> None:
    def failing(conn: Connection) -> None:
        conn.execute(text("INSERT INTO probe (n) VALUES (7)"))
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await sqlite_store.write(failing)
    assert _rows(sqlite_store) == []
    assert await sqlite_store.write(_insert(8)) == 8
    assert _rows(sqlite_store) == [8]


@_sync
async def test_no_future_resolves_before_its_transaction_commits(sqlite_store: Store) -> None:
    seen: list[list[int]] = []
    gate = threading.Event()

    def blocker(conn: Connection) -> None:
        gate.wait(10)

    def look(conn: Connection) -> int:
        conn.execute(text("INSERT INTO probe (n) VALUES (5)"))
        return 5

    hold = asyncio.ensure_future(sqlite_store.write(blocker))
    await asyncio.sleep(0.05)
    unit = asyncio.ensure_future(sqlite_store.write(look))
    also = asyncio.ensure_future(sqlite_store.write(_insert(6)))
    gate.set()
    await hold
    await unit
    # Another connection sees the row as soon as its writer heard back.
    seen.append(_rows(sqlite_store))
    await also
    assert seen[0] == [5, 6]


def test_close_finishes_what_is_queued(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    store.migrate()
    with store.db.writer.begin() as conn:
        conn.execute(text("CREATE TABLE probe (n INTEGER PRIMARY KEY)"))
    futures = [store.db._group.submit(_insert(n)) for n in range(20)]  # type: ignore[union-attr]
    store.close()
    assert [f.result(timeout=5) for f in futures] == list(range(20))
    reopened = Store(sqlite_url)
    try:
        assert _rows(reopened) == list(range(20))
    finally:
        reopened.close()


@_sync
async def test_a_transaction_that_fails_at_commit_leaves_the_writer_usable(
    sqlite_store: Store,
) -> None:
    # The writer keeps one connection across batches; a failed COMMIT must not leave
    # it holding a broken transaction for the next unit.
    with sqlite_store.db.writer.begin() as conn:
        conn.execute(
            text("CREATE TABLE child (n INTEGER REFERENCES probe(n) DEFERRABLE INITIALLY DEFERRED)")
        )

    def orphan(conn: Connection) -> None:
        # A deferred foreign key fails at COMMIT, not at the INSERT.
        conn.execute(text("INSERT INTO child (n) VALUES (404)"))

    with pytest.raises(Exception, match="FOREIGN KEY"):
        await sqlite_store.write(orphan)
    assert await sqlite_store.write(_insert(9)) == 9
    assert _rows(sqlite_store) == [9]
