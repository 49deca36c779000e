"""Who asked: the commenter's permission on the repository, as intake needs it —
known without asking (cached, or no check configured), a redelivery's recorded answer,
or asked of Gitea; when Gitea cannot say, why (a refusal for now: Gitea redelivers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import structlog

from forgeflow.config import Settings
from forgeflow.domain.intake import DeliveryRecord
from forgeflow.domain.permissions import Permission
from forgeflow.gitea import webhook
from forgeflow.gitea.client import GiteaError, GiteaPermissionDenied, PermissionCache
from forgeflow.store import Store, deliveries

log = structlog.get_logger("forgeflow.tasks.intake")


@dataclass(frozen=True, slots=True)
class Unknown:
    """Why the commenter's permission is not known (a :class:`Refused` to be)."""

    kind: Literal["not_configured", "unavailable"]
    code: str
    message: str


class Commenters:
    """The permission lookups of :class:`forgeflow.tasks.intake.WebhookIngress`."""

    def __init__(
        self, settings: Settings, store: Store, permissions: PermissionCache | None
    ) -> None:
        self._settings = settings
        self._store = store
        self._permissions = permissions

    async def permission_for(
        self, key: str, event: webhook.CommentEvent
    ) -> Permission | DeliveryRecord | Unknown:
        """The commenter's permission on the repository, asked of Gitea when not known."""
        permission = self._known(event)
        if permission is not None:
            return permission
        # Gitea must be asked. One read first answers a redelivery and a disabled
        # repository without that lookup; the acceptance transaction decides both
        # again, so the read only saves work (and is skipped when nothing is asked).
        repo_key = event.repo.key
        seen, repo_status = await self._store.read(
            lambda c: (deliveries.get(c, key), deliveries.repo_status(c, repo_key))
        )
        if seen is not None:
            return seen
        if repo_status == "disabled":
            return Permission.NONE
        return await self._ask(event)

    def _known(self, event: webhook.CommentEvent) -> Permission | None:
        if self._settings.trigger_permission is Permission.NONE:
            return Permission.NONE
        if self._permissions is None:
            return None
        return self._permissions.cached(event.repo.owner, event.repo.name, event.actor_login)

    async def _ask(self, event: webhook.CommentEvent) -> Permission | Unknown:
        s = self._settings
        if s.trigger_permission is Permission.NONE:
            return Permission.NONE
        if self._permissions is None:
            return Unknown(
                "not_configured",
                "not_configured",
                "FORGEFLOW_GITEA_URL is not set: commenter permission cannot be checked",
            )
        try:
            return await self._permissions.permission(
                event.repo.owner, event.repo.name, event.actor_login
            )
        except GiteaError as exc:
            log.warning(
                "webhook.permission_unavailable",
                delivery_id=event.delivery_id,
                error=str(exc),
                code=exc.code,
            )
            if isinstance(exc, GiteaPermissionDenied):
                return Unknown("unavailable", exc.code, str(exc))
            return Unknown(
                "unavailable",
                "gitea_unavailable",
                "commenter permission could not be checked; redeliver later",
            )
