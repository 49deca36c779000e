"""The conversation's images for a task's turn: the issue's and its comments' Gitea
attachments, fetched by forgeflow with the bot's token, bounded, checked by their
bytes, handed to the turn as data URLs (the rules: domain/images.py).

Nothing here is fatal: an image that cannot be fetched, is too large or is not an
image is skipped with an audit row, and the turn runs with the others.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from forgeflow.domain import images as rules
from forgeflow.domain.records import Task
from forgeflow.gitea.client import GiteaClient, GiteaError
from forgeflow.gitea.models import Attachment, Comment, Issue
from forgeflow.tasks.moves import TaskMoves

log = structlog.get_logger("forgeflow.tasks.images")


def _listed(assets: Sequence[Attachment] | None, where: str) -> list[rules.Listed]:
    return [rules.Listed(a.uuid, a.name, a.size, where) for a in assets or ()]


class ConversationImages:
    def __init__(
        self, gitea: GiteaClient, moves: TaskMoves, *, max_count: int, max_bytes: int
    ) -> None:
        self.gitea = gitea
        self.moves = moves
        self.max_count = max_count
        self.max_bytes = max_bytes

    async def of(self, task: Task, issue: Issue, comments: Sequence[Comment]) -> tuple[str, ...]:
        """The images of ``issue`` and ``comments`` (the mention's, ``task.comment_id``,
        first) as data URLs, at most ``max_count``."""
        if self.max_count == 0:
            return ()
        mention = [c for c in comments if c.id == task.comment_id]
        others = [c for c in comments if c.id != task.comment_id]
        take, skipped = rules.chosen(
            [x for c in mention for x in _listed(c.assets, "mention")],
            _listed(issue.assets, "issue"),
            [_listed(c.assets, "comment") for c in others],
            max_count=self.max_count,
            max_bytes=self.max_bytes,
        )
        urls: list[str] = []
        for item in take:
            url, why = await self._fetch(item)
            if url is not None:
                urls.append(url)
            else:
                skipped.append((item, why))
        for item, why in skipped:
            await self.moves.audit(
                task,
                "prompt.image_skipped",
                metadata={"name": rules.shown_name(item.name), "where": item.where, "why": why},
            )
        if urls:
            await self.moves.audit(task, "prompt.images", metadata={"count": len(urls)})
        return tuple(urls)

    async def _fetch(self, item: rules.Listed) -> tuple[str | None, str]:
        try:
            data = await self.gitea.attachment(item.uuid, self.max_bytes)
        except GiteaError as exc:
            log.info("images.fetch_failed", error=str(exc), code=exc.code)
            return None, str(exc)
        media_type = rules.image_type(data)
        if media_type is None:
            return None, "not an image (its first bytes)"
        return rules.data_url(media_type, data), ""
