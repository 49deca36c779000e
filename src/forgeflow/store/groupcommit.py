"""Group commit for SQLite's single writer: queued units of work share a transaction.

SQLite allows one writer, so forgeflow already runs every write on one thread. Under a
burst each unit still paid for its own BEGIN, COMMIT and WAL page writes, and most of a
webhook's acceptance time was that. Here the writer thread takes every unit waiting in
the queue (up to ``max_batch``), runs each in its own SAVEPOINT inside one transaction
and commits once; a unit that raises is rolled back to its savepoint alone and gets its
exception, the others commit. No unit's future resolves before the COMMIT, so a caller
still answers only after its rows are durable. A lone unit runs without a savepoint,
exactly as before. No library does this for SQLAlchemy, hence the hand-written queue.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from sqlalchemy import Connection, Engine

Unit = Callable[[Connection], Any]


class GroupWriter:
    def __init__(
        self,
        engine: Engine,
        *,
        translate: Callable[[BaseException], BaseException],
        committed: Callable[[Connection], Callable[[], None]],
        max_batch: int = 32,
    ) -> None:
        self._engine = engine
        self._translate = translate
        self._committed = committed
        self._max_batch = max_batch
        self._queue: deque[tuple[Unit, Future[Any]]] = deque()
        self._ready = threading.Condition()
        self._closed = False
        self._conn: Connection | None = None
        self._thread = threading.Thread(target=self._run, name="db-write", daemon=True)
        self._thread.start()

    def submit(self, fn: Unit) -> Future[Any]:
        future: Future[Any] = Future()
        with self._ready:
            if self._closed:
                raise RuntimeError("the store is closed")
            self._queue.append((fn, future))
            self._ready.notify()
        return future

    def close(self) -> None:
        """Finish what is queued, then stop the thread."""
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._ready.wait()
                if not self._queue:
                    self._drop_connection()
                    return
                batch = [
                    self._queue.popleft() for _ in range(min(len(self._queue), self._max_batch))
                ]
            batch = [(fn, f) for fn, f in batch if f.set_running_or_notify_cancel()]
            if batch:
                self._commit(batch)

    def _connection(self) -> Connection:
        # One connection for the thread's life: a pool checkout and its reset-on-return
        # per batch cost more than a small batch's statements.
        if self._conn is None or self._conn.invalidated or self._conn.closed:
            self._conn = self._engine.connect()
        return self._conn

    def _commit(self, batch: list[tuple[Unit, Future[Any]]]) -> None:
        outcomes: list[tuple[bool, Any]] = []
        after: Callable[[], None] = _nothing
        try:
            conn = self._connection()
            with conn.begin():
                try:
                    if len(batch) == 1:
                        outcomes.append((True, batch[0][0](conn)))
                    else:
                        outcomes.extend(_in_savepoint(conn, fn) for fn, _future in batch)
                finally:
                    after = self._committed(conn)
        except BaseException as exc:  # the transaction failed: nothing of it is kept
            self._drop_connection()
            error = self._translate(exc)
            for _fn, future in batch:
                future.set_exception(error)
            return
        after()
        for (_fn, future), (ok, value) in zip(batch, outcomes, strict=True):
            if ok:
                future.set_result(value)
            else:
                future.set_exception(self._translate(value))

    def _drop_connection(self) -> None:
        """Give the connection back (after a failed transaction, or at the end): the
        next batch starts on a fresh one."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


def _nothing() -> None:
    pass


def _in_savepoint(conn: Connection, fn: Unit) -> tuple[bool, Any]:
    # On the driver: SQLAlchemy's nested-transaction bookkeeping cost more than the
    # savepoint itself, twice per unit. A savepoint a unit opens itself is SQLAlchemy's.
    driver = conn.connection.driver_connection
    assert driver is not None
    driver.execute("SAVEPOINT forgeflow_unit")
    try:
        result = fn(conn)
    except Exception as exc:
        driver.execute("ROLLBACK TO forgeflow_unit")
        driver.execute("RELEASE forgeflow_unit")
        return False, exc
    driver.execute("RELEASE forgeflow_unit")
    return True, result
