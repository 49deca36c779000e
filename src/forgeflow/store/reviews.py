"""Reads of a pull request's reviews as forgeflow recorded them: the ``comments`` rows
of kind ``review`` (one per review task, written by ``tasks/reviews.py``), each as a
:class:`BotReview` (``rows.bot_review`` parses the record)."""

from __future__ import annotations

from sqlalchemy import Connection, bindparam, select

from forgeflow.domain.bookkeeping import Comment
from forgeflow.domain.review_record import BotReview
from forgeflow.store import rows
from forgeflow.store.bookkeeping_schema import comments
from forgeflow.store.comments import SENT
from forgeflow.store.schema import tasks

KIND = "review"
MAX_LISTED = 200  # a session page lists at most this many of a pull request's reviews

# Through the tasks of the pull request (ix_tasks_resource, then ix_comments_task_id):
# the comments table has no index of its own on the resource.
_OF_RESOURCE = (
    select(comments)
    .join(tasks, tasks.c.task_id == comments.c.task_id)
    .where(tasks.c.resource_key == bindparam("b_resource"))
    .where(comments.c.kind == KIND)
)
_OF_TASK = (
    select(comments)
    .where(comments.c.task_id == bindparam("b_task"))
    .where(comments.c.kind == KIND)
    .limit(1)
)


def of_task(conn: Connection, task_id: str) -> BotReview | None:
    """The review of a review task, if it wrote one."""
    row = rows.first(Comment, conn, _OF_TASK, {"b_task": task_id})
    return rows.bot_review(row) if row is not None else None


def of_resource(conn: Connection, resource_key: str) -> list[BotReview]:
    """The pull request's reviews by forgeflow, oldest first (at most MAX_LISTED, the
    newest of them)."""
    stmt = _OF_RESOURCE.order_by(comments.c.created_at.desc()).limit(MAX_LISTED)
    found = rows.every(Comment, conn, stmt, {"b_resource": resource_key})
    return [rows.bot_review(r) for r in reversed(found)]


def last_posted(conn: Connection, resource_key: str, *, other_than: str) -> BotReview | None:
    """The newest review forgeflow posted on the pull request in another task than
    ``other_than`` (a retried task's own review is no earlier one) whose record reads."""
    stmt = (
        _OF_RESOURCE.where(comments.c.status == SENT)
        .where(comments.c.task_id != bindparam("b_task"))
        .where(comments.c.comment_id.is_not(None))
        .order_by(comments.c.created_at.desc())
        .limit(20)
    )
    for row in rows.every(Comment, conn, stmt, {"b_resource": resource_key, "b_task": other_than}):
        review = rows.bot_review(row)
        if review.record is not None and review.record.commit_id:
            return review
    return None
