"""Verify and normalise Gitea/Forgejo webhook deliveries.

Pure functions over headers and the raw body: the HTTP route calls them, the store
records the result; payloads are read as the models of gitea/payloads.py. Header names
follow Gitea services/webhook/deliver.go (Gitea sends X-Gitea-*, X-Gogs-* and
X-GitHub-* copies) and Forgejo's X-Forgejo-* equivalents.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from forgeflow.domain.ids import InvalidName, RepoRef, ResourceKind, ResourceRef
from forgeflow.domain.json import JsonObject
from forgeflow.domain.records import Refs
from forgeflow.gitea.payloads import (
    NUL_CHARACTER,
    CommentKey,
    CommentShape,
    HookPull,
    IssueCommentPayload,
    ReviewedPayload,
    ReviewRequestPayload,
)

COMMENT_EVENTS = frozenset({"issue_comment", "pull_request_comment"})
# The bot added as a pull request's reviewer (X-Gitea-Event-Type; X-Gitea-Event says
# pull_request): a review task, like ``@bot review`` (docs/reviews.md).
REVIEW_REQUEST = "pull_request_review_request"
# A review submitted as "Comment" (Gitea's own name for the hook event since 1.19.1).
REVIEW_COMMENT = "pull_request_review_comment"
# A submitted review of any verdict (modules/webhook/type.go): its line comments may
# mention the bot, each a conversation the bot answers in (docs/reviews.md).
REVIEW_EVENTS = frozenset(
    {REVIEW_COMMENT, "pull_request_review_approved", "pull_request_review_rejected"}
)
# The deliveries with no comment id that may start a task: known again by their payload
# (store/schema.py's index names the same event types).
BY_PAYLOAD = REVIEW_EVENTS | {REVIEW_REQUEST}


class InvalidPayload(ValueError):
    """A body that is not JSON or lacks a field the normalised event needs."""

    code = "invalid_payload"


def _first(headers: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = headers.get(name)
        if value:
            return value.strip()
    return None


def verify_signature(secret: str, body: bytes, headers: Mapping[str, str]) -> bool:
    """HMAC-SHA256 of the raw body, compared in constant time.

    Gitea and Forgejo send bare hex; GitHub-style ``X-Hub-Signature-256`` carries a
    ``sha256=`` prefix. Any one valid header is enough.
    """
    expected = hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
    candidates = [
        _first(headers, "x-gitea-signature"),
        _first(headers, "x-forgejo-signature"),
    ]
    hub = _first(headers, "x-hub-signature-256")
    if hub is not None:
        candidates.append(hub.removeprefix("sha256="))
    valid = False
    for candidate in candidates:
        # Compared as bytes: compare_digest raises on non-ASCII text (an outsider's 500).
        given = candidate.lower().encode("utf-8", "replace") if candidate is not None else None
        if given is not None and hmac.compare_digest(given, expected.encode("ascii")):
            valid = True
    return valid


def delivery_id_of(headers: Mapping[str, str]) -> str | None:
    return _first(
        headers, "x-gitea-delivery", "x-forgejo-delivery", "x-gogs-delivery", "x-github-delivery"
    )


def event_type_of(headers: Mapping[str, str], payload: Mapping[str, Any] | None = None) -> str:
    """The normalised event name.

    Gitea sends ``X-Gitea-Event: issue_comment`` for comments on both issues and pull
    requests and tells them apart in ``X-Gitea-Event-Type`` (``pull_request_comment``)
    and the payload's ``is_pull``. Two older shapes are read as well:

    - Gitea 1.9 and older had neither: a pull request's comment arrived as
      ``issue_comment``, and only its non-null ``issue.pull_request`` said so;
    - Gitea 1.10 to 1.19.0 sent a review submitted as "Comment" under the comment event
      types, with a pull-request payload (``action: "reviewed"``, a ``review``, no
      ``comment``). It is a review, not a comment: it gets the name later Gitea gives it,
      :data:`REVIEW_COMMENT`, an event forgeflow does not handle.
    """
    specific = _first(headers, "x-gitea-event-type", "x-forgejo-event-type", "x-gogs-event-type")
    generic = _first(headers, "x-gitea-event", "x-forgejo-event", "x-gogs-event", "x-github-event")
    event = specific or generic or ""
    if event in COMMENT_EVENTS and payload is not None:
        shape = CommentShape.model_validate(payload)
        if shape.is_review():
            return REVIEW_COMMENT
        if event == "issue_comment" and shape.on_pull_request():
            return "pull_request_comment"
    return event


@dataclass(frozen=True, slots=True)
class CommentEvent:
    """A comment delivery as forgeflow reads it, whichever Gitea or Forgejo version
    sent it: the issue or pull request, the comment and its author, and the pull
    request's refs when the payload names them."""

    delivery_id: str
    event_type: str
    action: str
    resource: ResourceRef
    clone_url: str
    default_branch: str
    html_url: str
    comment_id: int
    comment_body: str
    comment_created_at: str | None
    actor_login: str
    refs: Refs | None

    @property
    def repo(self) -> RepoRef:
        return self.resource.repo


def parse_json(body: bytes) -> JsonObject:
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidPayload(f"body is not JSON ({type(exc).__name__})") from None
    if not isinstance(payload, dict):
        raise InvalidPayload("body must be a JSON object")
    return payload


def normalise_comment(
    delivery_id: str, event_type: str, payload: Mapping[str, Any]
) -> CommentEvent:
    """Turn an ``issue_comment`` payload into a :class:`CommentEvent` or raise."""
    try:
        hook = IssueCommentPayload.model_validate(payload)
    except ValidationError as exc:
        raise _invalid(exc, IssueCommentPayload) from None
    return comment_event(delivery_id, event_type, hook)


