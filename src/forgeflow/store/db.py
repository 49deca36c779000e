"""The database port: one engine per URL, units of work run on worker threads.

A unit of work is a plain function ``fn(conn)`` run inside one transaction on a
thread, so the event loop never blocks on a driver and every write is atomic.
SQLite gets one writer thread: SQLite allows a single writer anyway, and queueing
writers in-process is cheaper than letting them fight over the file lock.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError

from forgeflow.store.checkpoint import Checkpointer

T = TypeVar("T")
Unit = Callable[[Connection], Any]  # a unit of work: one function of one transaction

# Topics a unit of work asks to announce once its transaction has committed (a domain
# event was written: wake the dispatcher). Kept in the connection's ``info``, which
# outlives the checkout, so :meth:`Database.write_sync` always pops it.
_AFTER_COMMIT = "forgeflow.after_commit"


def after_commit(conn: Connection, topic: str) -> bool:
    """Announce ``topic`` after this transaction commits; True the first time per
    transaction (callers do once-per-transaction work on it, e.g. ``NOTIFY``)."""
    topics: set[str] = conn.info.setdefault(_AFTER_COMMIT, set())
    if topic in topics:
        return False
    topics.add(topic)
    return True


class StoreUnavailable(Exception):
    """The database cannot be reached or is locked beyond the timeout."""

    code = "store_unavailable"


def _sqlite_engine(url: str, *, immediate: bool, autocheckpoint: bool = True) -> Engine:
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": 30},
        pool_size=8,
        max_overflow=8,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
        # Take transaction control away from pysqlite so BEGIN IMMEDIATE is ours.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        if not autocheckpoint:  # a Checkpointer thread does it (store/checkpoint.py)
            cur.execute("PRAGMA wal_autocheckpoint=0")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Writers take the write lock up front: a deferred transaction that upgrades
        # later can fail with SQLITE_BUSY instead of waiting.
        # Straight on the driver: SQLAlchemy's execute machinery costs more than BEGIN.
        driver = conn.connection.driver_connection
        assert driver is not None
        driver.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


class Database:
    """Engines and thread pools for one database URL."""

    def __init__(self, url: str) -> None:
        self.url = url
        parsed = make_url(url)
        self.dialect = parsed.get_backend_name()
        self._checkpointer: Checkpointer | None = None
        if self.dialect == "sqlite":
            if parsed.database:
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            file_backed = bool(parsed.database) and parsed.database != ":memory:"
            self.writer = _sqlite_engine(url, immediate=True, autocheckpoint=not file_backed)
            self.reader = _sqlite_engine(url, immediate=False, autocheckpoint=not file_backed)
            if file_backed:
                assert parsed.database is not None
                self._checkpointer = Checkpointer(parsed.database)
                self._checkpointer.start()
            write_threads, read_threads = 1, 4
        else:
            self.writer = create_engine(url, pool_size=16, max_overflow=16, pool_pre_ping=True)
            self.reader = self.writer
            write_threads, read_threads = 16, 8
        self._listeners: dict[str, list[Callable[[], None]]] = {}
        self._write_pool = ThreadPoolExecutor(write_threads, thread_name_prefix="db-write")
        self._read_pool = ThreadPoolExecutor(read_threads, thread_name_prefix="db-read")

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    def subscribe(self, topic: str, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` (on a database thread) after each commit that announced
        ``topic``; returns the function that unsubscribes it."""
        self._listeners.setdefault(topic, []).append(listener)
        return lambda: self._listeners.get(topic, []).remove(listener)

    def _after_commit(self, conn: Connection) -> Callable[[], None]:
        """Take the topics the transaction announced; returns what to call once it
        has committed (the subscribed listeners)."""
        topics = conn.info.pop(_AFTER_COMMIT, None) or ()
        listeners = [fn for topic in topics for fn in list(self._listeners.get(topic, ()))]

        def _notify() -> None:
            for listener in listeners:
                listener()

        return _notify

    def write_sync(self, fn: Callable[[Connection], T]) -> T:
        try:
            with self.writer.begin() as conn:
                try:
                    result = fn(conn)
                finally:
                    notify = self._after_commit(conn)
        except (OperationalError, DBAPIError) as exc:
            if _is_unavailable(exc):
                raise _translate(exc) from None
            raise
        notify()
        return result

    def read_sync(self, fn: Callable[[Connection], T]) -> T:
        try:
            with self.reader.begin() as conn:
                return fn(conn)
        except (OperationalError, DBAPIError) as exc:
            if _is_unavailable(exc):
                raise StoreUnavailable(_describe(exc)) from None
            raise

    async def write(self, fn: Callable[[Connection], T]) -> T:
        """One unit of work in one transaction; on SQLite on its one writer thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._write_pool, self.write_sync, fn)

    async def read(self, fn: Callable[[Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._read_pool, self.read_sync, fn)

    def dispose(self) -> None:
        self._write_pool.shutdown(wait=True)
        self._read_pool.shutdown(wait=True)
        if self._checkpointer is not None:
            self._checkpointer.stop()
        self.writer.dispose()
        if self.reader is not self.writer:
            self.reader.dispose()


def _translate(exc: BaseException) -> BaseException:
    """A driver error that means the database cannot be used becomes StoreUnavailable
    (without the driver's message, which can carry the URL); anything else as it is."""
    if isinstance(exc, OperationalError | DBAPIError) and _is_unavailable(exc):
        return StoreUnavailable(_describe(exc))
    return exc


def _is_unavailable(exc: DBAPIError) -> bool:
    if exc.connection_invalidated:
        return True
    text = str(exc.orig).lower()
    return any(
        needle in text
        for needle in (
            "database is locked",
            "unable to open database",
            "disk i/o error",
            "connection",
            "server closed",
            "could not connect",
            "terminating",
        )
    )


def _describe(exc: DBAPIError) -> str:
    # The driver's message can carry the URL with its password: keep only the class.
    return f"database unavailable ({type(exc.orig).__name__})"
