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
from forgeflow.store import Store, sessions
from forgeflow.tasks.moves import TaskMoves

log = structlog.get_logger("forgeflow.tasks.images")


def _listed(assets: Sequence[Attachment] | None, where: str) -> list[rules.Listed]:
    return [rules.Listed(a.uuid, a.name, a.size, where, a.created_at) for a in assets or ()]


class ConversationImages:
    def __init__(
        self, store: Store, gitea: GiteaClient, moves: TaskMoves, bounds: rules.Bounds
    ) -> None:
        self.store = store
        self.gitea = gitea
        self.moves = moves
        self.bounds = bounds

    async def of(self, task: Task, issue: Issue, comments: Sequence[Comment]) -> tuple[str, ...]:
        """The images of ``issue`` and ``comments`` (the mention's, ``task.comment_id``,
        first) as data URLs, within the bounds; on a thread that saw the conversation
        before, only what was attached since (and the mention's)."""
        if self.bounds.count == 0:
            return ()
        seen_at = await self.store.read(
            lambda c: sessions.conversation_seen_at(c, task.session_key, task.task_id)
        )
        mention = [c for c in comments if c.id == task.comment_id]
        others = [c for c in comments if c.id != task.comment_id]
        take, skipped = rules.chosen(
            [x for c in mention for x in _listed(c.assets, "mention")],
            _listed(issue.assets, "issue"),
            [_listed(c.assets, "comment") for c in others],
            self.bounds,
            seen_at=seen_at,
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
            data = await self.gitea.attachment(item.uuid, self.bounds.each)
        except GiteaError as exc:
            log.info("images.fetch_failed", error=str(exc), code=exc.code)
            return None, str(exc)
        media_type = rules.image_type(data)
        if media_type is None:
            return None, "not an image (its first bytes)"
        return rules.data_url(media_type, data), ""
