"""The agent's own comments through its Gitea tools, made exactly once: the port the
``add_comment`` and ``edit_comment`` tools are given (``agent/gitea_tools``), built in
services.py next to the Publisher.

Each call resolves its session to the task whose turn runs there and writes a row of
the ``comments`` table before it touches Gitea (kind ``tool_post`` or ``tool_edit``,
keyed by the task and the text), and its result after. A row found still pending was
left by an attempt that died (or failed) after it may have reached Gitea: the call
looks there first, a bot comment with that text on the issue (a post) or the comment's
current text (an edit), and records what it finds instead of posting or editing again.
edit_comment's rule ("only a comment you posted in this session") reads the
``tool_post`` rows of the session's tasks, so it holds across restarts.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import Connection

from forgeflow.agent.gitea_tools.handlers import Posted, ToolRefused
from forgeflow.domain.bookkeeping import Comment
from forgeflow.domain.ids import sha256_ref, turn_key
from forgeflow.domain.markers import find_markers
from forgeflow.domain.records import Task
from forgeflow.domain.threads import Thread
from forgeflow.gitea.client import GiteaClient, GiteaError
from forgeflow.gitea.models import Comment as GiteaComment
from forgeflow.store import Store, tasks
from forgeflow.store import comments as comment_q
from forgeflow.tasks.threads import ReviewThreads

# Gitea's ``since`` is in whole seconds and the clocks of two hosts differ a little.
_SLACK = timedelta(minutes=5)


@dataclass
class _Slot:
    lock: asyncio.Lock
    users: int = 0


class ToolComments:
    def __init__(
        self,
        store: Store,
        gitea: GiteaClient,
        bot_login: str,
        threads: ReviewThreads | None = None,
    ) -> None:
        """``threads``: a task whose mention is a line comment of a review thread has
        its comments posted into that thread (``tasks/threads.py``)."""
        self._threads = threads
        self._store = store
        self._gitea = gitea
        self._bot = bot_login.lower()
        # One comment write at a time per session in this process: Codex may run two
        # tool calls at once, and the second must see the first's record, not race it.
        # (A session's turn runs in one process at a time: its task holds the lease.)
        self._slots: dict[str, _Slot] = {}

    async def post(self, session_key: str, body: str) -> Posted:
        async with self._one_at_a_time(session_key):
            task = await self._running(session_key)
            _own_markers_only(task, body)
            thread = await self._thread(task)
            inserted, row = await self._store.write(lambda c: _intend_post(c, task, body))
            if row.status == comment_q.SENT and row.comment_id is not None:
                return Posted(await self._comment(task, row.comment_id, thread), again=True)
            if not inserted:  # an earlier attempt may have posted it: look first
                found = await self._find_posted(task, [row], thread)
                if row.comment_key in found:
                    return Posted(found[row.comment_key], again=True)
            repo, number = task.resource.repo, task.resource.number
            try:
                if thread is not None:
                    assert self._threads is not None
                    created = await self._threads.post(task, thread, body)
                else:
                    created = await self._gitea.create_comment(repo.owner, repo.name, number, body)
            except GiteaError as exc:
                await self._failed(row.comment_key, str(exc), "post_failed")
                raise
            await self._sent(row.comment_key, created.id, "posted")
            return Posted(created, again=False)

    async def edit(self, session_key: str, comment_id: int, body: str) -> GiteaComment:
        async with self._one_at_a_time(session_key):
            task = await self._running(session_key)
            _own_markers_only(task, body)
            if not await self._posted_here(task, comment_id):
                raise ToolRefused(
                    f"comment {comment_id} was not posted by you in this session; you may "
                    "edit only comments you posted here with add_comment"
                )
            inserted, row = await self._store.write(
                lambda c: _intend_edit(c, task, comment_id, body)
            )
            repo = task.resource.repo
            if not inserted:
                # This text was set before in the task, or an attempt died around its
                # PATCH: the comment's text on Gitea says whether it is there already.
                current = await self._comment(task, comment_id, await self._thread(task))
                if sha256_ref(current.body.encode()) == row.body_hash:
                    await self._sent(row.comment_key, comment_id, "found")
                    return current
            try:
                edited = await self._gitea.edit_comment(repo.owner, repo.name, comment_id, body)
            except GiteaError as exc:
                await self._failed(row.comment_key, str(exc), "edit_failed")
                raise
            await self._sent(row.comment_key, comment_id, "edited")
            return edited

    @asynccontextmanager
    async def _one_at_a_time(self, session_key: str) -> AsyncIterator[None]:
        slot = self._slots.setdefault(session_key, _Slot(asyncio.Lock()))
        slot.users += 1
        try:
            async with slot.lock:
                yield
        finally:
            slot.users -= 1
            if slot.users == 0:
                del self._slots[session_key]

    async def _thread(self, task: Task) -> Thread | None:
        return None if self._threads is None else await self._threads.locate(task)

    async def _running(self, session_key: str) -> Task:
        task = await self._store.read(lambda c: tasks.running_in_session(c, session_key))
        if task is None:
            raise ToolRefused("no turn of this session is running")
        return task

    async def _posted_here(self, task: Task, comment_id: int) -> bool:
        key = task.session_key

        def posted(c: Connection) -> bool:
            return comment_q.posted_in_session(c, key, comment_id)

        if await self._store.read(posted):
            return True
        # A post whose record a crash took: settle the session's pending ones by looking.
        pending = await self._store.read(lambda c: comment_q.pending_posts_in_session(c, key))
        if not pending:
            return False
        await self._find_posted(task, pending, await self._thread(task))
        return bool(await self._store.read(posted))

    async def _find_posted(
        self, task: Task, rows: list[Comment], thread: Thread | None = None
    ) -> dict[str, GiteaComment]:
        """The bot's comments on the task's issue (or in its review thread) carrying the
        text of ``rows`` (pending posts), recorded as sent; by comment key."""
        repo, number = task.resource.repo, task.resource.number
        since = min(r.created_at for r in rows) - _SLACK
        wanted = {r.body_hash: r.comment_key for r in rows}
        found: dict[str, GiteaComment] = {}
        if thread is not None and self._threads is not None:
            candidates = await self._threads.comments(task, thread)
        else:
            candidates = await self._gitea.list_comments(repo.owner, repo.name, number, since=since)
        for c in candidates:
            key = wanted.get(sha256_ref(c.body.encode()))
            if c.user.login.lower() == self._bot and key is not None and key not in found:
                found[key] = c
        for key, c in found.items():
            await self._sent(key, c.id, "found")
        return found

    async def _comment(
        self, task: Task, comment_id: int, thread: Thread | None = None
    ) -> GiteaComment:
        if thread is not None and self._threads is not None:
            # GET /issues/comments/{id} answers 204 for a code comment: read the thread.
            for c in await self._threads.comments(task, thread):
                if c.id == comment_id:
                    return c
        repo = task.resource.repo
        return await self._gitea.comment(repo.owner, repo.name, comment_id)

    async def _sent(self, key: str, comment_id: int, how: str) -> None:
        await self._store.write(
            lambda c: comment_q.record_result(
                c, key, status=comment_q.SENT, comment_id=comment_id, how=how
            )
        )

    async def _failed(self, key: str, error: str, how: str) -> None:
        # Left pending: Gitea may have done it before the error reached us, so the next
        # call with this text looks first.
        await self._store.write(
            lambda c: comment_q.record_result(
                c, key, status=comment_q.PENDING, comment_id=None, error=error, how=how
            )
        )


def _own_markers_only(task: Task, body: str) -> None:
    """Refuse a text that carries another task's hidden marker: verification and the
    retries find a task's answer by its marker, so an agent that read a queued task's
    receipt could otherwise post that task's "answer" before its turn ever ran."""
    for marker in find_markers(body):
        if marker.task_id != task.task_id or marker.resource_key != task.resource_key:
            raise ToolRefused(
                "the text carries the hidden marker of another task; end your answer with "
                "the marker you were given for this turn, and no other"
            )


def _intend(conn: Connection, task: Task, key: str, kind: str, body: str) -> tuple[bool, Comment]:
    return comment_q.record_intent(
        conn,
        comment_key=key,
        task_id=task.task_id,
        kind=kind,
        resource_key=task.resource_key,
        turn_key=turn_key(task.task_id, int(task.turn_count)),  # the turn running now
        body_hash=sha256_ref(body.encode()),
    )


def _intend_post(conn: Connection, task: Task, body: str) -> tuple[bool, Comment]:
    key = comment_q.tool_post_key(task.task_id, body)
    return _intend(conn, task, key, comment_q.TOOL_POST, body)


def _intend_edit(conn: Connection, task: Task, comment_id: int, body: str) -> tuple[bool, Comment]:
    key = comment_q.tool_edit_key(task.task_id, comment_id, body)
    return _intend(conn, task, key, comment_q.TOOL_EDIT, body)
