"""Whose turn it is to post a bot comment (``tasks/replies.py`` posts it): its intent
written now, taken over from a poster that cannot still be posting, found already
posted, or held by another poster. The posts in flight in this process are kept here,
so a caller waiting for another poster's result wakes when it lands."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from functools import partial

from sqlalchemy import Connection

from forgeflow.domain.bookkeeping import Comment
from forgeflow.store import Store, workers
from forgeflow.store import comments as comment_q
from forgeflow.store.types import utcnow

# How long a pending intent belongs to its poster before another may take it over.
IN_FLIGHT = timedelta(seconds=60)


class How(Enum):
    """Whose the post of a comment is."""

    OURS = "ours"  # this call writes or took over the intent: it posts
    POSTED = "posted"  # already posted (by whoever): nothing to do
    BUSY = "busy"  # another poster holds the intent


@dataclass(frozen=True, slots=True)
class PostClaim:
    """The answer of :meth:`CommentIntents.claim`."""

    how: How
    comment_id: int | None = None
    taken: bool = False  # taken over: the earlier poster may have posted; look first


class CommentIntents:
    def __init__(self, store: Store, workers_ttl: timedelta | None) -> None:
        """``workers_ttl``: how long a worker whose heartbeat stopped counts as live
        (the lease period); without it an abandoned intent waits IN_FLIGHT."""
        self._store = store
        self._workers_ttl = workers_ttl
        # Posts in flight in this process, by comment key.
        self._posting: dict[str, asyncio.Future[None]] = {}

    async def claim(
        self, key: str, intent: Callable[[Connection], tuple[bool, Comment]], wait: bool
    ) -> PostClaim:
        """The intent to post ``key``: written now, taken over from a poster that cannot
        still be posting, found already posted, or (after waiting, with ``wait``)
        still held by another poster."""
        loop = asyncio.get_running_loop()
        # A live poster's attempt (a look and a post, each bounded by the Gitea client's
        # timeout) settles well within IN_FLIGHT, after which its intent may be taken.
        deadline = loop.time() + (IN_FLIGHT.total_seconds() + 1.0 if wait else 0.0)
        looked = False
        while True:
            inserted, row = await self._store.write(intent)
            if row.status in (comment_q.SENT, comment_q.CONFIRMED):
                return PostClaim(How.POSTED, row.comment_id)
            if inserted:
                return PostClaim(How.OURS)
            if await self._store.write(partial(self._take_over, key=key)):
                return PostClaim(How.OURS, taken=True)
            if loop.time() >= deadline:
                return PostClaim(How.BUSY)
            ours = self._posting.get(key)
            if ours is not None:
                await asyncio.wait([ours], timeout=max(deadline - loop.time(), 0.0))
            elif looked:  # another process posts it
                await asyncio.sleep(0.25)
            # else: our own poster may have finished just now; look again at once
            looked = True

    def _take_over(self, conn: Connection, key: str) -> bool:
        """Take a pending intent over when its poster cannot still be posting: it went
        quiet for IN_FLIGHT, or it was written before every live worker started (its
        process was killed: a restart must not wait IN_FLIGHT, or a task that ends
        sooner than that would never get its receipt)."""
        stale = utcnow() - IN_FLIGHT
        if self._workers_ttl is not None:
            oldest = workers.oldest_live_start(conn, self._workers_ttl)
            if oldest is not None and oldest > stale:
                stale = oldest
        return comment_q.take_over(conn, key, stale_before=stale)

    @contextmanager
    def posting(self, key: str) -> Iterator[None]:
        """While this process posts ``key``: a :meth:`claim` waiting on it wakes at its end."""
        done = asyncio.get_running_loop().create_future()
        self._posting[key] = done
        try:
            yield
        finally:
            self._posting.pop(key, None)
            done.set_result(None)
