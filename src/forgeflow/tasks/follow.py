"""A running turn's events: each recorded once, in order, and an operator's abort.

:class:`TurnFollower` reads the runtime's events of one turn until ``turn/completed``;
every event advances the turn's ``eventSeq`` in the transaction that records it, so a
notification delivered twice is recorded once. The turn's end itself is recorded by
the caller, with the task's next move (one commit).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection

from forgeflow.agent.port import (
    AgentError,
    AgentRuntime,
    NeedsUser,
    Notice,
    TokenUsage,
    ToolCall,
    Transcribed,
    TurnCompleted,
    TurnHandle,
)
from forgeflow.domain import options
from forgeflow.domain.budgets import Budgets
from forgeflow.domain.markers import parse_marker
from forgeflow.domain.records import Task
from forgeflow.redaction import redact
from forgeflow.store import Store, audit, transcripts, usage
from forgeflow.store import turns as turn_q
from forgeflow.tasks.abort_watch import AbortWatch
from forgeflow.tasks.moves import task_event
from forgeflow.tasks.tracking import Tracker


def _asks_user(call: ToolCall, task_id: str) -> bool:
    """A comment the agent posted whose marker says it waits for the user."""
    body = call.arguments.get("body")
    marker = parse_marker(body) if call.ok and isinstance(body, str) else None
    return marker is not None and marker.task_id == task_id and marker.state == "waiting_user"


class TurnFollower:
    def __init__(
        self,
        store: Store,
        runtime: AgentRuntime,
        aborts: AbortWatch,
        *,
        abort_timeout: float,
        budgets: Budgets,
        tracker: Tracker | None = None,
    ) -> None:
        self.store = store
        self.runtime = runtime
        self.aborts = aborts
        # How long an aborted turn may take to stop before the task fails.
        self.abort_timeout = abort_timeout
        self.budgets = budgets
        self.tracker = tracker  # edits the receipt as the turn goes (tracking.py)

    async def follow(
        self, task: Task, key: str, handle: TurnHandle
    ) -> tuple[TurnCompleted | None, NeedsUser | None, bool, bool]:
        """The turn's end as seen: its completion (None: it did not stop in time), the
        agent's question, whether an operator aborted it and whether the task's own
        token cap (``--max-tokens``) stopped it."""
        completed: TurnCompleted | None = None
        needs_user: NeedsUser | None = None
        aborted = asyncio.Event()
        capped = False
        stopping: asyncio.Task[None] | None = None
        watcher = asyncio.create_task(self._watch_abort(task.task_id, handle, aborted))
        if self.tracker is not None:
            self.tracker.begin(task)
        try:
            async with asyncio.timeout(None) as scope:
                async for event in self.runtime.events(handle):
                    if isinstance(event, TurnCompleted):
                        # Its eventSeq goes with the turn's end (one commit, in turn.py).
                        completed = event
                        break
                    if not await self.store.write(self.recorder(task, handle, key, event)):
                        continue  # a duplicate notification: handled once already
                    if self.tracker is not None:
                        self.tracker.saw(task.task_id, event)
                    if isinstance(event, TokenUsage) and not capped and await self._over_cap(task):
                        # Like an abort: the turn is interrupted (beside this loop, which
                        # reads on) and has a while to stop.
                        capped = True
                        aborted.set()
                        stopping = asyncio.create_task(self._interrupt(handle))
                    if isinstance(event, NeedsUser):
                        needs_user = event
                    elif isinstance(event, ToolCall) and _asks_user(event, task.task_id):
                        # The agent already posted its question; nothing to post for it.
                        needs_user = NeedsUser(event.seq, "")
                    if aborted.is_set() and scope.when() is None:
                        scope.reschedule(asyncio.get_running_loop().time() + self.abort_timeout)
        except TimeoutError:
            completed = None
        finally:
            if self.tracker is not None:
                await self.tracker.end(task.task_id)
            for helper in (watcher, stopping):
                if helper is not None:
                    helper.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await helper
        return completed, needs_user, aborted.is_set() and not capped, capped

    async def _interrupt(self, handle: TurnHandle) -> None:
        with contextlib.suppress(AgentError):
            await self.runtime.interrupt(handle)

    async def _over_cap(self, task: Task) -> bool:
        """Whether the task's tokens reached its own cap (never without one)."""
        if task.max_tokens is None:
            return False
        used = await self.store.read(lambda c: usage.task_tokens(c, task.task_id))
        return options.cap_reached(task.max_tokens, used)

    async def _watch_abort(self, task_id: str, handle: TurnHandle, flag: asyncio.Event) -> None:
        await self.aborts.wait(task_id)
        flag.set()
        with contextlib.suppress(AgentError):
            await self.runtime.interrupt(handle)

    def recorder(
        self, task: Task, handle: TurnHandle, key: str, event: Any
    ) -> Callable[[Connection], bool]:
        """The unit of work of one runtime event: advance ``eventSeq`` (False for a
        duplicate, which records nothing) and record the event, in one transaction."""
        row: audit.AuditEvent | None = None
        if isinstance(event, ToolCall):
            row = task_event(
                task,
                "mcp.call",
                turn_id=handle.turn_id,
                comment_id=event.comment_id,
                error_code=None if event.ok else "mcp_call_failed",
                metadata={
                    "tool": event.tool,
                    "arguments": redact(event.arguments),
                    "ok": event.ok,
                    "error": event.error,
                },
            )
        elif isinstance(event, NeedsUser):
            row = task_event(
                task,
                "turn.needs_user",
                turn_id=handle.turn_id,
                metadata={"question": event.question[:2000]},
            )
        elif isinstance(event, Notice):
            row = task_event(task, event.action, turn_id=handle.turn_id, metadata=event.metadata)

        def unit(c: Connection) -> bool:
            if not turn_q.event_seen(c, turn_key=key, seq=event.seq):
                return False
            if row is not None:
                audit.append(c, row)
            elif isinstance(event, TokenUsage):
                added = turn_q.add_tokens(
                    c,
                    key,
                    task.task_id,
                    event.input_tokens,
                    event.output_tokens,
                    cached_input_tokens=event.cached_input_tokens,
                )
                usage.note_tokens(c, task.repo_key, added, self.budgets)
            elif isinstance(event, Transcribed):
                transcripts.record(
                    c,
                    task_id=task.task_id,
                    turn_id=handle.turn_id,
                    item_id=event.item_id,
                    entry=event.entry,
                )
            return True

        return unit
