"""Verify and normalise Gitea/Forgejo webhook deliveries.

Pure functions over headers and the raw body: the HTTP route calls them, the store
records the result. Header names follow Gitea services/webhook/deliver.go (Gitea sends
X-Gitea-*, X-Gogs-* and X-GitHub-* copies) and Forgejo's X-Forgejo-* equivalents.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from forgeflow.domain.ids import InvalidName, RepoRef, ResourceKind, ResourceRef

COMMENT_EVENTS = frozenset({"issue_comment", "pull_request_comment"})
# A review submitted as "Comment" (Gitea's own name for the hook event since 1.19.1).
REVIEW_COMMENT = "pull_request_review_comment"


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
        if not isinstance(payload.get("comment"), Mapping) and _is_review(payload):
            return REVIEW_COMMENT
        if event == "issue_comment" and on_pull_request(payload):
            return "pull_request_comment"
    return event


def on_pull_request(payload: Mapping[str, Any]) -> bool:
    """Whether a comment payload is about a pull request: ``is_pull`` (Gitea 1.10 and
    later) or, as every version sends it, an issue whose ``pull_request`` is not null."""
    issue = payload.get("issue")
    return payload.get("is_pull") is True or (
        isinstance(issue, Mapping) and issue.get("pull_request") is not None
    )


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
    actor_is_bot: bool
    refs: dict[str, Any] | None

    @property
    def repo(self) -> RepoRef:
        return self.resource.repo


def _is_review(payload: Mapping[str, Any]) -> bool:
    """A review sent under a comment event (Gitea 1.10 to 1.19.0): ``action`` reviewed
    and a ``review``; anything else without a comment is a comment payload that lacks
    it (stored under the event it came as, refused as invalid)."""
    return payload.get("action") == "reviewed" or isinstance(payload.get("review"), Mapping)


def parse_json(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidPayload(f"body is not JSON ({type(exc).__name__})") from None
    if not isinstance(payload, dict):
        raise InvalidPayload("body must be a JSON object")
    return payload


def _get(payload: Mapping[str, Any], path: str, kind: type | tuple[type, ...]) -> Any:
    node: Any = payload
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise InvalidPayload(f"missing field {path}")
        node = node[part]
    if not isinstance(node, kind) or (isinstance(node, bool) and kind is int):
        raise InvalidPayload(f"field {path} has the wrong type")
    if isinstance(node, str) and "\x00" in node:
        # No database keeps NUL in text; Gitea never sends one.
        raise InvalidPayload(f"field {path} contains a NUL character")
    return node


def _text(value: Any, path: str, default: str) -> str:
    text = str(value or default)
    if "\x00" in text:
        raise InvalidPayload(f"field {path} contains a NUL character")
    return text


def normalise_comment(
    delivery_id: str, event_type: str, payload: Mapping[str, Any]
) -> CommentEvent:
    """Turn an ``issue_comment`` payload into a :class:`CommentEvent` or raise."""

    action = _get(payload, "action", str)
    owner = _get(payload, "repository.owner.login", str)
    name = _get(payload, "repository.name", str)
    number = _get(payload, "issue.number", int)
    comment_id = _get(payload, "comment.id", int)
    body = _get(payload, "comment.body", str)
    login = _get(payload, "comment.user.login", str)
    if number <= 0 or comment_id <= 0:
        raise InvalidPayload("issue.number and comment.id must be positive")
    try:
        repo = RepoRef(owner, name)
    except InvalidName as exc:
        raise InvalidPayload(str(exc)) from None
    is_pull = event_type == "pull_request_comment" or on_pull_request(payload)
    kind = ResourceKind.PULL_REQUEST if is_pull else ResourceKind.ISSUE
    repository = payload["repository"]
    refs = None
    pull = payload.get("pull_request")
    if is_pull and isinstance(pull, Mapping):
        refs = {
            "base": _nested(pull, "base", "ref"),
            "head": _nested(pull, "head", "ref"),
            "headSha": _nested(pull, "head", "sha"),
            "headRepo": _nested(pull, "head", "repo", "full_name"),
        }
    user = payload["comment"]["user"]
    return CommentEvent(
        delivery_id=delivery_id,
        event_type="pull_request_comment" if is_pull else "issue_comment",
        action=action,
        resource=ResourceRef(repo, kind, number),
        clone_url=_text(repository.get("clone_url"), "repository.clone_url", ""),
        default_branch=_text(repository.get("default_branch"), "repository.default_branch", "main"),
        html_url=_text(payload["comment"].get("html_url"), "comment.html_url", ""),
        comment_id=comment_id,
        comment_body=body,
        comment_created_at=payload["comment"].get("created_at"),
        actor_login=login,
        actor_is_bot=user.get("type") == "Bot" if isinstance(user, Mapping) else False,
        refs=refs,
    )


def _nested(node: Any, *path: str) -> Any:
    for part in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def payload_delivery_fallback(event_type: str, payload: Mapping[str, Any]) -> str | None:
    """An id for deduplication when no delivery header came (every delivery must be
    recorded once): the comment id and the action."""
    try:
        comment_id = _get(payload, "comment.id", int)
        action = _get(payload, "action", str)
    except InvalidPayload:
        return None
    return f"payload:{event_type}:{comment_id}:{action}"
