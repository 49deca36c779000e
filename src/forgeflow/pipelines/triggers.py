"""The trigger loops of a worker process: domain-event dispatcher and schedule clock.

Started beside the PipelineEngine (``Services.start``, roles worker and all). The
dispatcher wakes as soon as an event is committed — in this process through the
store's after-commit topic, from other processes through PostgreSQL ``LISTEN`` — and
otherwise polls slowly; the clock sleeps until the earliest ``next_fire_at``. Any
number of processes may run both against one database: events are claimed with
``SKIP LOCKED``, schedules move by compare-and-swap (``pipelines/firing.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from functools import partial

import structlog

from forgeflow.pipelines import firing
from forgeflow.pipelines.engine import PipelineEngine
from forgeflow.store import Store
from forgeflow.store import events as event_q
from forgeflow.store import triggers as tq
from forgeflow.store.types import utcnow

log = structlog.get_logger("forgeflow.pipelines.triggers")

# A batch that failed this many times in a row is consumed without its runs (audited),
# so one unreadable event cannot stop every later one.
MAX_BATCH_FAILURES = 3


class TriggerLoops:
    def __init__(
        self,
        store: Store,
        engine: PipelineEngine,
        *,
        poll_seconds: float = 5.0,
        batch: int = 100,
        gather_seconds: float = 0.25,
    ) -> None:
        self.store = store
        self.engine = engine
        self.poll_seconds = poll_seconds
        self.batch = batch
        # Woken by a commit, the dispatcher first lets the events of the moments after it
        # arrive: a task's moves each commit events, and a batch per move cost a write
        # transaction each on the path from a mention to its turn. No run waits for a
        # trigger to the millisecond.
        self.gather_seconds = gather_seconds
        self._events = asyncio.Event()
        self._clock = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._unsubscribe: list[Callable[[], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._failures = 0

    def wake(self) -> None:
        """New events or changed schedules: look now (safe from any thread)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(self._events.set)
        loop.call_soon_threadsafe(self._clock.set)

    def _wake_events(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._events.set)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._unsubscribe.append(self.store.db.subscribe(event_q.TOPIC, self._wake_events))
        self._tasks = [
            asyncio.create_task(self._dispatch_loop(), name="triggers.events"),
            asyncio.create_task(self._clock_loop(), name="triggers.schedules"),
        ]
        if self.store.dialect == "postgresql":
            self._tasks.append(asyncio.create_task(self._listen(), name="triggers.listen"))

    async def stop(self) -> None:
        self._stopping = True
        for unsubscribe in self._unsubscribe:
            with contextlib.suppress(ValueError):
                unsubscribe()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    # -- domain events --------------------------------------------------------------

    async def dispatch_once(self) -> firing.Fired:
        """One batch: claim, start runs, mark dispatched — one transaction."""
        fired = await self.store.write(partial(firing.dispatch_events, limit=self.batch))
        if fired.runs:
            self.engine.wake()
        return fired

    async def _dispatch_loop(self) -> None:
        while not self._stopping:
            self._events.clear()
            try:
                fired = await self.dispatch_once()
                self._failures = 0
                if fired.consumed >= self.batch:
                    continue  # more are waiting
            except Exception:
                log.exception("pipeline.dispatch_failed")
                await self._after_failure()
            await _sleep(self._events, self.poll_seconds)
            if self._events.is_set() and self.gather_seconds > 0:
                await asyncio.sleep(self.gather_seconds)

    async def _after_failure(self) -> None:
        self._failures += 1
        if self._failures < MAX_BATCH_FAILURES:
            return
        self._failures = 0
        with contextlib.suppress(Exception):
            seqs = await self.store.write(firing.give_up_oldest)
            log.warning("pipeline.dispatch_gave_up", seqs=seqs)

    async def _listen(self) -> None:
        """PostgreSQL LISTEN: events committed by other processes wake this one."""
        import psycopg

        delay = 0.5
        while not self._stopping:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.store.libpq_url(), autocommit=True
                ) as conn:
                    await conn.execute(f"LISTEN {event_q.EVENTS_CHANNEL}")
                    delay = 0.5
                    self._events.set()  # whatever came while we were not listening
                    async for _note in conn.notifies():
                        self._events.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("pipeline.listen_failed", error=type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    # -- schedules ------------------------------------------------------------------

    async def tick(self) -> firing.Fired:
        """One round of the clock: plan new schedules, fire due ones, forget disabled."""
        now = utcnow()
        work = firing.schedule_work(await self.store.read(tq.schedules), now)
        if not work:
            return firing.Fired()
        fired = await self.store.write(partial(firing.fire_schedules, seen=work, now=now))
        if fired.runs:
            self.engine.wake()
        return fired

    async def _clock_loop(self) -> None:
        while not self._stopping:
            self._clock.clear()
            delay = self.poll_seconds
            try:
                await self.tick()
                due = await self.store.read(tq.next_schedule_due)
                if due is not None:
                    delay = min(delay, max((due - utcnow()).total_seconds(), 0.01))
            except Exception:
                log.exception("pipeline.schedule_round_failed")
            await _sleep(self._clock, delay)


async def _sleep(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(seconds, 0.0)):
            await event.wait()
