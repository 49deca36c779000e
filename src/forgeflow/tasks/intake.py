"""Webhook intake: verify the signature, drop duplicates, normalise, enqueue; the
answer is an outcome (domain/intake.py), which ``api/webhook.py`` turns into HTTP.

It answers from what the store says and never waits on clone, agent or comment work:
Gitea gives up on a delivery after a few seconds, and a delivery it gave up on is sent
again. A comment that mentions the bot becomes a task (or a command) in one transaction
with its delivery's record, so a redelivery finds it and creates nothing twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from functools import partial

import structlog

from forgeflow.config import Settings
from forgeflow.domain.events import DomainEvent
from forgeflow.domain.ids import delivery_key, sha256_ref
from forgeflow.domain.intake import (
    BadSignature,
    DeliveryRecord,
    NoSecret,
    Outcome,
    Recorded,
    Refused,
)
from forgeflow.domain.json import JsonObject
from forgeflow.domain.markers import parse_marker
from forgeflow.domain.mentions import REVIEW_WORD, Mention, find_mention
from forgeflow.domain.permissions import Permission
from forgeflow.gitea import events as gitea_events
from forgeflow.gitea import webhook
from forgeflow.gitea.client import GiteaError, PermissionCache
from forgeflow.rejections import Rejection, RejectionLog, cut
from forgeflow.store import Store, deliveries
from forgeflow.store import events as store_events
from forgeflow.tasks.admission import Admission
from forgeflow.tasks.commenters import Unknown
from forgeflow.tasks.threads import ReviewThreads

log = structlog.get_logger("forgeflow.tasks.intake")
# How many mentioning line comments one review delivery makes tasks of at most.
MAX_ASKS_PER_DELIVERY = 20


def _printable(value: str, limit: int) -> str:
    """A header's value as a column holds it: printable (no NUL) and bounded."""
    return "".join(c if c.isprintable() else "?" for c in value[:limit])


def _mention(event: webhook.CommentEvent, bot: str) -> Mention:
    found = find_mention(event.comment_body, bot)
    assert found is not None  # the comments were chosen for their mention
    return found


def _invalid(message: str, body: bytes, delivery_id: str | None, event_type: str) -> Refused:
    return Refused("invalid", "invalid_payload", message, delivery_id, event_type, sha256_ref(body))


