"""Pull request reviews, exactly one per review task: the port the ``submit_review``
tool is given (``agent/gitea_tools``, built in services.py), and the verification's
fallback when the agent never called it.

forgeflow, not the agent, posts the review: the agent's draft (summary and line
comments) is placed on the pull request's diff at the reviewed head (fetched here with
the bot's token and parsed with bounds, ``domain/reviews.py``), a comment on a line the
diff does not show is moved into the summary, and the whole request is written as the
intent (a ``comments`` row of kind ``review``, keyed by the task, the request's JSON as
its body) before ``POST /pulls/{n}/reviews``; its result (the review's id) after. A
pending intent was left by an attempt that may have reached Gitea: the pull request's
reviews are listed and the one whose body carries the task's marker is recorded
instead of posting again; only when none does is the stored request posted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import Connection

from forgeflow.agent.gitea_tools.handlers import ToolRefused
from forgeflow.domain import modes
from forgeflow.domain import reviews as r
from forgeflow.domain.bookkeeping import Comment
from forgeflow.domain.gitea_versions import renders_suggestions
from forgeflow.domain.ids import sha256_ref, turn_key
from forgeflow.domain.markers import Marker, MarkerKind, parse_marker
from forgeflow.domain.records import Task
from forgeflow.domain.review_record import PostedLine, ReviewRecord
from forgeflow.domain.states import TaskState
from forgeflow.gitea.client import GiteaClient, GiteaError
from forgeflow.gitea.reviews import PullReview, ReviewLine, ReviewRequest
from forgeflow.store import Store, tasks
from forgeflow.store import comments as comment_q
from forgeflow.store import reviews as review_q
from forgeflow.tasks.moves import TaskMoves

KIND = review_q.KIND


def review_key(task_id: str) -> str:
    return f"review:{task_id}"


def is_review(task: Task) -> bool:
    return task.mode == modes.PR_REVIEW


@dataclass(frozen=True, slots=True)
class Submitted:
    review_id: int
    inline: int  # line comments Gitea got on their line
    moved: tuple[str, ...]  # locations moved into the summary
    again: bool  # posted before (found by its record or its marker), not posted twice

    def text(self) -> str:
        if self.again:
            return f"review {self.review_id} was already posted for this task; not posted again"
        moved = (
            f"; {len(self.moved)} moved into the summary (not in the diff): "
            + ", ".join(self.moved)
            if self.moved
            else ""
        )
        return f"posted review {self.review_id} with {self.inline} line comments{moved}"


class PullReviews:
    def __init__(
        self,
        store: Store,
        gitea: GiteaClient,
        bot_login: str,
        *,
        allowed_events: Mapping[str, frozenset[str]] | None = None,
    ) -> None:
        """``allowed_events``: by "owner/repo", the events besides COMMENT the
        repository's configuration lets the bot give (``APPROVE``,
        ``REQUEST_CHANGES``); none by default."""
        self._store = store
        self._gitea = gitea
        self._bot = bot_login.lower()
        self._allowed = dict(allowed_events or {})
        self._suggestions: bool | None = None  # whether Gitea reads suggestion blocks

    async def submit(self, session_key: str, draft: r.ReviewDraft) -> Submitted:
        """The ``submit_review`` tool: one review for the running review task."""
        task = await self._store.read(lambda c: tasks.running_in_session(c, session_key))
        if task is None or not is_review(task):
            raise ToolRefused("no review task of this pull request is running")
        return await self.post(task, draft)

    async def post(self, task: Task, draft: r.ReviewDraft) -> Submitted:
        """Post ``task``'s one review from ``draft``, or find the one posted before."""
        key = review_key(task.task_id)
        earlier = await self._store.read(lambda c: comment_q.get(c, key))
        if earlier is not None:
            return await self._settle(task, earlier)
        record = await self._record(task, draft)
        body = record.dumps()
        inserted, row = await self._store.write(lambda c: _intend(c, task, key, body))
        if not inserted:  # another call wrote it first: settle that one
            return await self._settle(task, row)
        review = await self._create(task, _gitea_request(record), key)
        return Submitted(
            review.id, len(record.comments), tuple(c.location for c in record.moved), False
        )

    async def posted(self, task: Task) -> int | None:
        """The id of ``task``'s review when it is recorded as posted (a pending intent is
        settled first: found by its marker, or posted from its stored request)."""
        key = review_key(task.task_id)
        row = await self._store.read(lambda c: comment_q.get(c, key))
        if row is None:
            return None
        return (await self._settle(task, row)).review_id

    async def tool(self, session_key: str, draft: r.ReviewDraft) -> str:
        """The ``submit_review`` tool's port: what was posted, for the model."""
        return (await self.submit(session_key, draft)).text()

    async def verify(self, task: Task, moves: TaskMoves, last_message: str | None) -> Task:
        """A review task's ``verifying_reply``: its review recorded as posted (a pending
        intent settled first) succeeds; when the agent never submitted one, forgeflow
        posts its last message as the review's summary (the REST fallback's rule)."""
        try:
            review_id = await self.posted(task)
            fallback = review_id is None
            if review_id is None:
                text = (last_message or "").strip() or "(the agent finished without a review)"
                review_id = (await self.post(task, r.ReviewDraft(text))).review_id
        except GiteaError as exc:
            return await moves.move(
                task,
                TaskState.FAILED_REPLY,
                action="review.fail",
                error_code="review_post_failed",
                fields={"reply_error": str(exc)[:500]},
            )
        if fallback:
            return await moves.move(
                task,
                TaskState.SUCCEEDED_WITH_REST_FALLBACK,
                action="review.fallback",
                error_code="mcp_reply_missing",
                fields={"reply_error": "mcp_reply_missing"},
                metadata={"reviewId": review_id},
            )
        return await moves.move(
            task, TaskState.SUCCEEDED, action="review.confirm", metadata={"reviewId": review_id}
        )

    async def _settle(self, task: Task, row: Comment) -> Submitted:
        if row.status == comment_q.SENT and row.comment_id is not None:
            return Submitted(int(row.comment_id), 0, (), True)
        found = await self._find(task)
        if found is not None:
            await self._sent(row.comment_key, found.id, "found")
            return Submitted(found.id, 0, (), True)
        record = ReviewRecord.parse(row.body or "")
        review = await self._create(task, _gitea_request(record), row.comment_key)
        moved = tuple(c.location for c in record.moved)
        return Submitted(review.id, len(record.comments), moved, False)

    async def _find(self, task: Task) -> PullReview | None:
        """The bot's review of the pull request whose body ends with the task's marker.
        Only the last line counts: the summary above it is the agent's, which can read
        another task's marker in a receipt and copy it there."""
        repo, number = task.resource.repo, task.resource.number
        for review in await self._gitea.list_reviews(repo.owner, repo.name, number):
            login = review.user.login.lower() if review.user else ""
            m = parse_marker(review.body)
            marked = m is not None and m.task_id == task.task_id and m.kind is MarkerKind.REVIEW
            if login == self._bot and marked:
                return review
        return None

    async def _create(self, task: Task, request: ReviewRequest, key: str) -> PullReview:
        repo, number = task.resource.repo, task.resource.number
        try:
            review = await self._gitea.create_review(repo.owner, repo.name, number, request)
        except GiteaError as exc:
            # Left pending: Gitea may have made it before the error reached us.
            error = str(exc)
            await self._store.write(
                lambda c: comment_q.record_result(
                    c, key, status=comment_q.PENDING, comment_id=None, error=error
                )
            )
            raise
        await self._sent(key, review.id, "posted")
        return review

    async def _sent(self, key: str, review_id: int, how: str) -> None:
        await self._store.write(
            lambda c: comment_q.record_result(
                c, key, status=comment_q.SENT, comment_id=review_id, how=how
            )
        )

    async def _record(self, task: Task, draft: r.ReviewDraft) -> ReviewRecord:
        """The review's record: line comments placed on the diff at the head reviewed."""
        repo, number = task.resource.repo, task.resource.number
        head = (task.refs.head_sha if task.refs else None) or ""
        pull = await self._gitea.pull(repo.owner, repo.name, number)
        files: dict[str, r.FileDiff] = {}
        if not head or pull.head.sha == head:
            head = pull.head.sha
            # The diff Gitea shows for the pull request now, which is at ``head``.
            diff = await self._gitea.pull_diff(
                repo.owner, repo.name, number, limit=r.MAX_DIFF_BYTES
            )
            files = r.parse_diff(diff)
        # (A head that moved since the review began: no line is known to be in the diff
        # at the reviewed commit, so every comment goes into the summary.)
        placed = r.place(draft, files)
        suggestions = await self._renders_suggestions()
        marker = Marker(
            task.task_id,
            turn_key(task.task_id, int(task.turn_count)),
            task.resource_key,
            MarkerKind.REVIEW,
        )
        return ReviewRecord(
            body=r.review_body(draft.summary, placed.moved, marker, suggestions=suggestions),
            commit_id=head,
            event=r.review_event(
                draft.event, self._allowed.get(repo.full_name.lower(), frozenset())
            ),
            comments=tuple(_posted(c, suggestions) for c in placed.inline),
            summary=draft.summary,
            moved=tuple(_posted(c, suggestions) for c in placed.moved),
        )

    async def _renders_suggestions(self) -> bool:
        """Whether this Gitea reads a ``suggestion`` block (asked once per process; an
        unanswered ask is asked again next time and meanwhile renders plain blocks)."""
        if self._suggestions is None:
            try:
                version: str | None = await self._gitea.version()
            except GiteaError:
                return False
            self._suggestions = renders_suggestions(version)
        return self._suggestions


def _posted(c: r.LineComment, suggestions: bool) -> PostedLine:
    return PostedLine(c.path, c.side, c.line, r.comment_body(c, suggestions=suggestions))


def _gitea_request(record: ReviewRecord) -> ReviewRequest:
    """The ``CreatePullReviewOptions`` of a record (its summary and moved comments are
    forgeflow's own: they are in the body already)."""
    lines = tuple(
        ReviewLine(
            c.path,
            c.body,
            new_position=c.line if c.side == "new" else 0,
            old_position=c.line if c.side == "old" else 0,
        )
        for c in record.comments
    )
    return ReviewRequest(record.body, record.commit_id, record.event, lines)


def _intend(conn: Connection, task: Task, key: str, body: str) -> tuple[bool, Comment]:
    return comment_q.record_intent(
        conn,
        comment_key=key,
        task_id=task.task_id,
        kind=KIND,
        resource_key=task.resource_key,
        turn_key=turn_key(task.task_id, int(task.turn_count)),
        body_hash=sha256_ref(body.encode()),
        body=body,
    )
