"""Pull request reviews as the Gitea client asks for them (Gitea's
``routers/api/v1/repo/pull_review.go``; shapes of ``modules/structs/pull_review.go``):
create one review with its line comments, list a pull request's reviews, read one
review's comments, reply in a review thread (Gitea 1.27 and later).

``CreatePullReviewOptions``: ``event`` (``APPROVE``, ``REQUEST_CHANGES``, ``COMMENT``),
``body``, ``commit_id``, ``comments[]`` of ``CreatePullReviewComment`` (``path``,
``body``, ``old_position``, ``new_position``: a line number of the old or the new file,
the other 0). Gitea answers 200 with the ``PullReview``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pydantic import Field

from forgeflow.gitea.models import User, _Shape
from forgeflow.gitea.transport import MAX_ANSWER_BYTES, Transport

_PAGE = 50
_MAX_PAGES = 20  # of a pull request with more than 1000 reviews, the newest 1000 are read


class PullReview(_Shape):
    """``PullReview``."""

    id: int
    user: User | None = None
    state: str = ""
    body: str = ""
    commit_id: str = ""
    stale: bool = False
    official: bool = False
    dismissed: bool = False
    comments_count: int = 0
    submitted_at: datetime | None = None
    html_url: str = ""


class PullReviewComment(_Shape):
    """``PullReviewComment``: ``position`` is the new file's line, ``original_position``
    the old file's (0 when the comment is on the other side)."""

    id: int
    body: str = ""
    user: User = Field(default_factory=User)
    pull_request_review_id: int = 0
    path: str = ""
    commit_id: str = ""
    diff_hunk: str = ""
    position: int = 0
    original_position: int = 0
    html_url: str = ""
    created_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class ReviewLine:
    """One ``CreatePullReviewComment``."""

    path: str
    body: str
    new_position: int = 0
    old_position: int = 0

    def json(self) -> dict[str, str | int]:
        return {
            "path": self.path,
            "body": self.body,
            "new_position": self.new_position,
            "old_position": self.old_position,
        }


@dataclass(frozen=True, slots=True)
class ReviewRequest:
    """One ``CreatePullReviewOptions``, made from the intent's record
    (``domain/review_record.py``, which is where the stored JSON is parsed)."""

    body: str
    commit_id: str
    event: str
    comments: tuple[ReviewLine, ...] = ()

    def json(self) -> dict[str, object]:
        return {
            "event": self.event,
            "body": self.body,
            "commit_id": self.commit_id,
            "comments": [c.json() for c in self.comments],
        }


class ReviewsApi(Transport):
    def _reviews_path(self, owner: str, repo: str, index: int) -> str:
        return f"{self._repo_path(owner, repo)}/pulls/{int(index)}/reviews"

    async def create_review(
        self,
        owner: str,
        repo: str,
        index: int,
        request: ReviewRequest,
    ) -> PullReview:
        path = self._reviews_path(owner, repo, index)
        return await self._one(PullReview, "POST", path, (200,), json=request.json())

    async def list_reviews(self, owner: str, repo: str, index: int) -> list[PullReview]:
        """The pull request's newest reviews (at most 20 pages of them), oldest first.

        Gitea lists them oldest first, and anyone who may read a pull request may review
        it any number of times: read from the first page on, a reader's thousand empty
        reviews left every newer one (a writer's line comment asking the bot, the bot's
        own review) unread. Past 20 pages they are read from the last page back, by the
        count Gitea gives with the first (``X-Total-Count``)."""
        path = self._reviews_path(owner, repo, index)

        async def page(n: int) -> tuple[list[PullReview], int | None]:
            params = {"page": str(n), "limit": str(_PAGE)}
            return await self._counted(PullReview, "GET", path, (200,), params=params)

        found, total = await page(1)
        if total is not None and total > _PAGE * _MAX_PAGES:
            last = -(-total // _PAGE)
            found = []
            for n in range(last, last - _MAX_PAGES, -1):
                found += (await page(n))[0]
        else:
            for n in range(2, _MAX_PAGES + 1):
                if len(found) < _PAGE * (n - 1):
                    break  # the last page was not full
                found += (await page(n))[0]
        # A review made while the pages were read shifts them: each once, by id.
        return sorted({r.id: r for r in found}.values(), key=lambda r: r.id)

    async def review_comments(
        self, owner: str, repo: str, index: int, review_id: int
    ) -> list[PullReviewComment]:
        """One review's line comments: one unpaged answer of any size on Gitea, so read
        no further than MAX_ANSWER_BYTES (past them: GiteaAnswerTooLarge)."""
        path = f"{self._reviews_path(owner, repo, index)}/{int(review_id)}/comments"
        return await self._many(PullReviewComment, "GET", path, (200,), max_bytes=MAX_ANSWER_BYTES)

    async def reply_to_review_comment(
        self, owner: str, repo: str, index: int, comment_id: int, body: str
    ) -> PullReviewComment:
        """Gitea 1.27's ``POST /pulls/{index}/comments/{id}/replies``
        (``CreatePullReviewCommentReplyOptions`` {body}; 201 with the reply). An older
        Gitea has no such route: 404 (or 405), and nothing was made."""
        path = f"{self._repo_path(owner, repo)}/pulls/{int(index)}/comments/{int(comment_id)}"
        return await self._one(
            PullReviewComment, "POST", f"{path}/replies", (200, 201), json={"body": body}
        )
