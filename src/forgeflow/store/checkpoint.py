"""WAL checkpoints off the writer thread (SQLite only).

SQLite's automatic checkpoint runs inside the commit that crosses the threshold: it
copies the WAL back into the database file and fsyncs it, while every other write
waits behind it on our single writer thread. Under a steady stream of webhooks that
is a stall every fraction of a second, the tail of the ingest latency. Here the
writer connections never checkpoint (``wal_autocheckpoint=0``) and this thread runs a
PASSIVE checkpoint, which never blocks writers or readers, twice a second.
"""

from __future__ import annotations

import sqlite3
import threading

import structlog

log = structlog.get_logger("forgeflow.store")

INTERVAL_SECONDS = 0.5


class Checkpointer:
    def __init__(self, path: str, interval: float = INTERVAL_SECONDS) -> None:
        self._path = path
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="db-checkpoint", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.checkpoint()  # what the last interval left, so the WAL ends small

    def checkpoint(self) -> None:
        try:
            conn = sqlite3.connect(self._path, timeout=5, check_same_thread=False)
        except sqlite3.Error:
            return
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:  # busy or gone: the next round tries again
            log.debug("store.checkpoint_skipped", error=type(exc).__name__)
        finally:
            conn.close()

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while not self._stop.wait(self._interval):
                try:
                    if conn is None:
                        conn = sqlite3.connect(self._path, timeout=5, check_same_thread=False)
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error as exc:
                    log.debug("store.checkpoint_skipped", error=type(exc).__name__)
        finally:
            if conn is not None:
                conn.close()
