"""Webhook intake: verify the signature, drop duplicates, normalise, enqueue.

It answers from what the store says and never waits on clone, agent or comment work:
Gitea gives up on a delivery after a few seconds, and a delivery it gave up on is sent
again. A comment that mentions the bot becomes a task (or a command) in one transaction
with its delivery's record, so a redelivery finds it and creates nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

import structlog
from sqlalchemy import Connection

from forgeflow.config import Permission, Settings
from forgeflow.domain.events import DomainEvent
from forgeflow.domain.ids import delivery_key, sha256_ref
from forgeflow.domain.markers import parse_marker
from forgeflow.domain.mentions import Mention, find_mention
from forgeflow.domain.paths import repo_workspace
from forgeflow.gitea import events as gitea_events
from forgeflow.gitea import webhook
from forgeflow.gitea.client import GiteaError, GiteaPermissionDenied, PermissionCache
from forgeflow.rejections import Rejection, RejectionLog, cut
from forgeflow.store import Store, commands, deliveries
from forgeflow.store import events as store_events
from forgeflow.store.deliveries import DeliveryRecord

log = structlog.get_logger("forgeflow.tasks.intake")
_Unit = Callable[[Connection, deliveries.Accept], DeliveryRecord]


@dataclass(frozen=True, slots=True)
class Reply:
    status_code: int
    body: dict[str, Any]
    outcome: str  # metrics label: accepted|duplicate|ignored|rejected|invalid|unauthorized|…


def _error(status: int, code: str, message: str, outcome: str) -> Reply:
    return Reply(status, {"error": code, "message": message}, outcome)


def _printable(value: str, limit: int) -> str:
    """A header's value as a column holds it: printable (no NUL) and bounded."""
    return "".join(c if c.isprintable() else "?" for c in value[:limit])


def _with_events(unit: _Unit, found: Sequence[DomainEvent]) -> _Unit:
    """The acceptance unit of work, recording the comment's domain events with it."""
    return lambda conn, a: store_events.after_delivery(conn, unit(conn, a), found)


