"""The receipt as a tracking comment, edited while the task moves.

During a turn the follower hands every event to :class:`Tracker`; it keeps the agent's
plan, what it does now and the tokens, and edits the receipt at most once per
``every_seconds`` (the events themselves never wait for Gitea: the edit runs beside
them). The outbox asks for the final edit once the task has ended (or waits for the
user). An edit is a PATCH of the whole body, so the record is the last body sent: a
lost or repeated edit is harmless, and once the final edit is recorded nothing else is
sent (the turn's edits are all settled before the task can end: ``end`` awaits them).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from dataclasses import dataclass
from functools import partial

import structlog
from sqlalchemy import Connection

from forgeflow.agent.port import AgentEvent, Progress, TokenUsage
from forgeflow.domain.ids import turn_key
from forgeflow.domain.markers import Marker, MarkerKind, append_marker
from forgeflow.domain.options import receipt_line
from forgeflow.domain.prices import Prices, Usage
from forgeflow.domain.records import Task
from forgeflow.domain.states import TERMINAL_STATES, TaskState
from forgeflow.domain.tracking import View, render
from forgeflow.gitea.client import GiteaClient, GiteaError
from forgeflow.store import Store, outbox
from forgeflow.store.comments import CONFIRMED
from forgeflow.tasks.replies import RECEIPT_TEXT, Replies

log = structlog.get_logger("forgeflow.tasks.tracking")

S = TaskState
_ANSWERED = {S.SUCCEEDED, S.SUCCEEDED_WITH_REST_FALLBACK}


@dataclass(eq=False)
class _Live:
    task: Task
    started: float
    plan: tuple[tuple[str, str], ...] = ()
    doing: str | None = "starting"
    tokens: tuple[int, int] = (0, 0)
    sent_at: float = -math.inf
    dirty: bool = False
    flusher: asyncio.Task[None] | None = None


def outcome_of(task: Task) -> str | None:
    """What the final edit says the task came to (None while it is still moving)."""
    state = S(task.state)
    if state in _ANSWERED:
        return "已回复，见下方 / answered below"
    if state is S.WAITING_USER:
        return "等待你的回复 / waiting for you"
    if state in TERMINAL_STATES:
        return outbox.result_text(task)
    return None


class Tracker:
    def __init__(
        self,
        store: Store,
        gitea: GiteaClient,
        replies: Replies,
        *,
        every_seconds: float,
        prices: Prices | None = None,
        default_model: str | None = None,
    ) -> None:
        self.store = store
        self.gitea = gitea
        self.replies = replies
        self.every = every_seconds
        self.prices = prices or Prices()
        self.default_model = default_model  # the model of a task without ``--model``
        self._live: dict[str, _Live] = {}

    def begin(self, task: Task) -> None:
        """A turn of ``task`` starts: follow its events. The first edit waits one
        interval like every later one: at the turn's start the receipt already says
        enough, and an edit then would compete with the turn's own first requests."""
        now = asyncio.get_running_loop().time()
        live = _Live(task, now, sent_at=now)
        self._live[task.task_id] = live
        self._soon(live)

    def saw(self, task_id: str, event: AgentEvent) -> None:
        live = self._live.get(task_id)
        if live is None:
            return
        if isinstance(event, Progress):
            if event.plan is not None:
                live.plan = event.plan
            if event.doing is not None:
                live.doing = event.doing
        elif isinstance(event, TokenUsage):
            live.tokens = (event.input_tokens, event.output_tokens)
        else:
            return
        self._soon(live)

    async def end(self, task_id: str) -> None:
        """The turn is over: what it last showed goes out now (the edit waiting for its
        slot, at once), and nothing more for it after this returns."""
        live = self._live.pop(task_id, None)
        if live is None:
            return
        if live.flusher is not None:
            live.flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await live.flusher
        if live.dirty:
            await self._send(live)

    def _soon(self, live: _Live) -> None:
        live.dirty = True
        if live.flusher is None or live.flusher.done():
            live.flusher = asyncio.create_task(self._flush(live))

    async def _flush(self, live: _Live) -> None:
        loop = asyncio.get_running_loop()
        while live.dirty:
            # Coalesced: whatever arrived while waiting goes out in one edit.
            delay = live.sent_at + self.every - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._send(live)

    async def _send(self, live: _Live) -> None:
        loop = asyncio.get_running_loop()
        live.dirty = False
        live.sent_at = loop.time()
        task = live.task
        view = View(
            header=RECEIPT_TEXT,
            options=receipt_line(task.model, task.max_tokens),
            plan=live.plan,
            doing=live.doing,
            elapsed_seconds=loop.time() - live.started,
            input_tokens=task.input_tokens + live.tokens[0],
            output_tokens=task.output_tokens + live.tokens[1],
            link=self.replies.link(task),
        )
        await self._edit(task, view, state=S.RUNNING.value, final=False)

    async def final(self, task: Task) -> None:
        """The receipt's edit for a task that ended (final) or waits for the user."""
        outcome = outcome_of(task)
        if outcome is None:
            return
        where = [f"分支 / branch: `{b}`" for b in await self._branches(task)]
        usage = Usage(task.input_tokens, task.output_tokens, task.cached_input_tokens)
        if task.refs is not None:
            where.append(f"拉取请求 / pull request: #{task.resource.number}")
        view = View(
            header=RECEIPT_TEXT,
            options=receipt_line(task.model, task.max_tokens),
            elapsed_seconds=(task.updated_at - task.created_at).total_seconds(),
            input_tokens=task.input_tokens,
            output_tokens=task.output_tokens,
            cost=self.prices.shown(task.model or self.default_model, usage),
            outcome=outcome,
            where=tuple(where),
            link=self.replies.link(task),
        )
        await self._edit(task, view, state=task.state, final=S(task.state) in TERMINAL_STATES)

    async def _branches(self, task: Task) -> list[str]:
        return await self.store.read(partial(outbox.pushed_branches, task_id=task.task_id))

    async def _edit(self, task: Task, view: View, *, state: str, final: bool) -> None:
        def look(c: Connection) -> tuple[int | None, bool]:
            row = outbox.tracking(c, task.task_id)
            return outbox.receipt_id(c, task.task_id), row is not None and row.status == CONFIRMED

        comment_id, finished = await self.store.read(look)
        if comment_id is None or finished:
            return  # no receipt yet (or a draft's: none), or the final edit is out
        marker = Marker(
            task.task_id, turn_key(task.task_id, 0), task.resource_key, MarkerKind.RECEIPT
        )
        body = append_marker(render(view), marker)
        repo = task.resource.repo
        try:
            await self.gitea.edit_comment(repo.owner, repo.name, comment_id, body)
        except GiteaError as exc:
            # A lost edit is harmless: the next one carries the whole body.
            log.info("tracking.edit_failed", task_id=task.task_id, error=str(exc))
            return
        await self.store.write(
            partial(
                outbox.note_tracking,
                task=task,
                comment_id=comment_id,
                body=body,
                state=state,
                final=final,
            )
        )
