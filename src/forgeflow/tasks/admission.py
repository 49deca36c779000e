"""Admitting a mention: whoever asked, checked with Gitea (or granted, for an operator's
pipeline run), then one write that accepts it as a task or a command, or refuses it, with
its delivery's record and domain events (``store/acceptance.py``; the rules in
``domain/admission.py``). ``tasks/intake.py`` finds the mention; this decides on it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import partial

import structlog
from sqlalchemy import Connection

from forgeflow.config import Settings
from forgeflow.domain import modes
from forgeflow.domain.events import DomainEvent
from forgeflow.domain.ids import ResourceKind, sha256_ref
from forgeflow.domain.intake import DeliveryRecord, Outcome, Recorded, Refused
from forgeflow.domain.mentions import Mention
from forgeflow.domain.paths import repo_workspace
from forgeflow.domain.permissions import Permission
from forgeflow.gitea import events as gitea_events
from forgeflow.gitea import webhook
from forgeflow.gitea.client import PermissionCache
from forgeflow.store import Store, acceptance, commands
from forgeflow.store import events as store_events
from forgeflow.tasks.commenters import Commenters, Unknown

# Logged under the intake's name: an admission's line is about the delivery it came with.
log = structlog.get_logger("forgeflow.tasks.intake")
_Unit = Callable[[Connection, acceptance.Accept], DeliveryRecord]


def _with_events(unit: _Unit, found: Sequence[DomainEvent]) -> _Unit:
    """The acceptance unit of work, recording the comment's domain events with it."""
    return lambda conn, a: store_events.after_delivery(conn, unit(conn, a), found)


class Admission:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        permissions: PermissionCache | None,
        on_accept: Callable[[], None] | None = None,
    ) -> None:
        """``on_accept``: called after a write that left the scheduler work to claim."""
        self.on_accept = on_accept
        self._settings = settings
        self._store = store
        self._commenters = Commenters(settings, store, permissions)
        self._retention = timedelta(days=settings.delivery_retention_days)
        self._root = str(settings.resolved_workspace_root)
        self._budgets = settings.budgets()
        self._models = settings.allowed_model_list()

    async def permission(
        self, key: str, event: webhook.CommentEvent
    ) -> Permission | DeliveryRecord | Unknown:
        """Whoever asked, as :meth:`admit` checks them (a redelivery's recorded answer,
        or why Gitea cannot say)."""
        return await self._commenters.permission_for(key, event)

    def permits(self, permission: Permission) -> bool:
        return permission.allows(self._settings.trigger_permission)

    def refused(self, event: webhook.CommentEvent, body: bytes, why: Unknown) -> Refused:
        return Refused(
            why.kind,
            why.code,
            why.message,
            event.delivery_id,
            event.event_type,
            sha256_ref(body),
            event.repo.key,
        )

    async def admit(
        self,
        key: str,
        event: webhook.CommentEvent,
        body: bytes,
        mention: Mention,
        log_event: str,
        found: Sequence[DomainEvent] | None = None,
        granted: Permission | None = None,
    ) -> Outcome:
        """Whoever asked, checked with Gitea (unless ``granted``: the operator's), then
        accepted or refused in one write."""
        permission = (
            granted if granted is not None else await self._commenters.permission_for(key, event)
        )
        if isinstance(permission, Unknown):
            # Gitea could not say: refused for now, Gitea redelivers.
            return self.refused(event, body, permission)
        if isinstance(permission, DeliveryRecord):
            return Recorded(permission)  # a redelivery's answer
        record = await self._accept(key, event, body, mention, permission, found)
        if record.status == "accepted" and not record.duplicate and self.on_accept is not None:
            # A new task, or a command's answer waiting in the outbox.
            self.on_accept()
        log.info(
            log_event,
            delivery_id=event.delivery_id,
            status=record.status,
            task_id=record.task_id,
            repo_key=event.repo.key,
            reason=record.reason,
        )
        return Recorded(record)

    async def _accept(
        self,
        key: str,
        event: webhook.CommentEvent,
        body: bytes,
        mention: Mention,
        permission: Permission,
        found: Sequence[DomainEvent] | None = None,
    ) -> DeliveryRecord:
        """One transaction: the delivery, and its task or command (or its rejection).
        ``found``: the delivery's domain events (a comment's by default)."""
        permitted = permission.allows(self._settings.trigger_permission)
        command = mention.command if permitted else None
        unit: _Unit = (
            acceptance.accept if command is None else partial(commands.run, command=command)
        )
        if found is None:
            found = [gitea_events.comment_created(event, mentions_bot=True)]
        unit = _with_events(unit, found)
        # ``@bot review [focus]`` on a pull request, or a review request: a review task.
        review = (
            mention.review_focus is not None
            and command is None
            and event.resource.kind is ResourceKind.PULL_REQUEST
        )
        accept = acceptance.Accept(
            delivery_key=key,
            delivery_id=event.delivery_id,
            event_type=event.event_type,
            payload_hash=sha256_ref(body),
            retention=self._retention,
            resource=event.resource,
            clone_url=event.clone_url,
            default_branch=event.default_branch,
            workspace_path=repo_workspace(self._root, event.repo),
            comment_id=event.comment_id or None,  # 0: a review request's
            author=event.actor_login,
            instruction=mention.instruction,
            refs=event.refs,
            permitted=permitted,
            permission=permission.value,
            budgets=self._budgets,
            mode=modes.PR_REVIEW if review else None,
            # A review request or a review's summary has no comment id: its payload
            # names it (a replay under a new delivery id sends the same bytes).
            replay_by_payload=not event.comment_id and event.event_type in webhook.BY_PAYLOAD,
            options=mention.options,
            allowed_models=self._models,
        )
        return await self._store.write(lambda c: unit(c, accept))