def comment_event(delivery_id: str, event_type: str, hook: IssueCommentPayload) -> CommentEvent:
    """The :class:`CommentEvent` of a comment payload already read."""
    try:
        repo = RepoRef(hook.repository.owner.login, hook.repository.name)
    except InvalidName as exc:
        raise InvalidPayload(str(exc)) from None
    is_pull = event_type == "pull_request_comment" or hook.on_pull_request()
    kind = ResourceKind.PULL_REQUEST if is_pull else ResourceKind.ISSUE
    pull = hook.pull_request if is_pull else None
    comment = hook.comment
    return CommentEvent(
        delivery_id=delivery_id,
        event_type="pull_request_comment" if is_pull else "issue_comment",
        action=hook.action,
        resource=ResourceRef(repo, kind, hook.issue.number),
        clone_url=hook.repository.clone_url or "",
        default_branch=hook.repository.default_branch or "main",
        html_url=comment.html_url or "",
        comment_id=comment.id,
        comment_body=comment.body,
        comment_created_at=comment.created_at,
        actor_login=comment.user.login,
        refs=None if pull is None else _refs(pull),
    )


def review_request(
    delivery_id: str, payload: Mapping[str, Any], bot_login: str
) -> CommentEvent | None:
    """A request for the bot's review as the event a review task is accepted from
    (``comment_id`` 0: no comment started it; the sender is who asked), or None when
    the delivery asks someone else or removes a request. Raises on a payload without
    what the task needs."""
    try:
        hook = ReviewRequestPayload.model_validate(payload)
    except ValidationError as exc:
        raise _invalid(exc, ReviewRequestPayload) from None
    reviewer = hook.requested_reviewer
    if hook.action != "review_requested" or reviewer is None or hook.sender is None:
        return None
    if reviewer.login.lower() != bot_login.lower():
        return None
    return _pull_event(delivery_id, REVIEW_REQUEST, hook.action, hook, hook.sender.login)


def reviewed(
    delivery_id: str, payload: Mapping[str, Any], event_type: str = REVIEW_COMMENT
) -> CommentEvent | None:
    """A submitted review (one of :data:`REVIEW_EVENTS`) as the event of its summary:
    ``comment_id`` 0 (a review's body has no comment id in the payload) and the review's
    body as the comment's; its line comments are looked up in Gitea (the payload does not
    carry them). None when it has no sender. The action is ``created``."""
    try:
        hook = ReviewedPayload.model_validate(payload)
    except ValidationError as exc:
        raise _invalid(exc, ReviewedPayload) from None
    if hook.sender is None:
        return None
    action = "created" if hook.action == "reviewed" else hook.action
    event = _pull_event(delivery_id, event_type, action, hook, hook.sender.login)
    summary = (hook.review.content if hook.review is not None else None) or ""
    return dataclasses.replace(event, comment_body=summary)


def _pull_event(
    delivery_id: str,
    event_type: str,
    action: str,
    hook: ReviewRequestPayload | ReviewedPayload,
    actor: str,
) -> CommentEvent:
    """The event of a pull-request payload that no comment of its own started
    (``comment_id`` 0, no body)."""
    try:
        repo = RepoRef(hook.repository.owner.login, hook.repository.name)
    except InvalidName as exc:
        raise InvalidPayload(str(exc)) from None
    pull = hook.pull_request
    return CommentEvent(
        delivery_id=delivery_id,
        event_type=event_type,
        action=action,
        resource=ResourceRef(repo, ResourceKind.PULL_REQUEST, pull.number),
        clone_url=hook.repository.clone_url or "",
        default_branch=hook.repository.default_branch or "main",
        html_url=pull.html_url or "",
        comment_id=0,
        comment_body="",
        comment_created_at=None,
        actor_login=actor,
        refs=_refs(pull),
    )


def _refs(pull: HookPull) -> Refs:
    head, base = pull.head, pull.base
    return Refs(
        base=base.ref if base else None,
        head=head.ref if head else None,
        head_sha=head.sha if head else None,
        head_repo=head.repo.full_name if head and head.repo else None,
    )


def _invalid(exc: ValidationError, model: type[BaseModel]) -> InvalidPayload:
    """The refusal of a payload that lacks what forgeflow needs, naming the first such
    field in the payload's order: missing (or inside something that is not an object),
    of the wrong type, or holding a NUL. Non-positive ids are named last, as one."""
    wrong = [e for e in exc.errors() if e["type"] != "greater_than"]
    if not wrong:
        return InvalidPayload("issue.number and comment.id must be positive")
    error = wrong[0]
    loc = [str(part) for part in error["loc"]]
    path = ".".join(loc + _first_required(model, loc))
    if error["type"] == NUL_CHARACTER:
        return InvalidPayload(f"field {path} contains a NUL character")
    if error["type"] == "missing" or path != ".".join(loc):
        return InvalidPayload(f"missing field {path}")
    return InvalidPayload(f"field {path} has the wrong type")


def _first_required(model: type[BaseModel], loc: list[str]) -> list[str]:
    """Below ``loc``, when it names an object: the path to its first required leaf (the
    field a reader walking the payload would have missed first)."""
    node: Any = model
    for part in loc:
        node = node.model_fields[part].annotation
    below: list[str] = []
    while isinstance(node, type) and issubclass(node, BaseModel):
        name, field = next((n, f) for n, f in node.model_fields.items() if f.is_required())
        below.append(name)
        node = field.annotation
    return below


def payload_delivery_fallback(event_type: str, payload: Mapping[str, Any]) -> str | None:
    """An id for deduplication when no delivery header came (every delivery must be
    recorded once): the comment id and the action."""
    try:
        key = CommentKey.model_validate(payload)
    except ValidationError:
        return None
    return f"payload:{event_type}:{key.comment.id}:{key.action}"
