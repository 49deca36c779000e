"""The bot's comments on Gitea, each posted exactly once: the receipt, questions,
results, fallbacks, answers to commands.

Every comment is recorded as an intent before it is posted and as a result after. A
retry first looks in Gitea for the comment's marker, so a crash between the POST and
its record never produces a second comment; and an intent left by a killed process is
taken over, not waited out, so a crash never loses a comment either.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol
from urllib.parse import quote

import structlog
from sqlalchemy import Connection

from forgeflow.domain.bookkeeping import Comment
from forgeflow.domain.ids import RepoRef, parse_resource_key, sha256_ref, turn_key
from forgeflow.domain.markers import Marker, MarkerKind, append_marker, parse_marker
from forgeflow.domain.options import receipt_line
from forgeflow.domain.records import Task
from forgeflow.domain.threads import Thread
from forgeflow.gitea.client import GiteaClient, GiteaError
from forgeflow.gitea.models import Comment as GiteaComment
from forgeflow.store import Store
from forgeflow.store import comments as comment_q
from forgeflow.store.db import Unit
from forgeflow.store.types import utcnow
from forgeflow.tasks.comment_intents import IN_FLIGHT, CommentIntents, How
from forgeflow.tasks.threads import ReviewThreads

log = structlog.get_logger("forgeflow.tasks.replies")

RECEIPT_TEXT = "giteabot: 已收到"
_ANSWERS = frozenset({MarkerKind.FINAL, MarkerKind.FALLBACK})


@dataclass(frozen=True, slots=True)
class Posted:
    """A comment posted once: its id (None: another poster holds the intent right now)
    and, when the caller writes it with its own next commit, the record of the post
    just made (until then the intent stays pending: a later poster looks first)."""

    comment_id: int | None
    record: Unit | None = None


class About(Protocol):
    """What a comment is about: a task, or the answer to a comment command."""

    @property
    def task_id(self) -> str: ...
    @property
    def repo_key(self) -> str: ...
    @property
    def resource_key(self) -> str: ...
    @property
    def created_at(self) -> datetime: ...


@dataclass(frozen=True, slots=True)
class _CommandAnswer:
    task_id: str
    repo_key: str
    resource_key: str
    created_at: datetime


def _where(task: About) -> tuple[RepoRef, int]:
    resource = parse_resource_key(task.resource_key)
    return resource.repo, resource.number


class Replies:
    def __init__(
        self,
        store: Store,
        gitea: GiteaClient,
        bot_login: str,
        *,
        workers_ttl: timedelta | None = None,
        public_url: str | None = None,
        threads: ReviewThreads | None = None,
    ) -> None:
        """``workers_ttl``: how long a worker whose heartbeat stopped counts as live
        (the lease period); without it an abandoned intent waits IN_FLIGHT.
        ``public_url`` (FORGEFLOW_PUBLIC_URL): where people reach forgeflow; with it the
        bot's comments link to the task's page. ``threads``: a mention in a review
        thread is answered there (its answer, and its fallback, are looked for and
        posted in the thread; ``tasks/threads.py``)."""
        self._threads = threads
        self._public_url = public_url.rstrip("/") if public_url else None
        self._store = store
        self._intents = CommentIntents(store, workers_ttl)
        self._gitea = gitea
        self._bot = bot_login.lower()

    async def marked(
        self, task: About, kinds: AbstractSet[MarkerKind], turn: str | None
    ) -> list[GiteaComment]:
        """The bot's comments about ``task`` whose marker is of one of ``kinds`` (and of
        ``turn``, when given): what a poster looks for before posting again, and what
        verification looks for (``verify.py``). A thread task's answers are looked for
        in its review thread."""
        thread = await self._thread(task, kinds)
        if thread is not None:
            assert isinstance(task, Task) and self._threads is not None
            candidates = await self._threads.comments(task, thread)
        else:
            repo, number = _where(task)
            since = task.created_at - timedelta(minutes=5)
            candidates = await self._gitea.list_comments(repo.owner, repo.name, number, since=since)
        found = []
        for comment in candidates:
            if comment.user.login.lower() != self._bot:
                continue
            marker = parse_marker(comment.body)
            if (
                marker is not None
                and marker.task_id == task.task_id
                and marker.resource_key == task.resource_key
                and marker.kind in kinds
                and (turn is None or marker.turn_key == turn)
            ):
                found.append(comment)
        return found

    async def _thread(self, task: About, kinds: AbstractSet[MarkerKind]) -> Thread | None:
        """The review thread a task's answer goes into (its final or fallback comment;
        the receipt and result stay in the timeline), or None."""
        if self._threads is None or not isinstance(task, Task) or not kinds & _ANSWERS:
            return None
        return await self._threads.locate(task)

    async def post_once(
        self,
        task: About,
        *,
        key: str,
        kind: MarkerKind,
        text: str,
        turn: str | None = None,
        wait_in_flight: bool = False,
        defer: bool = False,
    ) -> Posted:
        """Post ``text`` with its marker exactly once per ``key``.

        A comment id of ``None`` means another poster holds the intent right now; with
        ``wait_in_flight`` this call waits (bounded) for that poster's result, or takes
        the intent over once that poster cannot still be posting. ``defer``: the record
        of a comment just posted is returned for the caller to write with its next
        commit instead of in one of its own.
        """
        marker = Marker(task.task_id, turn or turn_key(task.task_id, 0), task.resource_key, kind)
        body = append_marker(text, marker)

        def intent(c: Connection) -> tuple[bool, Comment]:
            return comment_q.record_intent(
                c,
                comment_key=key,
                task_id=task.task_id,
                kind=kind.value,
                resource_key=task.resource_key,
                turn_key=marker.turn_key,
                body_hash=sha256_ref(body.encode()),
            )

        claim = await self._intents.claim(key, intent, wait_in_flight)
        if claim.how is not How.OURS:
            return Posted(claim.comment_id)
        with self._intents.posting(key):
            return await self._post(
                task, key, body, marker, kind, look_first=claim.taken, defer=defer
            )

    async def _post(
        self,
        task: About,
        key: str,
        body: str,
        marker: Marker,
        kind: MarkerKind,
        *,
        look_first: bool,
        defer: bool,
    ) -> Posted:
        # An intent taken over may be left from a run that died after posting: look
        # first. A fresh intent cannot: nothing is posted before its intent is written.
        earlier = await self.marked(task, {kind}, marker.turn_key) if look_first else []
        if earlier:
            comment_id = earlier[0].id
            await self._store.write(
                lambda c: comment_q.record_result(
                    c, key, status=comment_q.SENT, comment_id=comment_id, how="found"
                )
            )
            return Posted(comment_id)
        repo, number = _where(task)
        thread = await self._thread(task, {kind})
        try:
            if thread is not None:
                assert isinstance(task, Task) and self._threads is not None
                created = await self._threads.post(task, thread, body)
            else:
                created = await self._gitea.create_comment(repo.owner, repo.name, number, body)
        except GiteaError as exc:
            error = str(exc)
            # Left pending and aged, so a later attempt looks in Gitea before posting.
            await self._store.write(
                lambda c: comment_q.record_result(
                    c,
                    key,
                    status=comment_q.PENDING,
                    comment_id=None,
                    error=error,
                    how="post_failed",
                    age=IN_FLIGHT,
                )
            )
            raise
        comment_id = created.id
        posted_at = utcnow()

        def record(c: Connection) -> None:
            comment_q.record_result(
                c, key, status=comment_q.SENT, comment_id=comment_id, at=posted_at
            )

        if defer:
            return Posted(comment_id, record)
        await self._store.write(record)
        return Posted(comment_id)

    def link(self, task: About) -> str:
        """The line that points people in Gitea at the task's page ("" without a public
        URL). The page asks whoever opens it to sign in as an operator."""
        if self._public_url is None:
            return ""
        url = f"{self._public_url}/ui/tasks/{quote(task.task_id, safe='')}"
        return f"[任务详情 / Task details]({url})"

    def _with_link(self, text: str, task: About) -> str:
        link = self.link(task)
        return f"{text}\n\n{link}" if link else text

    async def receipt(
        self,
        task: Task,
        *,
        queue_position: int | None = None,
        wait_in_flight: bool = False,
        defer: bool = False,
    ) -> Posted:
        text = RECEIPT_TEXT
        if queue_position:
            text += (
                f"（前面还有 {queue_position} 个任务 / {queue_position} task(s) ahead "
                "in this repository's queue）"
            )
        chosen = receipt_line(task.model, task.max_tokens)
        if chosen:
            text += "\n" + chosen
        return await self.post_once(
            task,
            key=f"{task.task_id}:receipt",
            kind=MarkerKind.RECEIPT,
            text=self._with_link(text, task),
            wait_in_flight=wait_in_flight,
            defer=defer,
        )

    async def question(self, task: Task, question: str) -> int | None:
        """The agent's question to the user (``item/tool/requestUserInput``)."""
        posted = await self.post_once(
            task, key=f"{task.task_id}:question", kind=MarkerKind.RESULT, text=question
        )
        return posted.comment_id

    async def result(self, task: Task, text: str) -> int | None:
        """The at most one result comment of a failed, cancelled or aborted task."""
        posted = await self.post_once(
            task,
            key=f"{task.task_id}:result",
            kind=MarkerKind.RESULT,
            text=self._with_link(f"giteabot: {text}", task),
        )
        return posted.comment_id

    async def command_reply(self, row: Comment) -> int | None:
        """Post the answer to a comment command, written by the acceptance transaction."""
        about = _CommandAnswer(
            task_id=row.task_id,
            repo_key=parse_resource_key(row.resource_key).repo.key,
            resource_key=row.resource_key,
            created_at=row.created_at,
        )
        posted = await self.post_once(
            about,
            key=row.comment_key,
            kind=MarkerKind.RESULT,
            text=row.body or "",
            turn=row.turn_key,
        )
        return posted.comment_id

    async def add_note(self, task: Task, comment_id: int | None, body: str, note: str) -> bool:
        """Add ``note`` to a verified answer (``body``: the comment as verification read
        it), above its marker line (which must stay last); once: a note already there
        is not added again. False if Gitea refused."""
        if comment_id is None or note in body:
            return True
        text, _, marker = body.rstrip("\n").rpartition("\n")
        repo, _number = _where(task)
        try:
            await self._gitea.edit_comment(
                repo.owner, repo.name, comment_id, f"{text}\n\n{note}\n{marker}"
            )
        except GiteaError:
            return False
        return True

    async def fallback(self, task: Task, turn: str, text: str) -> int | None:
        posted = await self.post_once(
            task,
            key=f"{task.task_id}:fallback:{turn}",
            kind=MarkerKind.FALLBACK,
            text=self._with_link(text, task),
            turn=turn,
        )
        return posted.comment_id
