"""The ``submit_review`` tool: the agent's review of this pull request, which forgeflow
posts as one Gitea review (``tasks/reviews.py``). Offered only on a review task's
thread (its grant says so, agent/broker.py), whose other tools are the readers.

A line comment names the file, the side (``new``: a line of the pull request's version,
``old``: a line of the base's) and the line number, and may carry a suggested
replacement for that line, rendered in Gitea's ``suggestion`` block.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from forgeflow.agent.gitea_tools import args as a
from forgeflow.agent.gitea_tools import handlers as h
from forgeflow.domain.reviews import LineComment, ReviewDraft

NAME = "submit_review"
DESCRIPTION = (
    "Submit your review of this pull request, once: a summary and line comments (path, "
    "side new/old, line, body, optional suggestion: the replacement text for that line). "
    "forgeflow posts it as one review; comments on lines outside the diff are moved into "
    "the summary. Says what was posted."
)
MAX_COMMENTS = 100


class ReviewLineArgs(a.Args):
    path: a.Path = Field(description="the file, relative to the repository's root")
    side: Literal["new", "old"] = Field(
        default="new", description="new: a line of the pull request's version; old: the base's"
    )
    line: int = Field(ge=1, le=10_000_000, description="the line number on that side")
    body: a.Body = Field(description="Markdown text of the comment")
    suggestion: str | None = Field(
        default=None, max_length=a.MAX_BODY, description="replacement text for the line"
    )


class SubmitReviewArgs(a.Args):
    summary: a.Body = Field(description="the review's summary (Markdown)")
    comments: list[ReviewLineArgs] = Field(default_factory=list, max_length=MAX_COMMENTS)
    event: Literal["COMMENT", "APPROVE", "REQUEST_CHANGES"] = Field(
        default="COMMENT",
        description="COMMENT unless the repository lets the bot approve or request changes",
    )


def draft_of(x: SubmitReviewArgs) -> ReviewDraft:
    return ReviewDraft(
        x.summary,
        tuple(LineComment(c.path, c.side, c.line, c.body, c.suggestion) for c in x.comments),
        x.event,
    )


async def submit_review(s: h.Session, x: SubmitReviewArgs) -> str:
    if s.reviews is None or not s.is_pull:
        raise h.ToolRefused("submit_review is offered on a pull request's review task only")
    text: str = await h.gitea_call("the review", s.reviews(s.key, draft_of(x)))
    return text
