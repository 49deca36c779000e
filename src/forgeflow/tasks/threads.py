"""Review threads on Gitea (issue #24 item 4): which mention is a line comment, its
thread, and the answer posted into that thread.

A task learns it is a thread's from its comment: Gitea's ``GET /issues/comments/{id}``
answers 204 for any comment that is not a plain one of the timeline, and a code
comment is then looked up among the pull request's review comments (bounded: the
newest reviews that have line comments), which also gives its file, line, diff hunk
and the whole conversation (``domain/threads.py``). What is found is kept for the
task in this process; after a restart it is read again.

The answer goes into the thread: Gitea 1.27's reply endpoint where the server has it,
else a review of event COMMENT with one line comment on the same path and line, which
Gitea's pages show in the same conversation. Exactly once is the caller's
(``tool_comments.py``, ``replies.py``): an intent before, the answer found by its text
or its marker in the thread (:meth:`ReviewThreads.comments`) before posting again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import structlog

from forgeflow.domain import threads as t
from forgeflow.domain.ids import RepoRef, ResourceKind
from forgeflow.domain.records import Task
from forgeflow.gitea.client import GiteaClient, GiteaError
from forgeflow.gitea.models import Comment as GiteaComment
from forgeflow.gitea.reviews import PullReview, PullReviewComment, ReviewLine, ReviewRequest
from forgeflow.gitea.transport import GiteaAnswerTooLarge

log = structlog.get_logger("forgeflow.tasks.threads")
# How many reviews (the newest with line comments) a lookup reads the comments of.
MAX_REVIEWS = 50
# How many submitted reviews of one reviewer a review delivery is matched against.
RECENT_REVIEWS = 3
# The states of a submitted review (structs.ReviewStateType): line comments of each
# ask the bot alike, whichever verdict the review gave.
SUBMITTED = frozenset({"COMMENT", "APPROVED", "REQUEST_CHANGES"})
_CACHED = 512


def line_comment(c: PullReviewComment) -> t.LineComment:
    return t.LineComment(
        id=c.id,
        review_id=c.pull_request_review_id,
        author=c.user.login,
        body=c.body,
        path=c.path,
        new_line=c.position,
        old_line=c.original_position,
        diff_hunk=c.diff_hunk,
    )


def as_comment(c: PullReviewComment) -> GiteaComment:
    """A thread's comment in the shape the reply and tool paths handle."""
    return GiteaComment(
        id=c.id, body=c.body, user=c.user, html_url=c.html_url, created_at=c.created_at
    )