class WebhookIngress:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        permissions: PermissionCache | None,
        rejections: RejectionLog,
        on_accept: Callable[[], None] | None = None,
    ) -> None:
        self.on_accept = on_accept
        self._rejections = rejections
        self._settings = settings
        self._store = store
        self._permissions = permissions
        self._retention = timedelta(days=settings.delivery_retention_days)
        self._root = str(settings.resolved_workspace_root)
        self._budgets = settings.budgets()
        self._bot = settings.bot_login

    async def handle(self, headers: Mapping[str, str], body: bytes, source: str = "-") -> Reply:
        """``source``: the client address, for the audit of a refusal."""
        secret = self._settings.webhook_secret
        if secret is None:
            return _error(
                503, "not_configured", "FORGEFLOW_WEBHOOK_SECRET is not set", "not_configured"
            )
        if not webhook.verify_signature(secret.get_secret_value(), body, headers):
            await self._security_alert(headers, source)
            return _error(401, "invalid_signature", "signature missing or invalid", "unauthorized")
        try:
            payload = webhook.parse_json(body)
        except webhook.InvalidPayload as exc:
            invalid = _error(400, "invalid_payload", str(exc), "invalid")
            return await self._refuse(
                invalid, body, webhook.delivery_id_of(headers), webhook.event_type_of(headers)
            )
        event_type = webhook.event_type_of(headers, payload)
        delivery_id = webhook.delivery_id_of(headers) or webhook.payload_delivery_fallback(
            event_type, payload
        )
        if delivery_id is None:
            invalid = _error(
                400,
                "invalid_payload",
                "no X-Gitea-Delivery header and no comment id in the payload",
                "invalid",
            )
            return await self._refuse(invalid, body, None, event_type)
        key = delivery_key(delivery_id)
        if event_type in webhook.COMMENT_EVENTS:
            try:
                event = webhook.normalise_comment(delivery_id, event_type, payload)
            except webhook.InvalidPayload as exc:
                invalid = _error(400, "invalid_payload", str(exc), "invalid")
                return await self._refuse(invalid, body, delivery_id, event_type)
            return await self._comment(key, event, body)
        seen = await self._store.read(lambda c: deliveries.get(c, key))
        if seen is not None:
            return self._answer(seen)
        # Issues, pull requests, releases…: no task, but maybe pipeline domain events.
        found = gitea_events.domain_events(
            event_type, payload, delivery_id=delivery_id, body=body, bot_login=self._bot
        )
        return await self._ignore(
            key,
            delivery_id,
            event_type or "unknown",
            body,
            "domain_event" if found else "event_not_handled",
            normalized=False,
            found=found,
        )

    async def _comment(self, key: str, event: webhook.CommentEvent, body: bytes) -> Reply:
        reason = self._not_a_mention(event)
        mention = None if reason else find_mention(event.comment_body, self._bot)
        if reason is not None or mention is None:
            reason = reason or "no_mention"
            return await self._ignore(
                key,
                event.delivery_id,
                event.event_type,
                body,
                reason,
                normalized=True,
                repo_key=event.repo.key,
                found=[gitea_events.comment_created(event, mentions_bot=False)]
                if reason == "no_mention"
                else (),
            )
        permission = await self._permission_for(key, event)
        if isinstance(permission, Reply) and permission.status_code >= 400:
            # Gitea could not say: refused for now, Gitea redelivers.
            return await self._refuse(
                permission, body, event.delivery_id, event.event_type, event.repo.key
            )
        if not isinstance(permission, Permission):
            return permission  # a redelivery's answer
        record = await self._accept(key, event, body, mention, permission)
        if record.status == "accepted" and not record.duplicate and self.on_accept is not None:
            # A new task, or a command's answer waiting in the outbox.
            self.on_accept()
        log.info(
            "webhook.delivery",
            delivery_id=event.delivery_id,
            status=record.status,
            task_id=record.task_id,
            repo_key=event.repo.key,
            reason=record.reason,
        )
        return self._answer(record)

    def _not_a_mention(self, event: webhook.CommentEvent) -> str | None:
        """Why a comment cannot start a task (an edit, the bot's own), else None."""
        if event.action != "created":
            return f"action_{event.action}"
        if event.actor_login.lower() == self._bot.lower() or parse_marker(event.comment_body):
            return "bot_comment"
        return None

    async def _permission_for(self, key: str, event: webhook.CommentEvent) -> Permission | Reply:
        """The commenter's permission on the repository, asked of Gitea when not known."""
        permission = self._known_permission(event)
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
            return self._answer(seen)
        if repo_status == "disabled":
            return Permission.NONE
        return await self._permission(event)

    async def _accept(
        self,
        key: str,
        event: webhook.CommentEvent,
        body: bytes,
        mention: Mention,
        permission: Permission,
    ) -> DeliveryRecord:
        """One transaction: the delivery, and its task or command (or its rejection)."""
        permitted = permission.rank >= self._settings.trigger_permission.rank
        command = mention.command if permitted else None
        unit: _Unit = (
            deliveries.accept if command is None else partial(commands.run, command=command)
        )
        unit = _with_events(unit, [gitea_events.comment_created(event, mentions_bot=True)])
        accept = deliveries.Accept(
            delivery_key=key,
            delivery_id=event.delivery_id,
            event_type=event.event_type,
            payload_hash=sha256_ref(body),
            retention=self._retention,
            resource=event.resource,
            clone_url=event.clone_url,
            default_branch=event.default_branch,
            workspace_path=repo_workspace(self._root, event.repo),
            comment_id=event.comment_id,
            author=event.actor_login,
            instruction=mention.instruction,
            refs=event.refs,
            permitted=permitted,
            permission=permission.value,
            budgets=self._budgets,
        )
        return await self._store.write(lambda c: unit(c, accept))

    def _known_permission(self, event: webhook.CommentEvent) -> Permission | None:
        if self._settings.trigger_permission is Permission.NONE:
            return Permission.NONE
        if self._permissions is None:
            return None
        return self._permissions.cached(event.repo.owner, event.repo.name, event.actor_login)

    async def _permission(self, event: webhook.CommentEvent) -> Permission | Reply:
        s = self._settings
        if s.trigger_permission is Permission.NONE:
            return Permission.NONE
        if self._permissions is None:
            return _error(
                503,
                "not_configured",
                "FORGEFLOW_GITEA_URL is not set: commenter permission cannot be checked",
                "not_configured",
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
                return _error(503, exc.code, str(exc), "unavailable")
            return _error(
                503,
                "gitea_unavailable",
                "commenter permission could not be checked; redeliver later",
                "unavailable",
            )

    async def _ignore(
        self,
        key: str,
        delivery_id: str,
        event_type: str,
        body: bytes,
        reason: str,
        *,
        normalized: bool,
        repo_key: str | None = None,
        found: Sequence[DomainEvent] = (),
    ) -> Reply:
        record = await self._store.write(
            lambda c: store_events.after_delivery(
                c,
                deliveries.record_ignored(
                    c,
                    delivery_key=key,
                    delivery_id=delivery_id,
                    event_type=event_type,
                    payload_hash=sha256_ref(body),
                    retention=self._retention,
                    reason=reason,
                    normalized=normalized,
                    repo_key=repo_key,
                ),
                found,
            )
        )
        return self._answer(record)

    async def _refuse(
        self,
        reply: Reply,
        body: bytes,
        delivery_id: str | None,
        event_type: str,
        repo_key: str | None = None,
    ) -> Reply:
        """Answer a verified delivery with ``reply`` (400 or 503), recorded in the
        deliveries and the audit with its code, never with its body; the answer does
        not depend on the record (the database may be what failed)."""
        code = str(reply.body.get("error", "refused"))
        try:
            await self._store.write(
                lambda c: deliveries.record_refused(
                    c,
                    delivery_id=_printable(delivery_id or "(none)", 120),
                    event_type=_printable(event_type or "unknown", 64),
                    payload_hash=sha256_ref(body),
                    retention=self._retention,
                    code=code,
                    response_code=reply.status_code,
                    repo_key=repo_key,
                )
            )
        except Exception:
            log.exception("webhook.refusal_not_recorded", code=code)
        return reply

    def _answer(self, r: DeliveryRecord) -> Reply:
        if r.duplicate:
            body: dict[str, Any] = {
                "deliveryId": r.delivery_id,
                "status": "duplicate",
                "taskId": r.task_id,
                "state": r.task_state,
            }
            if r.status != "duplicate":
                body["originalStatus"] = r.status
            if r.reason:
                body["reason"] = r.reason
            return Reply(200, body, "duplicate")
        if r.status == "accepted" and (r.reason or "").startswith("command_"):
            return Reply(
                200,
                {
                    "deliveryId": r.delivery_id,
                    "status": "accepted",
                    "reason": r.reason,
                    "taskId": r.task_id,
                    "state": r.task_state,
                },
                "command",
            )
        if r.status == "accepted":
            return Reply(
                202,
                {"deliveryId": r.delivery_id, "taskId": r.task_id, "state": r.task_state},
                "accepted",
            )
        if r.status == "rejected" and r.response_code == 409:
            return Reply(
                409,
                {
                    "error": "repository_disabled",
                    "deliveryId": r.delivery_id,
                    "message": "the repository is disabled by an administrator",
                },
                "rejected",
            )
        body = {"deliveryId": r.delivery_id, "status": r.status, "reason": r.reason}
        if r.task_id:
            body.update(taskId=r.task_id, state=r.task_state)
        return Reply(200, body, r.status)

    async def _security_alert(self, headers: Mapping[str, str], source: str) -> None:
        """A delivery with a wrong signature: audited, one row per source and interval
        with a count (:mod:`forgeflow.rejections`; never raises)."""
        delivery_id = cut(webhook.delivery_id_of(headers))
        log.warning("webhook.invalid_signature", delivery_id=delivery_id, source=source)
        await self._rejections.record(
            Rejection("webhook.reject", "invalid_signature", source, delivery_id=delivery_id)
        )
