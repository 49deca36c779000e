"""Operators' aborts reaching running turns: one poll for all the turns of a process.

An abort is a state change written by whichever process took the request (API, CLI);
the process running the turn learns it from the database. One query a second names
the aborted ones among all the turns this process runs, instead of one query per turn
per second (a hundred running turns made a hundred reads a second).
"""

from __future__ import annotations

import asyncio
import contextlib
from functools import partial

import structlog

from forgeflow.store import Store
from forgeflow.store import tasks as task_q

log = structlog.get_logger("forgeflow.tasks.abort_watch")


class AbortWatch:
    def __init__(self, store: Store, interval: float = 1.0) -> None:
        self._store = store
        # An abort reaches its turn within ``interval`` (abort_timeout counts from then).
        self._interval = interval
        self._watched: dict[str, asyncio.Event] = {}
        self._poller: asyncio.Task[None] | None = None

    async def wait(self, task_id: str) -> None:
        """Return once ``task_id`` is in ``aborting`` (cancel to stop watching)."""
        flag = asyncio.Event()
        self._watched[task_id] = flag
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name="abort-watch")
        try:
            await flag.wait()
        finally:
            if self._watched.get(task_id) is flag:
                del self._watched[task_id]
            if not self._watched and self._poller is not None:
                self._poller.cancel()
                self._poller = None

    async def _poll(self) -> None:
        # No await between the emptiness check and the return: a watcher added later
        # finds this poller done and starts another.
        while self._watched:
            await asyncio.sleep(self._interval)
            ids = list(self._watched)
            if not ids:
                continue
            try:
                aborted = await self._store.read(partial(task_q.aborting_among, task_ids=ids))
            except Exception as exc:
                log.warning("abort_watch.poll_failed", error=type(exc).__name__)
                continue
            for task_id in aborted:
                flag = self._watched.get(task_id)
                if flag is not None:
                    flag.set()

    async def aclose(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