class WebhookIngress:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        permissions: PermissionCache | None,
        rejections: RejectionLog,
        on_accept: Callable[[], None] | None = None,
        threads: ReviewThreads | None = None,
    ) -> None:
        """``threads``: reads a submitted review's line comments, so a mention in a new
        line comment (``pull_request_review_comment``) becomes a task."""
        self._threads = threads
        self._rejections = rejections
        self._settings = settings
        self._store = store
        self._admission = Admission(settings, store, permissions, on_accept)
        self._retention = timedelta(days=settings.delivery_retention_days)
        self._bot = settings.bot_login

    async def handle(self, headers: Mapping[str, str], body: bytes, source: str = "-") -> Outcome:
        """``source``: the client address, for the audit of a refusal. A :class:`Refused`
        is recorded by :meth:`record_refusal` once its answer is known."""
        secret = self._settings.webhook_secret
        if secret is None:
            return NoSecret()
        if not webhook.verify_signature(secret.get_secret_value(), body, headers):
            await self._security_alert(headers, source)
            return BadSignature()
        try:
            payload = webhook.parse_json(body)
        except webhook.InvalidPayload as exc:
            header_id = webhook.delivery_id_of(headers)
            return _invalid(str(exc), body, header_id, webhook.event_type_of(headers))
        event_type = webhook.event_type_of(headers, payload)
        delivery_id = webhook.delivery_id_of(headers) or webhook.payload_delivery_fallback(
            event_type, payload
        )
        if delivery_id is None:
            why = "no X-Gitea-Delivery header and no comment id in the payload"
            return _invalid(why, body, None, event_type)
        return await self._route(delivery_key(delivery_id), delivery_id, event_type, payload, body)

    async def _route(
        self, key: str, delivery_id: str, event_type: str, payload: JsonObject, body: bytes
    ) -> Outcome:
        """A verified delivery, by its event: a review request, a review's line comment,
        a comment, or anything else (recorded, with its domain events)."""
        if event_type == webhook.REVIEW_REQUEST:
            try:
                request = webhook.review_request(delivery_id, payload, self._bot)
            except webhook.InvalidPayload as exc:
                return _invalid(str(exc), body, delivery_id, event_type)
            if request is not None:
                found = gitea_events.domain_events(
                    event_type, payload, delivery_id=delivery_id, body=body, bot_login=self._bot
                )
                return await self._review_request(key, request, body, found)
        if event_type in webhook.REVIEW_EVENTS and self._threads is not None:
            try:
                reviewed = webhook.reviewed(delivery_id, payload, event_type)
            except webhook.InvalidPayload as exc:
                return _invalid(str(exc), body, delivery_id, event_type)
            if reviewed is not None:
                found = gitea_events.domain_events(
                    event_type, payload, delivery_id=delivery_id, body=body, bot_login=self._bot
                )
                return await self._line_comment(key, reviewed, body, found)
        if event_type in webhook.COMMENT_EVENTS:
            try:
                event = webhook.normalise_comment(delivery_id, event_type, payload)
            except webhook.InvalidPayload as exc:
                return _invalid(str(exc), body, delivery_id, event_type)
            return await self._comment(key, event, body)
        seen = await self._store.read(lambda c: deliveries.get(c, key))
        if seen is not None:
            return Recorded(seen)
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

    async def _comment(self, key: str, event: webhook.CommentEvent, body: bytes) -> Outcome:
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
        return await self._admission.admit(key, event, body, mention, "webhook.delivery")

    async def _line_comment(
        self,
        key: str,
        event: webhook.CommentEvent,
        body: bytes,
        found: Sequence[DomainEvent],
    ) -> Outcome:
        """A submitted review: a summary that mentions the bot is a mention of the pull
        request, and each of its line comments that does is a mention in a review thread
        (docs/reviews.md "Review threads"). The payload has no line comments, so the
        reviewer's newest reviews are read from Gitea (after a redelivery and the bot's
        own reviews are told apart without asking)."""
        seen = await self._store.read(lambda c: deliveries.get(c, key))
        if seen is not None:
            return Recorded(seen)
        ignore = partial(
            self._ignore,
            key,
            event.delivery_id,
            event.event_type,
            body,
            normalized=True,
            repo_key=event.repo.key,
            found=found,
        )
        if event.actor_login.lower() == self._bot.lower():
            return await ignore("bot_comment")
        refused = await self._not_permitted(key, event, body, found)
        if refused is not None:
            return refused
        assert self._threads is not None
        try:
            asked = await self._threads.asking(event.repo, event.resource.number, event.actor_login)
        except GiteaError as exc:
            log.warning("webhook.review_comments_unavailable", error=str(exc), code=exc.code)
            why = "the review's line comments could not be read; redeliver later"
            return Refused(
                "unavailable",
                "gitea_unavailable",
                why,
                event.delivery_id,
                event.event_type,
                sha256_ref(body),
                event.repo.key,
            )
        events = [dataclasses.replace(event, comment_id=a.id, comment_body=a.body) for a in asked]
        if find_mention(event.comment_body, self._bot) is not None:
            events.insert(0, event)  # the review's summary asks too (its first text)
        reasons = [self._not_a_mention(e) for e in events]
        events = [e for e, why in zip(events, reasons, strict=True) if why is None]
        if not events:
            return await ignore(next((r for r in reasons if r), "no_mention"))
        return await self._admit_each(key, events, body, found)

    async def _not_permitted(
        self, key: str, event: webhook.CommentEvent, body: bytes, found: Sequence[DomainEvent]
    ) -> Outcome | None:
        """The answer to a review whose reviewer may not ask (or whose permission is not
        known yet), before any of their reviews is read from Gitea: anyone who may read a
        pull request may review it, any number of times, with any number of line
        comments. Their summary's mention is rejected as a mention is. None: they may."""
        permission = await self._admission.permission(key, event)
        if isinstance(permission, DeliveryRecord):
            return Recorded(permission)
        if isinstance(permission, Unknown):
            return self._admission.refused(event, body, permission)
        if self._admission.permits(permission):
            return None
        summary = find_mention(event.comment_body, self._bot)
        if summary is None or self._not_a_mention(event) is not None:
            return await self._ignore(
                key, event.delivery_id, event.event_type, body, "insufficient_permission",
                normalized=True, repo_key=event.repo.key, found=found,
            )  # fmt: skip
        return await self._admission.admit(
            key, event, body, summary, "webhook.review_comment", found, permission
        )

    async def _admit_each(
        self,
        key: str,
        events: list[webhook.CommentEvent],
        body: bytes,
        found: Sequence[DomainEvent],
    ) -> Outcome:
        """One task per mention: the review's summary (``comment_id`` 0, known again by
        its payload) and each mentioning line comment. The last that no delivery took
        yet is the delivery's own (its answer to Gitea); every other new one is admitted
        first, in order, under a delivery of its own (``<delivery id>/comment-<id>``), so a crash
        between them leaves the delivery unrecorded and its redelivery finds the rest."""
        repo_key = events[0].repo.key
        ids = [e.comment_id for e in events]
        taken = await self._store.read(lambda c: deliveries.taken_comments(c, repo_key, ids))
        fresh = [e for e in events if e.comment_id not in taken]
        if len(fresh) > MAX_ASKS_PER_DELIVERY:
            # Each is a turn: a review of hundreds of mentions is not answered at once.
            log.warning("webhook.review_asks_capped", asks=len(fresh), repo_key=repo_key)
            fresh = fresh[:MAX_ASKS_PER_DELIVERY]
        # The last is the delivery's own, so the tasks are queued in the comments' order.
        own, others = (fresh[-1], fresh[:-1]) if fresh else (events[-1], [])
        for other in others:
            sub_id = f"{other.delivery_id[:150]}/comment-{other.comment_id}"
            sub = dataclasses.replace(other, delivery_id=sub_id)
            mention = _mention(sub, self._bot)
            outcome = await self._admission.admit(
                delivery_key(sub_id), sub, body, mention, "webhook.review_comment", ()
            )
            if isinstance(outcome, Refused):
                return outcome  # Gitea redelivers; the comments taken stay taken
        return await self._admission.admit(
            key, own, body, _mention(own, self._bot), "webhook.review_comment", found
        )

    async def _review_request(
        self,
        key: str,
        event: webhook.CommentEvent,
        body: bytes,
        found: Sequence[DomainEvent],
    ) -> Outcome:
        """The bot asked for its review: a review task, with a mention's permission
        rule for the one who asked."""
        mention = Mention(REVIEW_WORD, review_focus="")
        return await self._admission.admit(
            key, event, body, mention, "webhook.review_request", found
        )

    async def ask_review(
        self, event: webhook.CommentEvent, focus: str, body: bytes, *, operator: bool
    ) -> Outcome:
        """A pipeline step's review of a pull request (tasks/review_asks.py): admitted as
        the review command is, ``event.actor_login`` checked like a commenter unless the
        run is the operator's. ``body``: the request as recorded (its hash)."""
        mention = Mention(f"{REVIEW_WORD} {focus}".strip(), review_focus=focus)
        key = delivery_key(event.delivery_id)
        granted = Permission.ADMIN if operator else None
        return await self._admission.admit(
            key, event, body, mention, "pipeline.review_request", (), granted
        )

    def _not_a_mention(self, event: webhook.CommentEvent) -> str | None:
        """Why a comment cannot start a task (an edit, the bot's own), else None."""
        if event.action != "created":
            return f"action_{event.action}"
        if event.actor_login.lower() == self._bot.lower() or parse_marker(event.comment_body):
            return "bot_comment"
        return None

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
    ) -> Recorded:
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
        return Recorded(record)

    async def record_refusal(self, refused: Refused, response_code: int) -> None:
        """Record a refused delivery with the answer it got (400 or 503) and its code,
        in the deliveries and the audit, never with its body. Never raises: the answer
        does not depend on the record (the database may be what failed)."""
        try:
            await self._store.write(
                lambda c: deliveries.record_refused(
                    c,
                    delivery_id=_printable(refused.delivery_id or "(none)", 120),
                    event_type=_printable(refused.event_type or "unknown", 64),
                    payload_hash=refused.payload_hash,
                    retention=self._retention,
                    code=refused.code,
                    response_code=response_code,
                    repo_key=refused.repo_key,
                )
            )
        except Exception:
            log.exception("webhook.refusal_not_recorded", code=refused.code)

    async def _security_alert(self, headers: Mapping[str, str], source: str) -> None:
        """A delivery with a wrong signature: audited, one row per source and interval
        with a count (:mod:`forgeflow.rejections`; never raises)."""
        delivery_id = cut(webhook.delivery_id_of(headers))
        log.warning("webhook.invalid_signature", delivery_id=delivery_id, source=source)
        await self._rejections.record(
            Rejection("webhook.reject", "invalid_signature", source, delivery_id=delivery_id)
        )