class ReviewThreads:
    def __init__(self, gitea: GiteaClient, bot_login: str) -> None:
        self._gitea = gitea
        self._bot = bot_login.lower()
        self._known: OrderedDict[str, t.Thread | None] = OrderedDict()

    async def locate(self, task: Task) -> t.Thread | None:
        """The review thread ``task``'s mention was made in; None for a plain comment
        (or a task no comment started). Raises ``GiteaError`` when Gitea cannot say."""
        if (
            task.resource.kind is not ResourceKind.PULL_REQUEST
            or not task.comment_id
            or task.mode is not None
        ):
            return None
        if task.task_id in self._known:
            return self._known[task.task_id]
        repo = task.resource.repo
        thread = None
        try:
            plain = await self._gitea.is_plain_comment(repo.owner, repo.name, task.comment_id)
        except GiteaError as exc:
            if exc.status != 404:
                raise
            plain = True  # deleted since: the answer goes to the timeline, as before
        if not plain:
            thread = await self.read(repo, task.resource.number, task.comment_id)
        self._known[task.task_id] = thread
        while len(self._known) > _CACHED:
            self._known.popitem(last=False)
        return thread

    async def read(self, repo: RepoRef, number: int, comment_id: int) -> t.Thread | None:
        """The thread of ``comment_id`` as Gitea has it now."""
        found = await self._comments(repo, number, await self._reviews(repo, number))
        return t.thread_of(comment_id, [line_comment(c) for c in found])

    async def comments(self, task: Task, thread: t.Thread) -> list[GiteaComment]:
        """The thread's comments by the bot now, oldest first: where an answer posted
        before a crash is found."""
        repo, number = task.resource.repo, task.resource.number
        found = await self._comments(repo, number, await self._reviews(repo, number))
        now = t.thread_of(thread.comment_id, [line_comment(c) for c in found])
        ids = {c.id for c in now.comments} if now else set()
        return [
            as_comment(c)
            for c in sorted(found, key=lambda c: c.id)
            if c.id in ids and c.user.login.lower() == self._bot
        ]

    async def answers(
        self, repo: RepoRef, number: int, bot_answer: Callable[[str], bool]
    ) -> list[tuple[int, str]]:
        """The bot's answers in the pull request's review threads (``bot_answer`` tells
        which of its comments are answers), each with its id and where it was: what a
        rebuilt thread recalls besides the timeline's answers."""
        found = await self._comments(repo, number, await self._reviews(repo, number))
        return [
            (c.id, f"(in the review thread on `{c.path}` line {line_comment(c).line}) {c.body}")
            for c in sorted(found, key=lambda c: c.id)
            if c.user.login.lower() == self._bot and bot_answer(c.body)
        ]

    async def post(self, task: Task, thread: t.Thread, body: str) -> GiteaComment:
        """Post ``body`` into the thread, once (the caller recorded the intent)."""
        repo, number = task.resource.repo, task.resource.number
        try:
            reply = await self._gitea.reply_to_review_comment(
                repo.owner, repo.name, number, thread.comment_id, body
            )
            return as_comment(reply)
        except GiteaError as exc:
            if exc.status not in (404, 405):
                raise
        # No reply endpoint (Gitea before 1.27): a review with one line comment on the
        # thread's path and line, which joins the conversation.
        line = ReviewLine(
            thread.path,
            body,
            new_position=thread.line if thread.side == "new" else 0,
            old_position=thread.line if thread.side == "old" else 0,
        )
        review = await self._gitea.create_review(
            repo.owner, repo.name, number, ReviewRequest("", "", "COMMENT", (line,))
        )
        made = await self._gitea.review_comments(repo.owner, repo.name, number, review.id)
        mine = [c for c in made if c.body == body] or made
        if not mine:
            raise GiteaError(f"review {review.id} was made without its line comment")
        return as_comment(mine[0])

    async def asking(self, repo: RepoRef, number: int, reviewer: str) -> list[t.LineComment]:
        """For a review delivery (whose payload has the review's body, not its line
        comments): every line comment of ``reviewer``'s newest submitted reviews that
        mentions the bot, oldest first. The newest few, not just the newest: two
        single comments made faster than their deliveries are read are both found."""
        reviews = [
            r
            for r in await self._gitea.list_reviews(repo.owner, repo.name, number)
            if r.user is not None
            and r.user.login.lower() == reviewer.lower()
            and r.state in SUBMITTED
            and r.comments_count > 0
        ]
        found: list[t.LineComment] = []
        for review in sorted(reviews, key=lambda r: r.id, reverse=True)[:RECENT_REVIEWS]:
            made = await self._review_comments(repo, number, review.id)
            found += t.asking_comments([line_comment(c) for c in made], reviewer, self._bot)
        return sorted(found, key=lambda c: c.id)

    async def _reviews(self, repo: RepoRef, number: int) -> list[PullReview]:
        every = await self._gitea.list_reviews(repo.owner, repo.name, number)
        with_lines = [r for r in every if r.comments_count > 0]
        return sorted(with_lines, key=lambda r: r.id, reverse=True)[:MAX_REVIEWS]

    async def _comments(
        self, repo: RepoRef, number: int, reviews: list[PullReview]
    ) -> list[PullReviewComment]:
        found: list[PullReviewComment] = []
        for review in reviews:
            found += await self._review_comments(repo, number, review.id)
        return found

    async def _review_comments(
        self, repo: RepoRef, number: int, review_id: int
    ) -> list[PullReviewComment]:
        try:
            return await self._gitea.review_comments(repo.owner, repo.name, number, review_id)
        except GiteaAnswerTooLarge:
            # Anyone who may read the pull request may review it with line comments of
            # any length and number (one answer, unpaged): such a review is left out,
            # not every thread of the pull request with it.
            log.warning("review_threads.review_too_large", review_id=review_id)
            return []
